"""ChatterBot's dialogue corpus: short English conversations (a source of `tolk data distill`).

The `chatterbot-corpus` package (BSD-3-Clause) holds one YAML file a topic under `chatterbot_corpus/data/english`
(greetings, food, health, money, ...), each a list of conversations, each a list of turns: "Good morning, how are
you?", "I am doing well, how about you?", "Could I borrow a cup of sugar?". Questions and replies in the first and
second person are what the everyday sentences ask of a model and what software text lacks. A turn is cut into
sentences as the fortunes are; a turn without an end stop ("That is good to hear") is kept as it is when it would
be usable with one. The fortunes' limits apply otherwise (3 to 40 words, a capital first, mostly letters).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .austen import sentences_of
from .fortunes import usable

PACKAGE = "pypi:chatterbot-corpus==1.3.3"
DATA_ROOT = "chatterbot_corpus/data/english"
LICENCE = "BSD-3-Clause (chatterbot-corpus)"


def _yaml() -> Any:
    try:
        import yaml
    except ImportError as exc:
        raise SystemExit(f'reading chatterbot-corpus needs PyYAML: pip install -e ".[bench]" ({exc})') from exc
    return yaml


def turns(path: Path) -> Iterator[str]:
    """The turns of one topic file's conversations, in order (a turn that is not text is skipped)."""
    document = _yaml().safe_load(path.read_text(encoding="utf-8")) or {}
    for conversation in document.get("conversations") or []:
        for turn in conversation if isinstance(conversation, list) else []:
            if isinstance(turn, str):
                yield turn


def conversational(sentence: str) -> bool:
    """`fortunes.usable`, or usable once an end stop is added: a chat turn often has none."""
    return usable(sentence) or (sentence[-1:].isalnum() and usable(sentence + "."))


def sentences(root: Path) -> Iterator[str]:
    """Each usable sentence once, topic file by topic file in name order, from the extracted wheel."""
    seen: set[str] = set()
    for path in sorted((root / DATA_ROOT).glob("*.yml")):
        for turn in turns(path):
            for sentence in sentences_of(turn):
                if conversational(sentence) and sentence not in seen:
                    seen.add(sentence)
                    yield sentence
