"""WordNet's usage examples: everyday English sentences, one language only (the source of `tolk data distill`).

Every synset of WordNet 3.0 (Debian's `wordnet-base`) may end its gloss with quoted examples of the word in use:
"The tsunami swamped every boat in the harbor", "Someone tampered with the documents on my desk". About 48,000 of
them, everyday vocabulary across the whole dictionary, where the corpus's human translations are software text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

from ..clean import collapse_ws

NAME = "wordnet"
PACKAGE = "wordnet-base"
DATA_FILES = ("data.noun", "data.verb", "data.adj", "data.adv")
DATA_ROOT = "usr/share/wordnet"
LICENCE = "WordNet 3.0 licence (Princeton University; permission to use, copy, modify and distribute)"
_QUOTED = re.compile(r'"([^"]+)"')
MIN_WORDS = 3


def gloss_examples(line: str) -> list[str]:
    """The quoted examples of one `data.*` line (after its gloss bar); none for the licence header's lines."""
    if line.startswith(" ") or "|" not in line:
        return []
    gloss = line.split("|", 1)[1]
    return [collapse_ws(m).strip(" ;") for m in _QUOTED.findall(gloss)]


def usable(example: str) -> bool:
    """A sentence worth translating: at least three words, letters first, no WordNet frame markers."""
    return len(example.split()) >= MIN_WORDS and example[:1].isalpha() and "%" not in example


def _usable_once(root: Path, parts: Callable[[str], list[str]]) -> Iterator[str]:
    """Each usable part of the `data.*` lines once, in file order, from an extracted `wordnet-base`."""
    seen: set[str] = set()
    for name in DATA_FILES:
        with (root / DATA_ROOT / name).open(encoding="utf-8", errors="replace") as f:
            for line in f:
                for part in parts(line):
                    if usable(part) and part not in seen:
                        seen.add(part)
                        yield part


def examples(root: Path) -> Iterator[str]:
    """Each usable example once, in file order, from an extracted `wordnet-base` (root = the extraction folder)."""
    return _usable_once(root, gloss_examples)


def gloss_definitions(line: str) -> list[str]:
    """The definitions of one `data.*` line: its gloss before the first quoted example, split at semicolons."""
    if line.startswith(" ") or "|" not in line:
        return []
    gloss = line.split("|", 1)[1].split('"', 1)[0]
    return [d for d in (collapse_ws(part).strip(" ;") for part in gloss.split(";")) if d]


def definitions(root: Path) -> Iterator[str]:
    """Each usable definition once, in file order ("a white nutritious liquid secreted by mammals and used as food
    by human beings"): about 120,000 descriptive phrases, the whole dictionary's vocabulary."""
    return _usable_once(root, gloss_definitions)
