"""Paragraphs of office XML (OOXML's `w:p` / `a:p`, ODF's `text:p`) as spans of one formatting, and back.

A paragraph is walked in document order. Its text sits in slots: the text of an OOXML `w:t` / `a:t`, or in ODF's
mixed content the text and tail of elements. Consecutive slots with the same formatting (the run's properties, or
the chain of `text:span` / `text:a` they sit in) and nothing between them make one span; a tab, a line break, a
drawing, a field or a footnote between them starts a new span (and stays where it was). The span's translation goes
into its first slot and its other slots are emptied, so every run, style and object keeps its place.

Parsing refuses what could make the parser work for an attacker: entity declarations (billion laughs, external
entities), network access, DTD loading, and trees beyond libxml2's default depth and text-size bounds.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from lxml import etree

from server.errors import InvalidDocument

XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"

Element = Any  # lxml's _Element (lxml ships no type information)
Key = tuple[Any, ...]


def parse_xml(data: bytes, name: str) -> Any:
    """An lxml tree of `data`, without entities, DTDs or network; InvalidDocument (400) when it is not safe XML."""
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)
    try:
        tree = etree.parse(io.BytesIO(data), parser)
    except etree.XMLSyntaxError as exc:
        raise InvalidDocument(f"{name} is not well-formed XML ({exc.msg})") from exc
    dtd = tree.docinfo.internalDTD
    if dtd is not None and any(True for _ in dtd.iterentities()):
        raise InvalidDocument(f"{name} declares XML entities; documents with entity declarations are refused")
    return tree


_DECLARATION = re.compile(rb"<\?xml[^>]*\?>\s*")


def serialize_xml(tree: Any, original: bytes) -> bytes:
    """The tree as bytes, under the original's XML declaration when it was UTF-8 (lxml would rewrite it)."""
    declared = _DECLARATION.match(original)
    encoding = tree.docinfo.encoding or "UTF-8"
    if declared and encoding.upper() == "UTF-8":
        body: bytes = etree.tostring(tree, encoding="UTF-8", xml_declaration=False)
        return declared.group() + body
    data: bytes = etree.tostring(tree, xml_declaration=True, encoding=encoding)
    return data


def qualify(namespace: str, *names: str) -> frozenset[str]:
    return frozenset(f"{{{namespace}}}{n}" for n in names)


@dataclass(frozen=True)
class Dialect:
    """What the elements of one XML vocabulary mean to the walk; any element not named here is a barrier."""

    paragraphs: frozenset[str]
    texts: frozenset[str] = frozenset()  # elements whose text is a slot (OOXML); none = mixed content (ODF)
    runs: frozenset[str] = frozenset()  # OOXML runs: their properties element is their formatting
    properties: frozenset[str] = frozenset()  # a run's formatting, or a paragraph's (skipped)
    containers: frozenset[str] = frozenset()  # walked into; the element's name and attributes join the key
    markers: frozenset[str] = frozenset()  # zero-width (bookmarks, proofing marks): neither text nor barrier
    skipped: frozenset[str] = frozenset()  # not walked, and no barrier (deleted text, paragraph properties)
    preserve_space: bool = False  # text elements need xml:space="preserve" to keep their edge spaces (Word's w:t)

    @cached_property
    def quiet(self) -> frozenset[str]:
        """Elements that neither hold text nor stand between texts."""
        return self.markers | self.skipped | self.properties


@dataclass
class Slot:
    element: Element
    tail: bool  # the element's tail (ODF) rather than its text

    def get(self) -> str:
        return (self.element.tail if self.tail else self.element.text) or ""

    def set(self, text: str) -> None:
        if self.tail:
            self.element.tail = text
        else:
            self.element.text = text


@dataclass
class Span:
    slots: list[Slot] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(slot.get() for slot in self.slots)

    def replace(self, text: str, dialect: Dialect) -> None:
        text = xml_safe(text)
        first, *rest = self.slots
        first.set(text)
        for slot in rest:
            slot.set("")
        if dialect.preserve_space and text != text.strip():
            first.element.set(XML_SPACE, "preserve")  # Word drops a w:t's edge spaces without it


BARRIER = None
# Characters XML 1.0 cannot hold; a model's byte-level output could produce them, and lxml refuses them.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_safe(text: str) -> str:
    return _NOT_XML.sub("", text)


def _ident(element: Element) -> Key:
    return (element.tag, tuple(sorted(element.attrib.items())))


def _props(run: Element, dialect: Dialect) -> bytes:
    for child in run:
        if child.tag in dialect.properties:
            data: bytes = etree.tostring(child)
            return data
    return b""


def _walk(element: Element, key: Key, dialect: Dialect) -> Iterator[tuple[Key, Slot] | None]:
    """(formatting, slot) in document order, and BARRIER wherever something other than text intervenes."""
    mixed = not dialect.texts
    if mixed:
        yield key, Slot(element, False)
    for child in element:
        tag = child.tag
        if not isinstance(tag, str) or tag in dialect.quiet:  # comments, processing instructions, bookmarks
            pass
        elif tag in dialect.runs:
            yield from _walk(child, (*key, _props(child, dialect)), dialect)
        elif tag in dialect.containers:
            yield from _walk(child, (*key, _ident(child)), dialect)
        elif tag in dialect.texts:
            yield key, Slot(child, False)
        else:
            yield BARRIER
        if mixed:
            yield key, Slot(child, True)


def spans(paragraph: Element, dialect: Dialect) -> list[Span]:
    """A paragraph's spans with text (whitespace-only spans are left as they are)."""
    found: list[Span] = []
    last: Key | None = None
    for item in _walk(paragraph, (), dialect):
        if item is BARRIER:
            last = None
            continue
        key, slot = item
        if not found or key != last:
            found.append(Span())
        found[-1].slots.append(slot)
        last = key
    return [span for span in found if span.text.strip()]


def paragraphs(tree: Any, dialect: Dialect) -> Iterator[Element]:
    """Every paragraph, nested ones (text boxes, notes, table cells) included, in document order."""
    for element in tree.iter():
        if element.tag in dialect.paragraphs:
            yield element
