"""Four more public-domain novels that Debian's R packages carry as data (a source of `tolk data distill`).

- `r-cran-tidytext` holds, for its examples, Project Gutenberg's texts of Great Expectations (Dickens), Twenty
  Thousand Leagues under the Sea (Verne, in English), The War of the Worlds (Wells) and Pride and Prejudice, one
  printed line a row of a data frame (`extdata/books.rda`: gutenberg_id, text, title). Pride and Prejudice is left
  out: the `austen` source has it.
- `r-cran-tokenizers` holds Moby Dick (Melville) as one string (`data/`, R's lazy-load database), Project
  Gutenberg's header and licence included; only the text between its start and end marks is read.

Narrative and dialogue in the first and second person and the past tenses, as Austen's are, in four other voices,
written forty to ninety years after hers. Paragraphs are cut into sentences as Austen's are, with the titles these
books use ("M. Aronnax", "Mr. Pumblechook") and a name's initial ("H. G. Wells") joined again, and the fortunes'
limits keep those a small model can learn from.
"""

from __future__ import annotations

import re
import string
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .austen import ABBREVIATIONS, novel_sentences, rdata_module, read_lazyload

TIDYTEXT = "r-cran-tidytext"
TOKENIZERS = "r-cran-tokenizers"
BOOKS = "usr/lib/R/site-library/tidytext/extdata/books.rda"
MOBY_DICK = "usr/lib/R/site-library/tokenizers/data"
SKIP_TITLES = frozenset({"Pride and Prejudice"})  # the austen source has it
LICENCE = ("public domain (the texts, from Project Gutenberg); the R packages tidytext and tokenizers are "
           "MIT-licensed")
TITLES = ABBREVIATIONS | {"M.", "Mme.", "Mlle.", "Prof.", "Esq.", "Jr.", "Sr."}
# a name's initial ("H. G. Wells") does not end a sentence; "I." ends many
TITLES |= {f"{letter}." for letter in string.ascii_uppercase if letter != "I"}
_GUTENBERG_START = re.compile(r"^\*\*\* ?START OF (THIS|THE) PROJECT GUTENBERG.*$", re.MULTILINE)
_GUTENBERG_END = re.compile(r"^\*\*\* ?END OF (THIS|THE) PROJECT GUTENBERG.*$", re.MULTILINE)


def tidytext_books(path: Path) -> dict[str, list[str]]:
    """Each novel's printed lines, by title, in the file's order (`books.rda` of tidytext)."""
    with warnings.catch_warnings():  # rdata warns that it reads a tibble as a plain data frame
        warnings.simplefilter("ignore", UserWarning)
        frame: Any = rdata_module().read_rda(path)["books"]
    books: dict[str, list[str]] = {}
    for title, text in zip(frame["title"], frame["text"], strict=True):
        books.setdefault(str(title), []).append(text if isinstance(text, str) else "")  # R's NA: an empty line
    return books


def gutenberg_body(text: str) -> str:
    """A Project Gutenberg e-book's text between its start and end marks (all of it where they are missing)."""
    start, end = _GUTENBERG_START.search(text), _GUTENBERG_END.search(text)
    return text[start.end() if start else 0:end.start() if end else len(text)]


def sentences(root: Path) -> Iterator[str]:
    """Each usable sentence once, from whichever of the two packages is extracted in `root`: tidytext's novels in
    title order (but Pride and Prejudice), or Moby Dick."""
    seen: set[str] = set()
    novels: dict[str, list[str]] = {}
    if (root / BOOKS).is_file():
        novels = {t: lines for t, lines in tidytext_books(root / BOOKS).items() if t not in SKIP_TITLES}
    if (root / MOBY_DICK).is_dir():
        text = "".join(str(part) for part in read_lazyload(root / MOBY_DICK)["mobydick"])
        novels["Moby Dick"] = gutenberg_body(text.replace("\r\n", "\n")).split("\n")
    for title in sorted(novels):
        for sentence in novel_sentences(novels[title], TITLES):
            if sentence not in seen:
                seen.add(sentence)
                yield sentence
