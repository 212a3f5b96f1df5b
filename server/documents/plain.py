"""Plain text (.txt) and HTML (.html, .htm): one text each, as /translate takes them."""

from __future__ import annotations

from server.documents.archive import Limits
from server.documents.document import Document
from server.documents.markup import decode_text, encode_text, from_markup, to_markup
from server.documents.xmltext import Budget, check_html


def read_txt(data: bytes, name: str, limits: Limits, target: str | None = None) -> Document:
    """The whole file is one text: every line break, blank line and indentation is kept (`server/text.py`)."""
    text, encoding = decode_text(data, name)
    return Document([to_markup([text])], lambda out: encode_text(from_markup(out[0], 1)[0], encoding))


def read_html(data: bytes, name: str, limits: Limits, target: str | None = None) -> Document:
    """The page is one text in /translate's `format: html`: markup, scripts and styles are copied as they are."""
    text, encoding = decode_text(data, name)
    check_html(text, name, Budget(limits.nodes, name))
    return Document([text], lambda out: encode_text(out[0], encoding))
