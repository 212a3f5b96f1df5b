"""Placeholders: what a translation must carry exactly, found in a text, and those a model invented removed.

Software strings carry things a translation must not touch: printf conversions (`%s`, `%1$d`, `%%`), Python's
`%(name)s`, Qt's `%1`, `{0}` / `{name}` / `{}`, ICU and Fluent arguments (`{ $var }`, `{n, plural, ...}`), `$VAR`,
tags and entities in text that is not HTML, a command's usage tokens (`<nick>`), URLs, e-mail addresses, paths,
control and format characters (`\\x02`, ZWJ, bidi controls, LS/PS), emoji and symbols the model cannot write.
`server/masks.py` masks them before translation and puts them back after; `clean` takes out of a translation any
placeholder its source lacks (an entity becomes its character), so that the output's placeholders are exactly the
source's, as a multiset.
"""

from __future__ import annotations

import html
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
    # an empty element (`<b0></b0>`, as Immersive Translate marks markup) is one placeholder: its halves stay together
    ("tag", r"<!--.*?-->|<(?P<element>[A-Za-z][\w:.-]*)(?:\s[^<>]*)?></(?P=element)>"
            r"|</?[A-Za-z][\w:.-]*(?:\s+[^<>]*?)?/?>"),
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


def invented(text: str, originals: Sequence[str]) -> list[Placeholder]:
    """The placeholders wholly between the marks of those put back (`_scan`)."""
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
