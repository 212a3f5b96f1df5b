"""Placeholders kept exactly: found in a sentence, masked before translation, put back after, none invented.

Software strings carry things a translation must not touch: printf conversions (`%s`, `%1$d`, `%%`), Python's
`%(name)s`, Qt's `%1`, `{0}` / `{name}` / `{}`, ICU and Fluent arguments (`{ $var }`, `{n, plural, ...}`), `$VAR`,
tags and entities in text that is not HTML, a command's usage tokens (`<nick>`), URLs, e-mail addresses, paths,
control and format characters (`\\x02`, ZWJ, bidi controls, LS/PS), emoji and symbols the model cannot write. The
model sees the kinds it copies well as they are, and a numbered mask (`{1}`, `{2}`, ...) in place of the others.
After translation each is looked for as its own text or its mask. One the model dropped goes where it wrote one of
the same family that the source lacks (`{pasta}` for `{folder}`), else over its damaged copy (`<x2/`), else at the
output's place that corresponds to its place in the source; one it repeated is kept once; any other it wrote is
removed (an entity becomes its character). Conversions bound by order (`%s`, `{}`) and carried characters keep the
source's order. The output's placeholders are thus exactly the source's, as a multiset.

`bench/placeholders.py` measures this against other ways (docs/localisation.md has the figures).
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import regex as re  # Unicode properties: emoji (Extended_Pictographic), format characters (Cf), symbols (S)

_TRAIL = ".,;:!?)]'\""  # punctuation that ends a sentence rather than a URL, address or path

# An emoji with its modifiers, variation selectors and ZWJ sequence, a flag, or a keycap: one placeholder.
_EMOJI = (r"\p{Regional_Indicator}{2}|[#*0-9]\uFE0F?\u20E3"
          r"|\p{Extended_Pictographic}[\p{Emoji_Modifier}\uFE0E\uFE0F]*"
          r"(?:\u200D\p{Extended_Pictographic}[\p{Emoji_Modifier}\uFE0E\uFE0F]*)*[\U000E0020-\U000E007F]*")
_KINDS = (
    ("control", r"[\x01-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"),
    ("emoji", _EMOJI),
    ("format", r"[\p{Cf}\u2028\u2029]"),  # ZWJ, WJ, ZWSP, BOM, bidi controls, soft hyphen; line/paragraph separators
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
    ("symbol", r"\p{S}"),  # kept only where the tokenizer cannot write it (`find`'s `opaque`)
)
_FIND = re.compile("|".join(f"(?P<{kind}>{pattern})" for kind, pattern in _KINDS))
# `<nick>` with no `</nick>` and a name no markup uses is a command's usage token, which the model would translate.
_USAGE = re.compile(r"<([A-Za-z][\w-]*)(?:\s+[\w-]+)*>")
_MARKUP_NAMES = frozenset(
    "a abbr b big blockquote body br center cite code dd del div dl dt em font g h1 h2 h3 h4 h5 h6 head hr html i img "
    "input ins it kbd li mrk nobr ol p ph pre q qt s small span strong sub sup table td th title tr tt u ul var wbr x "
    "bx ex".split())
_CHARACTERS = frozenset({"control", "emoji", "format", "symbol"})
_ORDERED = re.compile(r"%[-+#0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|ll|I64|I32|[hlLqjzZtI])?[diouxXeEfFgGaAcsSpn@]|\{\}")


@dataclass(frozen=True)
class Placeholder:
    text: str
    kind: str
    start: int  # where it is in the source

    @property
    def ordered(self) -> str | None:
        """What binds it to its place among others of the same order: "argument" for a conversion that is not
        positional (`%s`, `{}`), "reading" for a character carried through (emoji, controls, bidi marks), whose
        order is the text's; None for the others."""
        if _ORDERED.fullmatch(self.text) is not None:
            return "argument"
        return "reading" if self.kind in _CHARACTERS else None


def find(text: str, opaque: Callable[[str], bool] | None = None) -> list[Placeholder]:
    """The placeholders of a text, left to right, none overlapping.

    opaque: which symbols (`€`, `°`) the model cannot write (it spells them byte by byte, or not at all), to be
    carried as placeholders; without it no symbol is one.
    """
    found = []
    for m in _FIND.finditer(text):
        kind = m.lastgroup or "brace"
        value = m.group()
        if kind in ("url", "email", "path"):
            value = value.rstrip(_TRAIL)
            if not value or value in ("/", "~/"):
                continue
        elif kind == "symbol" and (opaque is None or not opaque(value)):
            continue
        elif kind == "tag" and _usage(value, text):
            kind = "usage"
        found.append(Placeholder(value, kind, m.start()))
    return found


def _usage(tag: str, text: str) -> bool:
    m = _USAGE.fullmatch(tag)
    return m is not None and m.group(1).lower() not in _MARKUP_NAMES and f"</{m.group(1)}>" not in text


@dataclass(frozen=True)
class MaskStyle:
    """How a placeholder is shown to the model: `form` with its number, found again by `pattern` (group 1). A
    verbatim style shows the placeholders the model copies well as they are (`copied`), and masks the others."""

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


def mask(source: str, style: MaskStyle = VERBATIM, opaque: Callable[[str], bool] | None = None) -> Masked:
    """The source with its placeholders masked; numbered masks are ones no other text of the source looks like.
    opaque: the symbols the model cannot write (`find`)."""
    placeholders = find(source, opaque)
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
    """The translation with each mask replaced by its placeholder, each exactly once, and no other placeholder.

    A placeholder is found as its numbered mask (spaces the model put inside it are forgiven) or as its own text.
    repair: "aligned" puts a dropped placeholder where the model wrote one of its family that the source lacks, else
    over its damaged copy, else where its source position falls in the output; "end" appends it there instead of its
    aligned place; "none" leaves it out and keeps what the model invented (measuring the model alone).
    """
    if masked.empty:
        return translation if repair == "none" else clean(translation, plain=True)
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
    if repair == "none":
        return _restored(masked, out)
    missing = [i for i in range(len(masked.placeholders)) if i not in used]
    for i in missing:
        swapped = _swap(masked, i, out)
        if swapped is not None:
            out = swapped
            used.add(i)
    out = clean(out, originals=_texts(masked))
    for i in missing:
        if i not in used:
            out = _mend(masked, i, out) or _insert(masked, i, out, at_end=repair == "end")
    return _restored(masked, _reorder(masked, clean(out, originals=_texts(masked))))


def clean(text: str, plain: bool = False, originals: Sequence[str] = ()) -> str:
    """The text without the placeholders in it (what a model invented), an entity written as its character; the
    `\\x00N\\x00` marks of the placeholders put back (whose texts are `originals`) are left alone, and what the
    model wrote around one so that they read as another (`{ %s }`) goes.

    plain: the text of a sentence without placeholders, which streams as it decodes: only the kinds that begin with
    a sign (`%`, `{`, `$`, `<`, `&`, a control, format or emoji character) are removed, and nothing before one and
    the spaces in front of it is touched, so that a stream held from there (`holds`) ends with this text.
    """
    while True:  # each pass shortens the text; a removal may join what is left into a new one ("%{x}s")
        spans, cuts = _scan(text, plain, originals)
        if not spans and not cuts:
            return text
        for a, b in reversed(cuts):
            text = text[:a] + text[b:]
        if cuts:
            continue
        for p in reversed(spans):
            start, end = p.start, p.start + len(p.text)
            character = html.unescape(p.text) if p.kind == "entity" else p.text
            if character != p.text:  # an entity it knows ("&amp;"); one it does not ("&xxe;") goes
                text = text[:start] + character + text[end:]
                continue
            if start == 0:
                end += text[end:end + 1] == " "
            elif text[start - 1] == " " and (end == len(text) or not text[end].isalnum()):
                start -= 1  # "de {folder} {pasta}?" -> "de {folder}?"
            text = text[:start] + text[end:]


def holds(text: str) -> bool:
    """Whether text has a sign that may begin a placeholder (`clean`'s plain kinds)."""
    return _SIGN.search(text) is not None


_LETTERED = frozenset({"url", "email", "path", "symbol"})  # kinds a plain sentence keeps: they begin with a letter
_SIGN = re.compile(r"[%{$<&\x01-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\p{Cf}\u2028\u2029\p{Extended_Pictographic}"
                   r"\p{Regional_Indicator}]")


def _invented(text: str, originals: Sequence[str]) -> list[Placeholder]:
    return _scan(text, False, originals)[0]


def _scan(text: str, plain: bool, originals: Sequence[str]) -> tuple[list[Placeholder], list[tuple[int, int]]]:
    """The placeholders wholly in the parts of text between the marks of those put back, and the parts (start, end)
    of text inside one that reaches over a mark; found in the text as it will read (each mark as its placeholder,
    `originals`), so that what surrounds them counts as it will."""
    reads: list[str] = []
    literal: list[tuple[int, int, int]] = []  # (start in the text as it reads, start in text, length)
    marks: list[tuple[int, int]] = []  # where each mark reads
    at = 0
    for k, piece in enumerate(re.split("(\x00\\d+\x00)", text)):  # odd k: a mark
        shown = originals[int(piece[1:-1])] if k % 2 and originals else piece
        here = sum(map(len, reads))
        if k % 2:
            marks.append((here, here + len(shown)))
        else:
            literal.append((here, at, len(piece)))
        reads.append(shown)
        at += len(piece)
    spans: list[Placeholder] = []
    cuts: list[tuple[int, int]] = []
    for p in find("".join(reads)):
        a, b = p.start, p.start + len(p.text)
        if plain and (p.kind in _LETTERED or not holds(p.text[0])) or (a, b) in marks:
            continue
        inside = [(r, t, n) for r, t, n in literal if r <= a and b <= r + n]
        if inside:
            r, t, _ = inside[0]
            spans.append(Placeholder(p.text, p.kind, t + a - r))
        else:
            cuts.extend((t + max(a, r) - r, t + min(b, r + n) - r) for r, t, n in literal if max(a, r) < min(b, r + n))
    return spans, cuts


_FAMILY = {"fluent": "brace", "usage": "tag", "python": "printf", "qt": "printf"}


def _family(text: str) -> str:
    found = find(text)
    kind = found[0].kind if len(found) == 1 and found[0].text == text else "other"
    return _FAMILY.get(kind, kind)


def _swap(masked: Masked, i: int, out: str) -> str | None:
    """out with the placeholder the model wrote in place of placeholder i (of its family, not in the source,
    nearest its relative place) replaced by it: `{ $pasta }` for `{ $folder }`, `{7}` for the mask `{2}`."""
    family = _family(masked.masks[i])
    spots = [p for p in _invented(out, _texts(masked)) if _family(p.text) == family]
    if not spots:
        return None
    goal = masked.offsets[i] / max(len(masked.text), 1)
    p = min(spots, key=lambda p: abs(p.start / max(len(out), 1) - goal))
    return out[:p.start] + f"\x00{i}\x00" + out[p.start + len(p.text):]


def _texts(masked: Masked) -> list[str]:
    return [p.text for p in masked.placeholders]


def _restored(masked: Masked, out: str) -> str:
    """The marks replaced by their placeholders; those the model glued to a word or to each other so that they no
    longer read as themselves ("%shttps://..."), with a space between."""
    texts = _texts(masked)
    parts = re.split("\x00(\\d+)\x00", out)  # odd: a mark's number
    first = "".join(texts[int(part)] if k % 2 else part for k, part in enumerate(parts))
    if len(parts) == 1 or Counter(p.text for p in find(first)) == Counter(texts):
        return first
    spaced = ""
    for k, part in enumerate(parts):
        if k % 2:
            glued = spaced and not spaced[-1].isspace()
            after = parts[k + 1] if k + 1 < len(parts) else ""
            spaced += (" " if glued else "") + texts[int(part)] + (" " if after and not after[0].isspace() else "")
        else:
            spaced += part
    return spaced


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
    """Order-bound placeholders (`%s`, `{}`; emoji and format characters) back in their source order, each order
    apart, wherever the model put them."""
    for order in ("argument", "reading"):
        bound = [i for i, p in enumerate(masked.placeholders) if p.ordered == order]
        if len(bound) > 1:
            out = _in_order(out, bound)
    return out


def _in_order(out: str, bound: list[int]) -> str:
    queue = iter(bound)

    def next_bound(m: re.Match[str]) -> str:
        return f"\x00{next(queue)}\x00" if int(m.group(1)) in bound else m.group()

    return re.sub("\x00(\\d+)\x00", next_bound, out)
