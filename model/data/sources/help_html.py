"""Paragraph extraction from LibreOffice help HTML, keyed by element id."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

_ID = re.compile(r"^(?:par|hd)_")
_VOID = frozenset("area base br col embed hr img input link meta source track wbr".split())
_SKIP_CLASSES = ("code", "bascode", "example", "pycode")


class _ParagraphParser(HTMLParser):
    """Collects the text of elements whose id looks like ``par_*``/``hd_*``."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: dict[str, str] = {}
        self._current: str | None = None
        self._depth = 0
        self._buffer: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _VOID:
            return
        if self._current is not None:
            self._depth += 1
            return
        values = dict(attrs)
        ident = values.get("id") or ""
        css = values.get("class") or ""
        if _ID.match(ident) and not any(c in css.split() for c in _SKIP_CLASSES):
            self._current, self._depth, self._buffer = ident, 1, []

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID or self._current is None:
            return
        self._depth -= 1
        if self._depth == 0:
            self.paragraphs.setdefault(self._current, "".join(self._buffer))
            self._current = None

    def handle_data(self, data: str) -> None:
        if self._current is not None:
            self._buffer.append(data)


def html_paragraphs(path: Path) -> dict[str, str]:
    """Map element id -> raw text for one help page."""
    parser = _ParagraphParser()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    parser.close()
    return parser.paragraphs
