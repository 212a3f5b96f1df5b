"""fortune-mod's cookie files: quotations, jokes, proverbs and dialogue, one language a package (a source of
`tolk data distill`).

`fortunes-min` and `fortunes` carry about 15,000 English fortunes; `fortunes-br` about 2,500 Brazilian Portuguese
ones. A file holds fortunes separated by lines of one `%`; many end with an attribution ("-- Mark Twain"), some are
verse, code or pictures. The sentences of their prose are what a model trained on software text lacks: everyday
words in everyday syntax.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from ..clean import collapse_ws

DATA_ROOT = "usr/share/games/fortunes"
SKIP = frozenset({"ascii-art", "ethnic", "perl", "translate-me"})  # pictures, slurs, Perl code, text to translate
LICENCE_EN = "BSD licence (fortune-mod; the cookie files collected by its authors)"
LICENCE_PT = "GPL-2.0-or-later"
MIN_WORDS, MAX_WORDS = 3, 40
SENTENCE_END = re.compile(r"(?<=[.!?])[\"')]*\s+(?=[\"'(]?[A-ZÀ-Ý])")
_NOT_PROSE = re.compile(r"[|_<>{}\[\]=#@\\/*~^$]|--|\.\.\.|\s-\s|^[-–—]")


def fortunes(path: Path) -> Iterator[str]:
    """The fortunes of one cookie file, each as its lines joined."""
    entry: list[str] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.strip() == "%":
            if entry:
                yield "\n".join(entry)
            entry = []
        else:
            entry.append(line)
    if entry:
        yield "\n".join(entry)


def prose_lines(fortune: str) -> list[str]:
    """A fortune's lines without its attribution (a line starting with `--`, and what follows it); none for a
    fortune laid out with indents or tabs (verse, dialogue, code and pictures are, in these files)."""
    lines: list[str] = []
    for line in fortune.splitlines():
        if line.strip().startswith(("--", "—")):
            break
        if line.strip() and (line.startswith(" ") or "\t" in line):
            return []
        lines.append(line)
    return lines


def sentences_of(fortune: str) -> list[str]:
    """The prose sentences of one fortune: paragraphs joined into lines, then cut after `.`, `!` or `?`."""
    text = "\n".join(prose_lines(fortune))
    out: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        out.extend(s.strip() for s in SENTENCE_END.split(collapse_ws(paragraph)) if s.strip())
    return out


def usable(sentence: str) -> bool:
    """A sentence worth translating: 3 to 40 words, a capital first, an end stop, no markup, code or dialogue
    marks, mostly letters."""
    words = sentence.split()
    if not MIN_WORDS <= len(words) <= MAX_WORDS or not sentence[:1].isupper() or sentence[-1] not in ".!?":
        return False
    letters = sum(c.isalpha() for c in sentence)
    return not _NOT_PROSE.search(sentence) and letters >= 0.7 * len(sentence.replace(" ", ""))


def sentences(root: Path) -> Iterator[str]:
    """Each usable sentence once, file by file in name order, from extracted fortune packages (root = the folder
    they were extracted into)."""
    seen: set[str] = set()
    for path in sorted((root / DATA_ROOT).iterdir()):
        if "." in path.name or path.name in SKIP or path.is_symlink() or not path.is_file():
            continue
        for fortune in fortunes(path):
            for sentence in sentences_of(fortune):
                if usable(sentence) and sentence not in seen:
                    seen.add(sentence)
                    yield sentence
