"""A paragraph's spans as one text for the server's HTML path, and the spans' translations read back.

A span is a stretch of a paragraph with one formatting (a docx run, an ODF `text:span`, the text between two tags of
a subtitle cue). The spans of a paragraph travel as one text, each inside a tag of its own (`<s0>...</s0><s1>...`),
so the paragraph is one unit of the request; the HTML path copies the tags and translates the text between them
(`server/text.py:split_html`), and the translated text inside tag N goes back into span N.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Sequence
from html import escape

from server.errors import InvalidDocument, InvalidEncoding
from server.text import split_html

_OPEN = re.compile(r"<s(\d+)>")
# C0 controls other than tab, newline, form feed and carriage return: a file that has them is not text.
_BINARY = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")


def to_markup(spans: Sequence[str]) -> str:
    """Spans as one text for the HTML path; a lone span needs no tag."""
    if len(spans) == 1:
        return escape(spans[0], quote=False)
    return "".join(f"<s{i}>{escape(span, quote=False)}</s{i}>" for i, span in enumerate(spans))


def from_markup(markup: str, count: int) -> list[str]:
    """The translated text of each of `count` spans, from the HTML path's answer to `to_markup`."""
    out = [""] * count
    current: int | None = 0 if count == 1 else None
    for is_text, content in split_html(markup):
        if is_text:
            if current is not None:
                out[current] += content
            continue
        opened = _OPEN.fullmatch(content)
        if opened and int(opened.group(1)) < count:
            current = int(opened.group(1))
        elif content.startswith("</s"):
            current = None
    return out


BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def decode_text(data: bytes, name: str) -> tuple[str, str]:
    """A text file's characters and its encoding: UTF-8, or UTF-8 / UTF-16 with a byte order mark.

    Refuses what is not text: bytes that are not valid in the encoding, or control characters (a binary file).
    """
    encoding = next((enc for bom, enc in BOMS if data.startswith(bom)), "utf-8")
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise InvalidEncoding(f"{name} is not {encoding.removesuffix('-sig').upper()} text (byte {exc.start}); "
                              "save it as UTF-8") from exc
    bad = _BINARY.search(text)
    if bad:
        raise InvalidDocument(f"{name} is not a text file: it holds the control character U+{ord(bad.group()):04X}")
    return text, encoding


def encode_text(text: str, encoding: str) -> bytes:
    """The translated text in the file's own encoding (with its byte order mark, if it had one)."""
    return text.encode(encoding)
