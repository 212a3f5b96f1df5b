"""Jane Austen's six novels: English narrative and dialogue (a source of `tolk data distill`).

Debian's `r-cran-janeaustenr` carries the complete texts of Emma, Mansfield Park, Northanger Abbey, Persuasion,
Pride and Prejudice and Sense and Sensibility (public domain, from Project Gutenberg) as character vectors, one
line of the printed text each, in R's lazy-load database (`data/Rdata.rdx`, an index, and `data/Rdata.rdb`, the
objects). Their sentences are narrative and conversation: first and second person, past tenses, questions ("I do
not know where the error lies.", "When you give me your opinion, I always know what is right."), what software text
lacks. The English is two centuries old ("every thing", "chuse") and long-winded; the word and length limits of the
fortunes keep the sentences a small model can learn from.

The database is read with `rdata` (the bench extra): the index is an RDS file naming each object's offset and length
in the `.rdb`; each object there is a 4-byte big-endian length and a zlib stream of R's serialization.
"""

from __future__ import annotations

import struct
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..clean import collapse_ws
from .fortunes import SENTENCE_END, usable

PACKAGE = "r-cran-janeaustenr"
DATA_ROOT = "usr/lib/R/site-library/janeaustenr/data"
LICENCE = "public domain (the texts, from Project Gutenberg); the R package janeaustenr is MIT-licensed"
# A stop after these is not a sentence's end ("Mr. Darcy", "Mrs. Bennet").
ABBREVIATIONS = frozenset({"Mr.", "Mrs.", "Messrs.", "Dr.", "St.", "Col.", "Capt.", "Sir.", "Rev."})


def rdata_module() -> Any:
    try:
        import rdata
    except ImportError as exc:
        raise SystemExit(f'reading {PACKAGE} needs rdata: pip install -e ".[bench]" ({exc})') from exc
    return rdata


def read_lazyload(data: Path, stem: str = "Rdata") -> dict[str, Any]:
    """The objects of one R lazy-load database (`<stem>.rdx` and `<stem>.rdb` in `data`), by name, converted to
    Python by `rdata` (a character vector becomes an array of str)."""
    rdata = rdata_module()
    out: dict[str, Any] = {}
    with warnings.catch_warnings():  # rdata warns that an .rdx is not named .rds and that a record has no magic
        warnings.simplefilter("ignore", UserWarning)
        index = rdata.conversion.convert(rdata.parser.parse_file(data / f"{stem}.rdx"))
        blob = (data / f"{stem}.rdb").read_bytes()
        for name, (offset, length) in index["variables"].items():
            record = blob[int(offset):int(offset) + int(length)]
            size = struct.unpack(">I", record[:4])[0]
            raw = zlib.decompress(record[4:])
            if len(raw) != size:
                raise ValueError(f"{data / stem}.rdb: {name} is {len(raw)} bytes, its header says {size}")
            out[str(name)] = rdata.conversion.convert(rdata.parser.parse_data(raw))
    return out


def sentences_of(paragraph: str, abbreviations: frozenset[str] = ABBREVIATIONS) -> list[str]:
    """A paragraph's sentences: cut after `.`, `!` or `?` as the fortunes are, joined again after a title
    (`abbreviations`); italics marks dropped, and a double quote left open or closed by the cut removed."""
    parts = SENTENCE_END.split(collapse_ws(paragraph.replace("_", "")))  # Project Gutenberg writes _emphasis_
    out: list[str] = []
    for part in (p.strip() for p in parts if p.strip()):
        if out and out[-1].rsplit(" ", 1)[-1].lstrip("\"'(") in abbreviations:
            out[-1] = f"{out[-1]} {part}"
        else:
            out.append(part)
    return [_balance_quotes(s) for s in out]


def _balance_quotes(sentence: str) -> str:
    if sentence.count('"') % 2 == 0:
        return sentence
    if sentence.startswith('"'):
        return sentence[1:]
    return sentence[:-1] if sentence.endswith('"') else sentence.replace('"', "")


def novel_sentences(lines: list[str], abbreviations: frozenset[str] = ABBREVIATIONS) -> Iterator[str]:
    """The usable sentences (the fortunes' `usable`) of one novel's lines: paragraphs are separated by empty lines;
    a stop after one of `abbreviations` does not end a sentence."""
    paragraph: list[str] = []
    for line in [*lines, ""]:
        if line.strip():
            paragraph.append(line)
            continue
        for sentence in sentences_of(" ".join(paragraph), abbreviations):
            if usable(sentence):
                yield sentence
        paragraph = []


def sentences(root: Path) -> Iterator[str]:
    """Each usable sentence once, novel by novel in name order, from the extracted package (root = the folder it
    was extracted into)."""
    seen: set[str] = set()
    novels = read_lazyload(root / DATA_ROOT)
    for name in sorted(novels):
        for sentence in novel_sentences([str(line) for line in novels[name]]):
            if sentence not in seen:
                seen.add(sentence)
                yield sentence
