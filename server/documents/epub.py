"""EPUB (.epub): every (X)HTML content document is one text in /translate's `format: html`, and the book's title,
description and table of contents (the package document's `dc:title` / `dc:description`, the NCX's labels) are
translated as paragraphs. Images, styles, fonts and the rest are copied unchanged.
"""

from __future__ import annotations

import re

from server.documents.archive import Limits, entry_map, read_zip, write_zip
from server.documents.document import Document
from server.documents.markup import decode_text, encode_text, to_markup
from server.documents.office import apply, translatable_parts
from server.documents.xmltext import Budget, Dialect, check_html, qualify, serialize_xml, xml_safe
from server.errors import InvalidDocument

MIMETYPE = b"application/epub+zip"
CONTAINER = "META-INF/container.xml"
PAGES = re.compile(r".*\.(xhtml|html|htm)", re.IGNORECASE)
METADATA = re.compile(r".*\.(opf|ncx)", re.IGNORECASE)
DC = "http://purl.org/dc/elements/1.1/"
NCX = "http://www.daisy.org/z3986/2005/ncx/"
LABELS = Dialect(paragraphs=qualify(DC, "title", "description") | qualify(NCX, "text"))


def read_epub(data: bytes, name: str, limits: Limits, target: str | None = None) -> Document:
    entries = read_zip(data, name, limits)
    by_name = entry_map(entries)
    mimetype = by_name.get("mimetype")
    if CONTAINER not in by_name or (mimetype is not None and mimetype.data.strip() != MIMETYPE):
        raise InvalidDocument(f"{name} is not an EPUB book (no {CONTAINER}, or another mimetype)")
    budget = Budget(limits.nodes, name)
    pages = [(entry, *decode_text(entry.data, entry.info.filename)) for entry in entries
             if PAGES.fullmatch(entry.info.filename)]
    for entry, text, _ in pages:
        check_html(text, entry.info.filename, budget)
    parts, units = translatable_parts(entries, METADATA, LABELS, budget)

    def rebuild(translated: list[str]) -> bytes:
        for (entry, _, encoding), text in zip(pages, translated, strict=False):
            entry.data = encode_text(xml_safe(text), encoding)
        apply(units, translated[len(pages):], LABELS)
        for entry, tree in parts:
            entry.data = serialize_xml(tree, entry.data)
        return write_zip(entries)

    texts = [text for _, text, _ in pages] + [to_markup([span.text for span in unit]) for unit in units]
    return Document(texts, rebuild)
