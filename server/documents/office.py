"""Office documents: Word (.docx) and PowerPoint (.pptx), OpenDocument text (.odt) and presentations (.odp).

Each is a zip of XML parts. The parts that hold the text are read paragraph by paragraph (`xmltext.py`): a
paragraph's runs of one formatting are its spans, and the paragraph is one text of the request. Every other part
(styles, images, relationships, the manifest) is copied unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from server.documents.archive import Entry, Limits, entry_map, read_zip, write_zip
from server.documents.document import Document
from server.documents.markup import from_markup, to_markup
from server.documents.xmltext import (
    Budget,
    Dialect,
    Span,
    paragraphs,
    parse_xml,
    qualify,
    serialize_xml,
    spans,
)
from server.errors import InvalidDocument

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
A = "http://schemas.openxmlformats.org/drawingml/2006/main"
TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
OFFICE = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"

WORD = Dialect(
    paragraphs=qualify(W, "p"), texts=qualify(W, "t"), runs=qualify(W, "r"), properties=qualify(W, "rPr", "pPr"),
    containers=qualify(W, "hyperlink", "smartTag", "ins", "moveTo", "sdt", "sdtContent", "customXml", "dir", "bdo"),
    markers=qualify(W, "bookmarkStart", "bookmarkEnd", "proofErr", "permStart", "permEnd", "commentRangeStart",
                    "commentRangeEnd", "lastRenderedPageBreak", "moveToRangeStart", "moveToRangeEnd",
                    "moveFromRangeStart", "moveFromRangeEnd"),
    skipped=qualify(W, "del", "moveFrom", "sdtPr", "sdtEndPr"), preserve_space=True,
)
DRAWING = Dialect(
    paragraphs=qualify(A, "p"), texts=qualify(A, "t"), runs=qualify(A, "r"),
    properties=qualify(A, "rPr", "pPr", "endParaRPr"),
)
OPEN_DOCUMENT = Dialect(
    paragraphs=qualify(TEXT, "p", "h"), containers=qualify(TEXT, "span", "a", "meta"),
    markers=qualify(TEXT, "bookmark", "bookmark-start", "bookmark-end", "reference-mark", "reference-mark-start",
                    "reference-mark-end", "soft-page-break", "change", "change-start", "change-end")
    | qualify(OFFICE, "annotation-end"),
)


@dataclass(frozen=True)
class Package:
    """Which parts of a zipped document hold its text, and what proves the file is one."""

    kind: str  # in messages: "a Word document"
    parts: re.Pattern[str]
    dialect: Dialect
    required: str  # an entry every such file has
    mimetype: str | None = None  # ODF's `mimetype` entry


DOCX = Package("a Word document", re.compile(r"word/(document|header\d*|footer\d*|footnotes|endnotes)\.xml"),
               WORD, "word/document.xml")
PPTX = Package("a PowerPoint presentation", re.compile(r"ppt/(slides/slide|notesSlides/notesSlide)\d+\.xml"),
               DRAWING, "ppt/presentation.xml")
ODT = Package("an OpenDocument text", re.compile(r"content\.xml|styles\.xml"), OPEN_DOCUMENT, "content.xml",
              "application/vnd.oasis.opendocument.text")
ODP = Package("an OpenDocument presentation", re.compile(r"content\.xml"), OPEN_DOCUMENT, "content.xml",
              "application/vnd.oasis.opendocument.presentation")


def _check(package: Package, entries: dict[str, Entry], name: str) -> None:
    if package.required not in entries:
        raise InvalidDocument(f"{name} is not {package.kind} (it has no {package.required})")
    mimetype = entries.get("mimetype")
    if package.mimetype and mimetype is not None and mimetype.data.strip() != package.mimetype.encode():
        raise InvalidDocument(f"{name} is not {package.kind}: its mimetype is "
                              f"{mimetype.data[:80].decode('utf-8', 'replace')!r}")


def translatable_parts(entries: list[Entry], select: re.Pattern[str], dialect: Dialect, budget: Budget,
                       ) -> tuple[list[tuple[Entry, Any]], list[list[Span]]]:
    """The parsed parts that `select` names, and the spans of each of their paragraphs that has text."""
    parts = [(entry, parse_xml(entry.data, entry.info.filename, budget)) for entry in entries
             if select.fullmatch(entry.info.filename)]
    units = [found for _, tree in parts for p in paragraphs(tree, dialect) if (found := spans(p, dialect))]
    return parts, units


def apply(units: list[list[Span]], translated: list[str], dialect: Dialect) -> None:
    """Each paragraph's translated markup back into its spans."""
    for unit, markup in zip(units, translated, strict=True):
        for span, text in zip(unit, from_markup(markup, len(unit)), strict=True):
            span.replace(text, dialect)


def read_package(data: bytes, name: str, limits: Limits, package: Package) -> Document:
    entries = read_zip(data, name, limits)
    _check(package, entry_map(entries), name)
    parts, units = translatable_parts(entries, package.parts, package.dialect, Budget(limits.nodes, name))

    def rebuild(translated: list[str]) -> bytes:
        apply(units, translated, package.dialect)
        for entry, tree in parts:
            entry.data = serialize_xml(tree, entry.data)
        return write_zip(entries)

    return Document([to_markup([span.text for span in unit]) for unit in units], rebuild)


def read_docx(data: bytes, name: str, limits: Limits, target: str | None = None) -> Document:
    return read_package(data, name, limits, DOCX)


def read_pptx(data: bytes, name: str, limits: Limits, target: str | None = None) -> Document:
    return read_package(data, name, limits, PPTX)


def read_odt(data: bytes, name: str, limits: Limits, target: str | None = None) -> Document:
    return read_package(data, name, limits, ODT)


def read_odp(data: bytes, name: str, limits: Limits, target: str | None = None) -> Document:
    return read_package(data, name, limits, ODP)
