"""Inline elements put back into a translated sentence through the model's alignment (`format: html`).

`server/inline.py` takes a block's inline elements out of its sentences and records, per sentence, which part of it
each element covers (`Marked`). Here those parts are tied to the source tokens the model reads (`aligned`, at plan
time), and once the sentence is translated with `GenerationConfig.alignment`, each element goes around the densest
run of output words aligned with its own words, nested as in the source, with the punctuation it left outside kept
outside (`render`). An element whose words the model aligned with nothing goes where its place in the source falls
in the translation.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from model.tokenizer import Tokenizer, source_positions
from server.inline import Marked
from server.masks import Masked, unmask

_LEADING = "([{\"'\u00ab\u201c\u2018\u00bf\u00a1"  # punctuation kept outside an element that starts at a word
_TRAILING = ".,;:!?)]}\"'\u00bb\u201d\u2019\u2026"
_MARKER = 0xF0000  # private-use characters stand for tags inside a translation until it is escaped
# An element goes around the best run of aligned words that are at most this many words apart (bench/inline_markup.py:
# runs of adjacent words only kept the term inside fewer elements, the first to the last aligned word took in more)
GAP = 1


@dataclass
class Aligned:
    """A planned sentence's marks with the source tokens each covers: what `render` needs once it is translated."""

    marked: Marked
    cover: list[frozenset[int]] | None  # per mark, positions in the model's source; None: words did not match up
    standins: dict[str, str]


def _masked_offset(masked: Masked | None, x: int, end: bool) -> int:
    """A character offset of the sentence in its masked text (inside a mask: the mask's start, or its end)."""
    if masked is None:
        return x
    shift = 0
    for p, at, shown in zip(masked.placeholders, masked.offsets, masked.masks, strict=True):
        if x <= p.start:
            break
        if x < p.start + len(p.text):
            return at + (len(shown) if end else 0)
        shift = at + len(shown) - (p.start + len(p.text))
    return x + shift


def aligned(marked: Marked, masked: Masked | None, ids: list[int], tokenizer: Tokenizer,
            standins: dict[str, str]) -> Aligned:
    """The marks of a sentence tied to the source tokens the model reads (`ids`, from the masked text)."""
    text = masked.text if masked is not None else marked.text
    spans = [(_masked_offset(masked, m.start, False), _masked_offset(masked, m.end, True)) for m in marked.marks]
    where = source_positions(tokenizer, text, ids, spans)
    return Aligned(marked, [frozenset(w) for w in where] if where is not None else None, standins)


def _token_spans(tokens: list[int], tokenizer: Tokenizer) -> tuple[str, list[tuple[int, int]]]:
    """The translation's text and each token's characters in it (leading spaces left out)."""
    detok = tokenizer.detokenizer()
    spans, pieces, at = [], [], 0
    for token in tokens:
        piece = detok.push(token)
        lead = len(piece) - len(piece.lstrip())
        spans.append((at + lead, at + len(piece)))
        pieces.append(piece)
        at += len(piece)
    return "".join(pieces) + detok.flush(), spans


def _word_range(text: str, lo: int, hi: int, source: str) -> tuple[int, int]:
    """[lo, hi) widened to whole words, less the punctuation around them that the source element left outside
    itself (no more at each end than the source element has)."""
    while lo > 0 and not text[lo - 1].isspace():
        lo -= 1
    while hi < len(text) and not text[hi].isspace():
        hi += 1
    keep_end = len(source) - len(source.rstrip(_TRAILING))
    while hi > lo and text[hi - 1] in _TRAILING and hi - len(text[lo:hi].rstrip(_TRAILING)) - lo > keep_end:
        hi -= 1
    keep_start = len(source) - len(source.lstrip(_LEADING))
    while lo < hi and text[lo] in _LEADING and len(text[lo:hi]) - len(text[lo:hi].lstrip(_LEADING)) > keep_start:
        lo += 1
    return lo, hi


def _densest_run(hits: list[tuple[int, int]], starts: list[int]) -> list[tuple[int, int]]:
    """The hits in the run of words (GAP words apart at most) that holds the most of them: an element is one stretch
    of words, and a word aligned with it far from the others is the alignment's noise, not a reason to take in all
    between."""
    by_word: dict[int, list[tuple[int, int]]] = {}
    for h in hits:
        by_word.setdefault(bisect.bisect_right(starts, h[0]) - 1, []).append(h)
    best: list[tuple[int, int]] = []
    run: list[tuple[int, int]] = []
    last = -9
    for w in sorted(by_word):
        run = run + by_word[w] if w - last <= GAP + 1 and run else by_word[w]
        last = w
        if _weight(run) > _weight(best):
            best = run
    return best


def _weight(hits: list[tuple[int, int]]) -> tuple[int, int]:
    """Tokens, then characters: of two runs alike in tokens, the longer words (an article loses to its noun)."""
    return len(hits), sum(y - x for x, y in hits)


def _ranges(a: Aligned, text: str, spans: list[tuple[int, int]], alignment: Sequence[int] | None
            ) -> list[list[int]]:
    """Where each mark's element goes in the translation, [lo, hi), nested as the elements are in the source."""
    marks, length = a.marked.marks, max(len(a.marked.text), 1)
    usable = a.cover is not None and alignment is not None and len(alignment) == len(spans)
    starts = [m.start() for m in re.finditer(r"\S+", text)]
    ranges: list[list[int]] = []
    for n, m in enumerate(marks):
        hits = [spans[k] for k, s in enumerate(alignment or ()) if usable and a.cover is not None
                and s in a.cover[n] and spans[k][0] < spans[k][1]]
        hits = _densest_run(hits, starts)
        if hits:
            lo, hi = min(x for x, _ in hits), max(y for _, y in hits)
        else:  # nothing aligned with its words: where its middle falls, by relative position
            lo = hi = min(len(text), round(len(text) * (m.start + m.end) / 2 / length))
        lo, hi = _word_range(text, lo, hi, a.marked.text[m.start:m.end])
        ranges.append([0 if m.open is None else lo, len(text) if m.close is None else hi])
    order = sorted(range(len(marks)), key=lambda n: (marks[n].start, -marks[n].end, marks[n].depth))
    placed: list[int] = []
    for n in order:
        m, r = marks[n], ranges[n]
        parents = [p for p in placed if marks[p].start <= m.start and m.end <= marks[p].end
                   and marks[p].depth < m.depth]
        if parents:
            parent = ranges[max(parents, key=lambda p: marks[p].depth)]
            r[0] = min(max(r[0], parent[0]), parent[1])
            r[1] = max(min(r[1], parent[1]), r[0])
        for p in placed:
            if p in parents:
                continue
            other = ranges[p]
            if r[0] < other[1] and other[0] < r[1]:  # two elements on the same words: the later one moves off
                if other[0] <= r[0]:
                    r[0] = other[1]
                else:
                    r[1] = other[0]
        r[1] = max(r[0], r[1])
        placed.append(n)
    return ranges


def render(a: Aligned, masked: Masked | None, tokens: list[int], alignment: Sequence[int] | None,
           tokenizer: Tokenizer) -> str:
    """A translated sentence as HTML: its text escaped, its elements' tags and its placeholders' markup put back."""
    text, spans = _token_spans(tokens, tokenizer)
    marks = a.marked.marks
    ranges = _ranges(a, text, spans, alignment)
    shown = set(masked.masks) if masked is not None else set()
    for x, y in ((m.start(), m.end()) for mask in shown for m in re.finditer(re.escape(mask), text)):
        for r in ranges:  # a tag never goes inside a placeholder: out to its edge, around it
            r[0] = x if x < r[0] < y else r[0]
            r[1] = y if x < r[1] < y else r[1]
    inserts: list[tuple[int, int, float, str]] = []  # at one place: closes, inner first, then opens, outer first
    for m, (lo, hi) in zip(marks, ranges, strict=True):
        if m.open is not None and m.close is not None and lo == hi:  # empty: inside the elements closing there
            inserts.append((lo, 0, 0.5 - m.depth, m.open + m.close))
            continue
        if m.open is not None:
            inserts.append((lo, 1, m.depth, m.open))
        if m.close is not None:
            inserts.append((hi, 0, -m.depth, m.close))
    markup: list[str] = []
    out, at = [], 0
    for pos, _, _, tag in sorted(inserts):
        out.append(text[at:pos] + chr(_MARKER + len(markup)))
        markup.append(tag)
        at = pos
    text = "".join(out) + text[at:]
    if masked is not None and not masked.empty:
        text = unmask(masked, text)
    for token, tag in a.standins.items():
        if token in text:
            text = text.replace(token, chr(_MARKER + len(markup)), 1)
            markup.append(tag)
    text = escape(text, quote=False)
    for i, tag in enumerate(markup):
        text = text.replace(chr(_MARKER + i), tag)
    return text
