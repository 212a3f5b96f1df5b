"""Inline markup translated in context (`format: html`): blocks of running text, tags put back by alignment.

A block of HTML (the text of a paragraph, a list item, a cell) is translated as running text. Its inline elements
(`<b>`, `<a>`, `<span>`, ...) are taken out of the sentences the model sees, and each is put back around the words
of the translation that the model aligned with its own words: every output token's most attended source token
(`GenerationConfig.alignment`), as Firefox Translations projects tags through word alignment. So "Click <b>Retry</b>
to try again." is translated as one sentence and the bold goes to the translation of "Retry".

Elements whose content must not be translated (`<code>`, `<kbd>`, `<samp>`, `<var>`, `<svg>`, `<math>`, anything
with `translate="no"`) and inline markup without text (`<img>`, `<wbr>`, comments, empty elements) travel inside the
sentence as placeholders the model copies (`<xN/>`, kept exactly once by `server/placeholders.py`). Block elements,
`<br>` and tags not known to be inline end a block, as do `translate="no"` blocks, which are copied whole. Inside
`<pre>` and `<textarea>` line breaks matter: there each text node is translated alone, as are blocks whose
sentences are too long for the model. Line breaks inside a block's sentences reach the model as spaces. Putting the
elements back into the translation is `server/projection.py`'s.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from html import escape

from server.text import Part, Sentence

INLINE = frozenset("a abbr acronym b bdi bdo big cite data del dfn em font i ins label mark q s small span strike "
                   "strong sub sup time tt u".split())
OPAQUE = frozenset("code kbd samp var svg math".split())  # inline, content never translated
VOID = frozenset("img wbr input embed area br hr meta link source track col base param".split())
PRESERVE = frozenset(("pre", "textarea"))  # whitespace is content: text nodes alone, line breaks kept
_TAG = re.compile(r"<(/?)([A-Za-z][\w:.-]*)")
_NO = re.compile(r"""\stranslate\s*=\s*["']?no(?:["'\s/>])""", re.IGNORECASE)
_STANDIN = re.compile(r"<x\d+/>")


@dataclass
class Element:
    """A paired inline element of a block: its tags and the span of the block's text it covers."""

    open: str
    close: str  # "" when the block ended before its end tag (HTML closes it implicitly)
    start: int
    end: int
    depth: int  # elements of the block around it


@dataclass
class Block:
    """The text of a block (unescaped, standalone markup as placeholders) and its paired inline elements."""

    text: str
    elements: list[Element]
    standins: dict[str, str]  # placeholder -> the markup it stands for
    segments: list[tuple[bool, str]]  # the block as split_html gave it: the node-by-node fallback

    @property
    def marked(self) -> bool:
        return bool(self.elements or self.standins)


@dataclass
class Mark:
    """An element seen from one sentence: which of its tags fall inside, and the characters of the sentence it
    covers (the rest of it lies in other sentences or in the whitespace between them)."""

    element: int
    open: str | None
    close: str | None
    start: int
    end: int
    depth: int


@dataclass
class Marked:
    text: str  # the sentence the model translates
    marks: list[Mark]


def _tag(markup: str) -> tuple[str, str]:
    """(kind, lower-case name) of a markup segment; kind is open, close, void or other (comments, declarations)."""
    m = _TAG.match(markup)
    if m is None:
        return ("comment" if markup.startswith("<!--") else "other"), ""
    name = m.group(2).lower()
    if m.group(1):
        return "close", name
    return ("void" if markup.endswith("/>") or name in VOID else "open"), name


def _subtree_end(segments: list[tuple[bool, str]], i: int, name: str) -> int | None:
    """Index of the end tag that closes the element opened at segments[i], or None if it is never closed."""
    depth = 0
    for j in range(i, len(segments)):
        is_text, content = segments[j]
        if is_text:
            continue
        kind, n = _tag(content)
        if n == name and kind in ("open", "close"):
            depth += 1 if kind == "open" else -1
            if depth == 0:
                return j
    return None


def _raw(segments: list[tuple[bool, str]]) -> str:
    return "".join(escape(c, quote=False) if t else c for t, c in segments)


class _Builder:
    """One block as it is read: its text so far, its elements, the elements still open."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.size = 0
        self.elements: list[Element] = []
        self.open: list[int] = []  # indices into elements, outermost first
        self.standins: dict[str, str] = {}
        self.segments: list[tuple[bool, str]] = []

    def add_text(self, content: str) -> None:
        self.text.append(content)
        self.size += len(content)

    def alone(self, markup: str) -> None:
        token = f"<x{len(self.standins)}/>"
        self.standins[token] = markup
        self.add_text(token)

    def opened(self, markup: str) -> None:
        self.open.append(len(self.elements))
        self.elements.append(Element(markup, "", self.size, -1, len(self.open) - 1))

    def closed(self, markup: str, name: str) -> None:
        at = next((k for k in range(len(self.open) - 1, -1, -1)
                   if _tag(self.elements[self.open[k]].open)[1] == name), None)
        if at is None:  # an end tag without its start: kept where it is
            self.alone(markup)
            return
        self._end(self.open[at + 1:], "")  # elements left open inside it end where it ends
        self._end([self.open[at]], markup)
        del self.open[at:]

    def _end(self, indices: list[int], markup: str) -> None:
        for k in reversed(indices):
            e = self.elements[k]
            e.close, e.end = markup, self.size
            if e.start == e.end and k == len(self.elements) - 1:  # around nothing (an anchor): a placeholder
                self.elements.pop()
                self.alone(e.open + markup)

    def block(self) -> Block | None:
        self._end(self.open, "")
        text = "".join(self.text)
        if not text:
            return None
        own = [t for t in self.text if t not in self.standins and _STANDIN.search(t)]
        if own:  # the page itself writes "<x0/>": no placeholders of ours, each text node alone
            return Block(text, [], {}, self.segments)
        return Block(text, [e for e in self.elements if e.start < e.end], self.standins, self.segments)


def blocks(segments: list[tuple[bool, str]]) -> list[str | Block]:
    """HTML segments (split_html) as markup to copy and blocks of text to translate, in document order."""
    out: list[str | Block] = []
    current = _Builder()
    keep = 0  # depth inside PRESERVE elements

    def end_block() -> None:
        nonlocal current
        block = current.block()
        if block is not None:
            out.append(block)
        current = _Builder()

    i = 0
    while i < len(segments):
        is_text, content = segments[i]
        if is_text:
            if keep:
                out.append(Block(content, [], {}, [segments[i]]))
            else:
                current.add_text(content)
                current.segments.append(segments[i])
            i += 1
            continue
        kind, name = _tag(content)
        untranslated = kind == "open" and (name in OPAQUE or _NO.search(content) is not None)
        end = _subtree_end(segments, i, name) if untranslated else None
        inline = not keep and (name in INLINE or name in OPAQUE or kind == "comment" or (kind == "void" and name
                                                                                        not in ("br", "hr")))
        if untranslated and end is not None:
            subtree = segments[i:end + 1]
            if inline:
                current.alone(_raw(subtree))
                current.segments.extend(subtree)
            else:
                end_block()
                out.append(_raw(subtree))
            i = end + 1
            continue
        if inline and kind == "open":
            current.opened(content)
        elif inline and kind == "close":
            current.closed(content, name)
        elif inline:
            current.alone(content)
        else:
            end_block()
            out.append(content)
            keep += (kind == "open" and name in PRESERVE) - (kind == "close" and name in PRESERVE and keep > 0)
            i += 1
            continue
        current.segments.append(segments[i])
        i += 1
    end_block()
    return out


def layout(block: Block, split: Callable[[str], list[Part]]) -> list[str | Marked]:
    """The block as escaped literal HTML (whitespace between sentences, the tags that fall there) and sentences,
    each with the marks of the elements whose tags fall inside it. `split` cuts one line into sentences."""
    text = block.text
    core_start = len(text) - len(text.lstrip())
    core_end = len(text.rstrip())
    flat = re.sub(r"[\t\n\r\f\v]", " ", text[core_start:core_end])  # same length: offsets hold
    spans: list[tuple[int, int, bool]] = [(0, core_start, False)] if core_start else []
    at = core_start
    for part in split(flat):
        size = len(part.text) if isinstance(part, Sentence) else len(part)
        spans.append((at, at + size, isinstance(part, Sentence)))
        at += size
    if core_end < len(text):
        spans.append((core_end, len(text), False))
    sentences = [(a, b) for a, b, is_sentence in spans if is_sentence]
    marks: dict[int, list[Mark]] = {}
    tags: list[tuple[int, int, int, str]] = []  # literal tags: (position, order, tiebreak, markup)
    for n, e in enumerate(block.elements):
        inside = [(k, a, b) for k, (a, b) in enumerate(sentences) if a <= e.start < b or a < e.end <= b]
        opens_in = next((k for k, a, b in inside if a <= e.start < b and not (e.start == a and e.end >= b)), None)
        closes_in = next((k for k, a, b in inside if a < e.end <= b and not (e.end == b and e.start <= a)), None)
        if opens_in is None:
            tags.append((e.start, 1, n, e.open))
        if closes_in is None and e.close:
            tags.append((e.end, 0, -n, e.close))
        for k in sorted({x for x in (opens_in, closes_in) if x is not None}):
            a, b = sentences[k]
            marks.setdefault(k, []).append(Mark(n, e.open if k == opens_in else None,
                                                e.close or None if k == closes_in else None,
                                                max(e.start, a) - a, min(e.end, b) - a, e.depth))
    tags.sort()
    out: list[str | Marked] = []
    t = 0
    k = 0
    for a, b, is_sentence in spans:
        if is_sentence:
            while t < len(tags) and tags[t][0] <= a:
                out.append(tags[t][3])
                t += 1
            out.append(Marked(flat[a - core_start:b - core_start], marks.get(k, [])))
            k += 1
            continue
        for pos in range(a, b):
            while t < len(tags) and tags[t][0] <= pos:
                out.append(tags[t][3])
                t += 1
            out.append(escape(text[pos], quote=False))
    out.extend(tag for *_, tag in tags[t:])
    return out
