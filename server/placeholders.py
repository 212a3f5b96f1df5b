"""Placeholders kept exactly: found in a sentence, masked before translation, put back after.

Software strings carry things a translation must not touch: printf conversions (`%s`, `%1$d`, `%.2f`, `%%`),
Python's `%(name)s`, Qt's `%1`, `{0}` / `{name}` / `{}`, ICU and Fluent arguments (`{ $var }`, nested
`{count, plural, ...}`), `$VAR` / `${var}`, tags and entities in text that is not HTML, URLs, e-mail addresses,
file paths, and control characters (gettext's `\\x02`). The model sees the kinds it copies well as they are (it
was trained on such strings), and a numbered mask (`{1}`, `{2}`, ...) in place of the others: control characters,
which the tokenizer drops, and URLs, addresses, paths and ICU expressions, whose insides the model tends to
translate. After translation each placeholder is looked for as its own text or its mask. One the model dropped is
put back over its damaged copy if the output has one (its start, `<x2/` for `<x2/>`), else at the place of the
output that corresponds to its place in the source (by relative position, at a space); one it repeated is kept
once. Conversions whose order is their meaning (`%s`, `%d`, `{}`: not positional)
are written in the order of the source whatever order the model gave them, so a c-format or python-format string
stays valid. Every placeholder of the source is thus in the output exactly once, unchanged.

`bench/placeholders.py` compared this with masking every placeholder (as `{N}`, `%N$s` or `XN`) and with
translating the pieces between placeholders alone: on the shipped model's test split it keeps the most
placeholders before repair and loses no chrF (docs/localisation.md has the figures).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TRAIL = ".,;:!?)]'\""  # punctuation that ends a sentence rather than a URL, address or path

_KINDS = (
    ("control", r"[\x01-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"),
    ("url", r"\b(?:https?|ftp|file)://[^\s<>\"'{}]+|\bwww\.[\w-]+(?:\.[\w-]+)+[^\s<>\"'{}]*"),
    ("email", r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+"),
    ("python", r"%\([\w.-]+\)[-+#0 ]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa%]"),
    ("printf", r"%%|%(?:\d+\$)?[-+#0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?"
               r"(?:hh|ll|I64|I32|[hlLqjzZtI])?[diouxXeEfFgGaAcsSpn@]"),
    ("qt", r"%L?\d+(?![\d$])"),
    ("fluent", r"\{\s*\$[\w-]+(?:\.[\w-]+)?\s*\}"),
    ("brace", r"\{(?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*\}"),
    ("shell", r"\$\{[^{}\s]+\}|\$[A-Za-z_]\w*"),
    ("tag", r"<!--.*?-->|</?[A-Za-z][\w:.-]*(?:\s+[^<>]*?)?/?>"),
    ("entity", r"&(?:[A-Za-z][A-Za-z0-9]*|#\d+|#[xX][0-9A-Fa-f]+);"),
    ("path", r"(?<![\w/.~\\-])(?:~|\.\.?)?/[\w.@+-]+(?:/[\w.@+-]*)*|\b[A-Za-z]:\\[^\s<>\"']+"),
)
_FIND = re.compile("|".join(f"(?P<{kind}>{pattern})" for kind, pattern in _KINDS))
_ORDERED = re.compile(r"%[-+#0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|ll|I64|I32|[hlLqjzZtI])?[diouxXeEfFgGaAcsSpn@]|\{\}")


@dataclass(frozen=True)
class Placeholder:
    text: str
    kind: str
    start: int  # where it is in the source

    @property
    def ordered(self) -> bool:
        """Not positional: its place among the others of its string is what binds it to an argument."""
        return _ORDERED.fullmatch(self.text) is not None


def find(text: str) -> list[Placeholder]:
    """The placeholders of a text, left to right, none overlapping."""
    found = []
    for m in _FIND.finditer(text):
        kind = m.lastgroup or "brace"
        value = m.group()
        if kind in ("url", "email", "path"):
            value = value.rstrip(_TRAIL)
            if not value or value in ("/", "~/"):
                continue
        found.append(Placeholder(value, kind, m.start()))
    return found


@dataclass(frozen=True)
class MaskStyle:
    """How a placeholder is shown to the model: `form` with its number, found again by `pattern` (group 1).

    A verbatim style shows the model as they are the placeholders it copies well (`copied`), and gives numbered
    masks to the others: control characters (the tokenizer drops them) and those the model tends to alter inside
    (URLs, addresses, paths, ICU expressions with spaces or nesting).
    """

    name: str
    form: str
    pattern: re.Pattern[str]
    verbatim: bool = False

    def mask(self, number: int) -> str:
        return self.form.format(number)

    def masks(self, p: Placeholder) -> bool:
        return not self.verbatim or not copied(p)


def copied(p: Placeholder) -> bool:
    """Whether the shipped model copies this placeholder whole when it sees it (bench/placeholders.py)."""
    if p.kind == "brace":
        return _SIMPLE_BRACE.fullmatch(p.text) is not None
    return p.kind in ("printf", "python", "qt", "fluent", "shell", "tag", "entity")


_SIMPLE_BRACE = re.compile(r"\{[\w.:!-]*\}")
_BRACES = re.compile(r"\{\s*(\d+)\s*\}")
VERBATIM = MaskStyle("verbatim", "{{{}}}", _BRACES, verbatim=True)
BRACES = MaskStyle("braces {N}", "{{{}}}", _BRACES)
PRINTF = MaskStyle("printf %N$s", "%{}$s", re.compile(r"%\s?(\d+)\s?\$\s?s"))
LETTER = MaskStyle("letter XN", "X{}", re.compile(r"(?<![A-Za-z])X\s?(\d+)(?!\d)"))
STYLES = (VERBATIM, BRACES, PRINTF, LETTER)


@dataclass(frozen=True)
class Masked:
    """A sentence as the model sees it, and what to put back."""

    source: str
    text: str  # the source with each placeholder replaced by its mask
    placeholders: tuple[Placeholder, ...]
    masks: tuple[str, ...]  # what stands for each placeholder in `text` (its own text in a verbatim style)
    numbers: tuple[int, ...]  # the mask number of each placeholder; 0 for one shown as it is
    offsets: tuple[int, ...]  # where each mask starts in `text`
    style: MaskStyle = VERBATIM

    @property
    def empty(self) -> bool:
        return not self.placeholders


def mask(source: str, style: MaskStyle = VERBATIM) -> Masked:
    """The source with its placeholders masked; numbered masks are ones no other text of the source looks like."""
    placeholders = find(source)
    if not placeholders:
        return Masked(source, source, (), (), (), ())
    literal = []
    at = 0
    for p in placeholders:
        literal.append(source[at:p.start])
        at = p.start + len(p.text)
    literal.append(source[at:])
    seen = "\n".join(literal + [p.text for p in placeholders if not style.masks(p)])
    taken = {int(m.group(1)) for m in style.pattern.finditer(seen)}
    free = (n for n in range(1, len(placeholders) + len(taken) + 1) if n not in taken)
    numbers = [next(free) if style.masks(p) else 0 for p in placeholders]
    masks = [style.mask(n) if n else p.text for n, p in zip(numbers, placeholders, strict=True)]
    out, offsets = [literal[0]], []
    for shown, rest in zip(masks, literal[1:], strict=True):
        offsets.append(sum(map(len, out)))
        out.extend([shown, rest])
    return Masked(source, "".join(out), tuple(placeholders), tuple(masks), tuple(numbers), tuple(offsets), style)


def unmask(masked: Masked, translation: str, repair: str = "aligned") -> str:
    """The translation with each mask replaced by its placeholder, each exactly once.

    A placeholder is found as its numbered mask (spaces the model put inside it are forgiven) or as its own text.
    repair: "aligned" puts a dropped placeholder over its damaged copy, else where its source position falls in the
    output; "end" appends it there instead of its aligned place; "none" leaves it out (measuring the model alone).
    """
    if masked.empty:
        return translation
    by_number = {n: i for i, n in enumerate(masked.numbers) if n}
    by_text: dict[str, list[int]] = {}
    for i, p in enumerate(masked.placeholders):  # a text that looks like a mask is found only as the mask it got
        if not masked.numbers[i] or not masked.style.pattern.fullmatch(p.text):
            by_text.setdefault(p.text, []).append(i)
    texts = sorted(by_text, key=len, reverse=True)
    number = masked.style.pattern.pattern.replace("(\\d+)", "(?P<n>\\d+)", 1)
    found = re.compile(number + "|(?P<text>" + "|".join(map(re.escape, texts)) + ")" if texts else number)
    used: set[int] = set()

    def canonical(m: re.Match[str]) -> str:
        n = m.group("n")
        if n is not None and int(n) in by_number:
            i = by_number[int(n)]
        elif m.group() in by_text:  # a mask this sentence did not give out: "{1}" shown as it is
            i = next((i for i in by_text[m.group()] if i not in used), -1)
        else:
            return m.group()
        if i < 0 or i in used:  # one more time than in the source
            return ""
        used.add(i)
        return f"\x00{i}\x00"  # NUL never reaches the model: the text checks refuse it

    out = found.sub(canonical, translation)
    out = re.sub(r" {2,}", " ", out) if len(out) < len(translation) else out
    if repair != "none":
        for i in range(len(masked.placeholders)):
            if i not in used:
                out = _mend(masked, i, out) or _insert(masked, i, out, at_end=repair == "end")
    out = _reorder(masked, out)
    return re.sub("\x00(\\d+)\x00", lambda m: masked.placeholders[int(m.group(1))].text, out)


def _mend(masked: Masked, i: int, out: str) -> str | None:
    """out with a damaged copy of placeholder i (its first 60% or more, "<x2/" for "<x2/>") replaced by it."""
    text = masked.placeholders[i].text
    if masked.numbers[i] or len(text) < 5:  # a mask the model never saw whole; too short to tell damage
        return None
    for k in range(len(text) - 1, max(4, -(-3 * len(text) // 5)) - 1, -1):
        at = out.find(text[:k])
        if at >= 0:
            return out[:at] + f"\x00{i}\x00" + out[at + k:]
    return None


def _insert(masked: Masked, i: int, out: str, at_end: bool) -> str:
    """Mask i put into out at the word boundary nearest its relative place in the source."""
    token = f"\x00{i}\x00"
    start = masked.offsets[i]
    end = start + len(masked.masks[i])
    src = masked.text
    space_before = start > 0 and src[start - 1].isspace()
    space_after = end < len(src) and src[end].isspace()
    if at_end or end >= len(src.rstrip()):
        stripped = out.rstrip()
        return stripped + (" " if space_before and stripped else "") + token + out[len(stripped):]
    if start == 0:
        return token + (" " if space_after else "") + out
    goal = len(out) * start / max(len(src), 1)
    gaps = [m.start() for m in re.finditer(r" ", out)]
    if not gaps:
        return out + (" " if space_before and out.strip() else "") + token
    gap = min(gaps, key=lambda g: abs(g - goal))
    return out[:gap] + " " + token + out[gap:]


def _reorder(masked: Masked, out: str) -> str:
    """Order-bound placeholders (`%s`, `{}`) back in their source order, wherever the model put them."""
    ordered = [i for i, p in enumerate(masked.placeholders) if p.ordered]
    if len(ordered) < 2:
        return out
    queue = iter(ordered)

    def next_ordered(m: re.Match[str]) -> str:
        return f"\x00{next(queue)}\x00" if int(m.group(1)) in ordered else m.group()

    return re.sub("\x00(\\d+)\x00", next_ordered, out)
