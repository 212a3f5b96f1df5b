"""Placeholders masked before translation and put back after, each exactly once, none invented.

The model sees the kinds it copies well as they are (it was trained on such strings), and a numbered mask (`{1}`,
`{2}`, ...) in place of the others (`copied`). After translation each placeholder is looked for as its own text or
its mask. One the model dropped goes where it wrote one of the same family that the source lacks (`{pasta}` for
`{folder}`), else over its damaged copy (`<x2/`), else at the output's place that corresponds to its place in the
source; one it repeated is kept once; any other it wrote is removed (`server/placeholders.py:clean`). Conversions
bound by order (`%s`, `{}`) and carried characters keep the source's order, and a character keeps the source's
spacing. `bench/placeholders.py` measures this against other ways (docs/localisation.md has the figures).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import regex as re

from server.placeholders import Placeholder, clean, find, invented


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
    return p.kind in ("printf", "python", "qt", "fluent", "shell", "tag", "entity", "symbol", "usage")


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
    return _restored(masked, _hug(masked, _reorder(masked, clean(out, originals=_texts(masked)))))


_FAMILY = {"fluent": "brace", "usage": "tag", "python": "printf", "qt": "printf"}


def _family(text: str) -> str:
    found = find(text)
    kind = found[0].kind if len(found) == 1 and found[0].text == text else "other"
    return _FAMILY.get(kind, kind)


def _swap(masked: Masked, i: int, out: str) -> str | None:
    """out with the placeholder the model wrote in place of placeholder i (of its family, not in the source,
    nearest its relative place) replaced by it: `{ $pasta }` for `{ $folder }`, `{7}` for the mask `{2}`."""
    family = _family(masked.masks[i])
    spots = [p for p in invented(out, _texts(masked)) if _family(p.text) == family]
    if not spots:
        return None
    texts = _texts(masked)

    def reading(at: int) -> int:  # where `at` of out falls once each mark reads as its placeholder
        return len(re.sub("\x00(\\d+)\x00", lambda m: texts[int(m.group(1))], out[:at]))

    goal, length = masked.placeholders[i].start / max(len(masked.source), 1), max(reading(len(out)), 1)
    p = min(spots, key=lambda p: abs(reading(p.start) / length - goal))
    return out[:p.start] + f"\x00{i}\x00" + out[p.start + len(p.text):]


def _texts(masked: Masked) -> list[str]:
    return [p.text for p in masked.placeholders]


def _restored(masked: Masked, out: str) -> str:
    """The marks replaced by their placeholders; those the model glued to a word or to each other so that they no
    longer read as themselves ("%shttps://..."), with a space between."""
    texts = _texts(masked)
    parts = re.split("\x00(\\d+)\x00", out)  # odd: a mark's number
    first = "".join(texts[int(part)] if k % 2 else part for k, part in enumerate(parts))
    expected = Counter(p.text for p in masked.placeholders if p.kind != "symbol")  # (a symbol needs `opaque`)
    if len(parts) == 1 or Counter(p.text for p in find(first)) == expected:
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


def _hug(masked: Masked, out: str) -> str:
    """A carried character with no space beside it in the source gets none there in the output (the model writes
    "60 {1} ." for "60{1}.", "a {1} b" for a ZWJ inside a word)."""
    src = masked.source
    for i, p in enumerate(masked.placeholders):
        end = p.start + len(p.text)
        if p.ordered == "reading":
            mark = f"\x00{i}\x00"
            if p.start > 0 and not src[p.start - 1].isspace():
                out = re.sub(" +" + re.escape(mark), mark, out)
            if end < len(src) and not src[end].isspace():
                out = re.sub(re.escape(mark) + " +", mark, out)
    return out


def _in_order(out: str, bound: list[int]) -> str:
    queue = iter(bound)

    def next_bound(m: re.Match[str]) -> str:
        return f"\x00{next(queue)}\x00" if int(m.group(1)) in bound else m.group()

    return re.sub("\x00(\\d+)\x00", next_bound, out)
