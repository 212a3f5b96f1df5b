"""What every format's reader gives the route: the texts to translate, and how to build the translated file."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from server.documents.archive import Limits


@dataclass
class Document:
    texts: list[str]  # markup for the HTML path (`server/documents/markup.py`): one per paragraph, cue or page
    rebuild: Callable[[list[str]], bytes]  # the translated file, from the translation of each text


Reader = Callable[[bytes, str, Limits, str | None], Document]  # (bytes, name, limits of archives, target language)
