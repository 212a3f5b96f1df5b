"""Subtitles (.srt, .vtt): only the text of each cue is translated; numbers, timings, settings, notes and styles are
copied byte for byte.

A cue is a block of lines (blocks are separated by blank lines) with a timing line (`-->`); the lines after the
timing line are its text. A cue whose lines continue one another is translated as one line (a sentence is not cut
where the subtitle wrapped it) and wrapped again into as many lines, at the spaces nearest the same proportions; a
cue of dialogue (lines that start with a dash) keeps its lines. Tags (`<i>`, `<v Bob>`, `<00:01.000>`, and SRT's
`{\\an8}`) are copied as they are, and only the text between them is translated.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

from server.documents.archive import Limits
from server.documents.document import Document
from server.documents.markup import decode_text, encode_text, from_markup, to_markup
from server.errors import InvalidDocument

_TAG = re.compile(r"<[^<>\r\n]*>|\{\\[^{}\r\n]*\}")


@dataclass
class Cue:
    lines: list[int]  # indices of its text lines in the file
    joined: bool  # its lines were translated as one
    spans: list[str]  # text between its tags
    tags: list[str]  # tags[i] comes before spans[i + 1]


def _split(text: str) -> tuple[list[str], list[str]]:
    spans, tags, start = [], [], 0
    for m in _TAG.finditer(text):
        spans.append(text[start:m.start()])
        tags.append(m.group())
        start = m.end()
    spans.append(text[start:])
    return spans, tags


def _wrap(text: str, count: int) -> list[str]:
    """text cut at up to count - 1 spaces (not inside tags), each cut nearest an equal share of the length."""
    tags = [m.span() for m in _TAG.finditer(text)]
    spaces = [i for i, c in enumerate(text) if c == " " and not any(a < i < b for a, b in tags)]
    cuts: list[int] = []
    for k in range(1, count):
        left = [s for s in spaces if not cuts or s > cuts[-1]]
        if not left:
            break
        goal = len(text) * k / count
        cuts.append(min(left, key=lambda s: abs(s - goal)))
    bounds = [-1, *cuts, len(text)]
    return [text[a + 1:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def _ending(line: str) -> str:
    return line[len(line.rstrip("\r\n")):]


_TIMING = re.compile(r"^\s*(?:\d+:)?\d+:\d+[,.]\d+\s*-->\s*(?:\d+:)?\d+:\d+[,.]\d+")
_VTT_BLOCKS = ("WEBVTT", "NOTE", "STYLE", "REGION")  # WebVTT blocks that are no cue


def _cues(lines: list[str], name: str, vtt: bool) -> list[list[int]]:
    """The text lines of each cue: the lines after a timing line, to the end of its block or the next cue's number
    and timing line (a blank line the file lacks). A block of text with no timing line is refused, naming its line:
    its text would otherwise stay untranslated, unseen."""
    cues: list[list[int]] = []
    timed = False
    for i, line in enumerate(lines):
        if not line.strip():
            timed = False
        elif _TIMING.match(line) or (not timed and "-->" in line):
            if timed and cues[-1] and cues[-1][-1] == i - 1 and lines[i - 1].strip().isdigit():
                cues[-1].pop()  # the next cue's number, before its timing line
            timed = True
            cues.append([])
        elif timed:
            cues[-1].append(i)
        elif (i == 0 or not lines[i - 1].strip()) and not _ignorable(lines, i, vtt):
            shown = " / ".join(line.strip()[:40] for line in lines[i:i + 2] if line.strip())
            raise InvalidDocument(f"{name}: the block at line {i + 1} has no timing line (start --> end), so its "
                                  f"text would not be translated: {shown!r}")
    return cues


def _ignorable(lines: list[str], i: int, vtt: bool) -> bool:
    """Whether the block that starts at line i holds no text to translate: a cue's number or identifier before its
    timing line, or WebVTT's header, notes, styles and regions."""
    block = []
    for line in lines[i:]:
        if not line.strip():
            break
        block.append(line.strip().lstrip("\ufeff"))
    if any("-->" in line for line in block[1:2]):
        return True  # a number or identifier, then the timing line
    return vtt and block[0].split(" ")[0].split("\t")[0] in _VTT_BLOCKS


def read_subtitles(data: bytes, name: str, vtt: bool) -> Document:
    text, encoding = decode_text(data, name)
    if vtt and not text.lstrip("\ufeff").startswith("WEBVTT"):
        raise InvalidDocument(f"{name} is not WebVTT: it does not start with WEBVTT")
    lines = text.splitlines(keepends=True)
    found = _cues(lines, name, vtt)
    if not found:
        raise InvalidDocument(f"{name} holds no subtitle cue (no timing line with -->)")
    cues: list[Cue] = []
    for indices in found:
        bodies = [lines[i].rstrip("\r\n") for i in indices]
        joined = len(bodies) > 1 and not any(b.lstrip().startswith(("-", "\u2013", "\u2014")) for b in bodies)
        spans, tags = _split(" ".join(b.strip() for b in bodies) if joined else "\n".join(bodies))
        if vtt:  # WebVTT escapes &, < and > as HTML does; the model reads the characters
            spans = [html.unescape(span) for span in spans]
        if any(span.strip() for span in spans):
            cues.append(Cue(indices, joined, spans, tags))

    def rebuild(translated: list[str]) -> bytes:
        out = list(lines)
        for cue, markup in zip(cues, translated, strict=True):
            spans = from_markup(markup, len(cue.spans))
            if vtt:
                spans = [html.escape(span, quote=False) for span in spans]
            whole = spans[0] + "".join(tag + span for tag, span in zip(cue.tags, spans[1:], strict=True))
            new = _wrap(whole, len(cue.lines)) if cue.joined else whole.split("\n")
            new = [line for line in new if line.strip()]
            if not new:  # an empty line would end the cue early: keep the original text
                continue
            first, last = cue.lines[0], cue.lines[-1]
            ending, final = _ending(lines[first]) or "\n", _ending(lines[last])
            for i in cue.lines:
                out[i] = ""
            out[first] = ending.join(new) + final
        return encode_text("".join(out), encoding)

    return Document([to_markup(cue.spans) for cue in cues], rebuild)


def read_srt(data: bytes, name: str, limits: Limits, target: str | None = None) -> Document:
    return read_subtitles(data, name, vtt=False)


def read_vtt(data: bytes, name: str, limits: Limits, target: str | None = None) -> Document:
    return read_subtitles(data, name, vtt=True)
