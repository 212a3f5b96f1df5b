"""Paragraphs of office XML (OOXML's `w:p` / `a:p`, ODF's `text:p`) as spans of one formatting, and back.

A paragraph is walked in document order. Its text sits in slots: the text of an OOXML `w:t` / `a:t`, or in ODF's
mixed content the text and tail of elements. Consecutive slots with the same formatting (the run's properties, or
the chain of `text:span` / `text:a` they sit in) and nothing between them make one span; a tab, a line break, a
drawing, a field or a footnote between them starts a new span (and stays where it was). The span's translation goes
into its first slot and its other slots are emptied, so every run, style and object keeps its place.

Parsing refuses what could make the parser work for an attacker: a DTD that declares anything (billion laughs,
external entities), network access, DTD loading, trees beyond libxml2's default depth and text-size bounds, and more
markup than the file's budget (`Budget`): its cost is counted in the bytes before libxml2 builds a node, since a
90 KB upload can hold 60 MiB of `<w:p/>`, 10 million nodes, gigabytes once parsed.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from lxml import etree

from server.errors import InvalidDocument, PayloadTooLarge

XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"

Element = Any  # lxml's _Element (lxml ships no type information)
Key = tuple[Any, ...]


class Budget:
    """The markup one file may have parsed, counted as elements and attributes.

    Every element, comment or instruction starts with `<` and every attribute has its `=`, so their count in the
    raw markup bounds what a parser builds, at the cost of one pass over the bytes (a 60 MiB part in about 50 ms)
    and before anything is allocated. It over-counts (end tags, `=` in text), never under-counts."""

    def __init__(self, nodes: int, name: str) -> None:
        self.limit = self.left = nodes
        self.name = name

    def take(self, markup: bytes | str) -> None:
        """Count this markup against the budget; 413 once it is spent."""
        cost = markup.count(b"<") + markup.count(b"=") if isinstance(markup, bytes) else (
            markup.count("<") + markup.count("="))
        self.left -= cost
        if self.left < 0:
            raise PayloadTooLarge(f"{self.name} has more markup than this server reads: over {self.limit} elements "
                                  "and attributes")


# A document type with an internal subset: where entities (and every other declaration) would be declared.
_INTERNAL_SUBSET = re.compile(rb"<!DOCTYPE[^>\[]*\[")
_ROOT = re.compile(rb"<[^?!]")


def parse_xml(data: bytes, name: str, budget: Budget) -> Any:
    """An lxml tree of `data`, without DTDs, entities or network, within the file's markup budget; InvalidDocument
    (400) when it is not safe XML, PayloadTooLarge (413) past the budget."""
    budget.take(data)
    root = _ROOT.search(data)
    if _INTERNAL_SUBSET.search(data, 0, root.start() if root else len(data)):  # a DOCTYPE comes before the root
        raise InvalidDocument(f"{name} declares a document type of its own; documents with DTDs are refused")
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)
    try:
        tree = etree.parse(io.BytesIO(data), parser)
    except etree.XMLSyntaxError as exc:
        raise InvalidDocument(f"{name} is not well-formed XML ({exc.msg})") from exc
    dtd = tree.docinfo.internalDTD  # the same, in an encoding the pattern above cannot read (UTF-16)
    if dtd is not None and (any(True for _ in dtd.iterentities()) or any(True for _ in dtd.iterelements())):
        raise InvalidDocument(f"{name} declares XML entities; documents with entity declarations are refused")
    return tree


# In HTML: a document type with an internal subset, or an entity declared anywhere (an HTML parser ignores both;
# an XML reader of an EPUB page would not).
_HTML_DECLARATION = re.compile(r"<!DOCTYPE[^>\[]*\[|<!ENTITY", re.IGNORECASE)


def check_html(text: str, name: str, budget: Budget) -> None:
    """An HTML or XHTML page that goes to the HTML path as markup: within the budget and declaring no entities."""
    budget.take(text)
    if _HTML_DECLARATION.search(text):
        raise InvalidDocument(f"{name} declares a document type or entities of its own; pages with DTDs are "
                              "refused")


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
