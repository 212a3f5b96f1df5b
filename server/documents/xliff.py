"""XLIFF 1.2 and 2.0 (.xliff, .xlf): a `<target>` written for each source not yet translated; nothing else changes.

1.2: each `<trans-unit>` (not `translate="no"`) whose `<target>` is missing or empty gets one, with
`state="needs-review-translation"` and `state-qualifier="leveraged-mt"` (the spec's values for a translation made
by a machine that a translator should check). 2.0: each `<segment>` of a unit (not `translate="no"`) without a
non-empty `<target>` gets one, and the segment `state="translated"` (2.0's states are initial, translated, reviewed,
final). Sources, notes, other units and every attribute stay as they are.

Inline elements of a source travel inside its sentence as tags the model keeps (`server/placeholders.py`):
standalone ones (1.2's `x`, `bx`, `ex`, `ph`, `bpt`, `ept`, `it`; 2.0's `ph`, `sc`, `ec`, `sm`, `em`, `cp`) as
`<xN/>`, paired ones (`g`, `mrk`, `pc`) as `<gN>...</gN>` around their translated text; in the target each comes
back as a copy of its element. When the translation nests the pairs wrongly, their text is kept but the pairs are
written empty where they opened.

XML is parsed by lxml with entities, DTD loading and the network off (`server/documents/xmltext.py`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

from server.documents.archive import Limits
from server.documents.document import Document
from server.documents.markup import from_markup, to_markup
from server.documents.xmltext import Budget, Element, parse_xml, serialize_xml
from server.errors import InvalidDocument

XLIFF_12 = "urn:oasis:names:tc:xliff:document:1.2"
XLIFF_20 = "urn:oasis:names:tc:xliff:document:2.0"
_PAIRED = {"g", "mrk", "pc"}
_TOKEN = re.compile(r"<x(\d+)/>|<g(\d+)>|</g(\d+)>")


def _local(element: Element) -> str:
    tag = element.tag
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def flatten(source: Element) -> tuple[str, list[Element]]:
    """The source's text with its inline elements as tokens, and the elements by token number."""
    elements: list[Element] = []
    out = [source.text or ""]

    def walk(element: Element) -> None:
        for child in element:
            if not isinstance(child.tag, str):  # a comment or processing instruction: dropped from the text
                out.append(child.tail or "")
                continue
            n = len(elements)
            elements.append(child)
            if _local(child) in _PAIRED:
                out.append(f"<g{n}>{child.text or ''}")
                walk(child)
                out.append(f"</g{n}>")
            else:
                out.append(f"<x{n}/>")
            out.append(child.tail or "")

    walk(source)
    return "".join(out), elements


def unflatten(target: Element, text: str, elements: list[Element], pairs: bool = True) -> bool:
    """Fill target from a translated flat text; False when the pairs were nested wrongly.

    With pairs False, a pair is written empty where it opens and its closing token is dropped.
    """
    stack: list[Element] = [target]
    nested = True
    last: list[Element | None] = [None]  # the element whose tail takes the next text, per open level
    at = 0

    def add_text(value: str) -> None:
        if not value:
            return
        parent, previous = stack[-1], last[-1]
        if previous is None:
            parent.text = (parent.text or "") + value
        else:
            previous.tail = (previous.tail or "") + value

    for m in _TOKEN.finditer(text):
        add_text(text[at:m.start()])
        at = m.end()
        standalone, opening, closing = m.groups()
        if standalone is not None or opening is not None:
            n = int(standalone if standalone is not None else opening)
            if n >= len(elements):
                add_text(m.group())
                continue
            original = elements[n]
            element = copy.deepcopy(original)
            element.tail = None
            if opening is not None:
                _clear(element)
            stack[-1].append(element)
            last[-1] = element
            if pairs and opening is not None and _local(original) in _PAIRED:
                stack.append(element)
                last.append(None)
        elif pairs:
            n = int(closing)
            if len(stack) > 1 and n < len(elements) and stack[-1].get("id") == elements[n].get("id") \
                    and _local(stack[-1]) == _local(elements[n]):
                stack.pop()
                last.pop()
            else:
                nested = False
    add_text(text[at:])
    return nested and len(stack) == 1


def read_xliff(data: bytes, name: str, limits: Limits, target: str | None = None) -> Document:
    """An XLIFF 1.2 or 2.0 file: one text per source without a translation."""
    tree = parse_xml(data, name, Budget(limits.nodes, name))
    root = tree.getroot()
    namespace = root.tag[1:].split("}", 1)[0] if root.tag.startswith("{") else ""
    if _local(root) != "xliff" or namespace not in (XLIFF_12, XLIFF_20):
        raise InvalidDocument(f"{name} is not XLIFF 1.2 or 2.0 (its root is {root.tag})")
    units = _units_12(root) if namespace == XLIFF_12 else _units_20(root)
    texts: list[str] = []
    fills: list[Callable[[str], None]] = []
    for holder, source in units:
        flat, elements = flatten(source)
        if not any(c.isalnum() for c in _TOKEN.sub("", flat)):  # nothing but inline elements and punctuation
            continue
        texts.append(to_markup([flat]))
        fills.append(_filler(namespace, holder, source, elements))

    def rebuild(out: list[str]) -> bytes:
        for fill, translated in zip(fills, out, strict=True):
            fill(from_markup(translated, 1)[0])
        if target and fills:
            _name_target(root, namespace, target)
        return serialize_xml(tree, data)

    return Document(texts, rebuild)


def _name_target(root: Element, namespace: str, target: str) -> None:
    """Targets were written: say their language where the file does not (2.0 requires `trgLang` once a target
    exists; 1.2's `<file target-language>` is optional but tools read it)."""
    if namespace == XLIFF_20:
        if not root.get("trgLang"):
            root.set("trgLang", target)
        return
    for file in root.iter(f"{{{XLIFF_12}}}file"):
        if not file.get("target-language"):
            file.set("target-language", target)


def _mark(namespace: str, holder: Element, target: Element) -> None:
    """The state of a machine-translated target: on the target in 1.2, on its segment in 2.0."""
    if namespace == XLIFF_12:
        target.set("state", "needs-review-translation")
        target.set("state-qualifier", "leveraged-mt")
    else:
        holder.set("state", "translated")


def _units_12(root: Element) -> list[tuple[Element, Element]]:
    ns = f"{{{XLIFF_12}}}"
    found = []
    for unit in root.iter(f"{ns}trans-unit"):
        source = unit.find(f"{ns}source")
        target = unit.find(f"{ns}target")
        if unit.get("translate") == "no" or source is None or target is not None and _has_text(target):
            continue
        found.append((unit, source))
    return found


def _units_20(root: Element) -> list[tuple[Element, Element]]:
    ns = f"{{{XLIFF_20}}}"
    found = []
    for unit in root.iter(f"{ns}unit"):
        if unit.get("translate") == "no":
            continue
        for segment in unit.iter(f"{ns}segment"):
            source = segment.find(f"{ns}source")
            target = segment.find(f"{ns}target")
            if source is None or target is not None and _has_text(target):
                continue
            found.append((segment, source))
    return found


def _has_text(element: Element) -> bool:
    return bool("".join(element.itertext()).strip()) or len(element) > 0


def _clear(element: Element) -> None:
    for child in list(element):
        element.remove(child)
    element.text = None


def _filler(namespace: str, holder: Element, source: Element, elements: list[Element]) -> Callable[[str], None]:
    def fill(translation: str) -> None:
        target: Any = holder.find(f"{{{namespace}}}target")
        if target is None:
            target = source.makeelement(f"{{{namespace}}}target", {})
            before = source.getprevious()
            indent = holder.text if before is None else before.tail
            target.tail = source.tail
            source.addnext(target)
            source.tail = indent if indent is not None and not indent.strip() else source.tail
        else:
            _clear(target)
        space = source.get("{http://www.w3.org/XML/1998/namespace}space")
        if space is not None:
            target.set("{http://www.w3.org/XML/1998/namespace}space", space)
        if not unflatten(target, translation, elements):
            _clear(target)
            unflatten(target, translation, elements, pairs=False)
        _mark(namespace, holder, target)

    return fill
