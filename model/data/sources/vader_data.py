"""Product reviews and newspaper editorials that the `vaderSentiment` package carries as data (sources of
`tolk data distill`).

The source distribution of vaderSentiment 3.3.2 (MIT) holds the data of its paper (Hutto and Gilbert, ICWSM 2014)
in `additional_resources/hutto_ICWSM_2014.tar.gz`; the wheel leaves it out. Two of its four files are today's
everyday English that the corpus and the older texts lack:

- `reviews`: 3,708 snippets of Amazon product reviews (about 3,000 usable sentences), written by the people who
  bought the things ("i just purchased this player and i have to say that i love it."). The file has them in lower
  case; a sentence's first letter and the pronoun "I" are written as capitals again, and the names of products
  stay in lower case.
- `editorials`: 5,190 sentences of New York Times editorials, 4,317 of them usable ("Later, he read up on the
  phenomenon."); the file's two apostrophes for a double quote become one double quote.

The other two are left out: the movie-review snippets are Pang and Lee's, which the `movies` source has, and the
tweets are mostly names, links and tags. Each line is an identifier, a sentiment score and the text, tab-separated.
Cut into sentences as the speeches are, with the fortunes' limits.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterator
from pathlib import Path

from .austen import sentences_of
from .fortunes import usable
from .scattertext_data import TITLES

PACKAGE = "pypi-sdist:vaderSentiment==3.3.2"
ARCHIVE = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
REVIEWS = "hutto_ICWSM_2014/amazonReviewSnippets_GroundTruth.txt"
EDITORIALS = "hutto_ICWSM_2014/nytEditorialSnippets_GroundTruth.txt"
LICENCE_REVIEWS = ("data of vaderSentiment (MIT): Hutto and Gilbert's Amazon product review snippets, shared with "
                   "the package; no other terms stated")
LICENCE_EDITORIALS = ("data of vaderSentiment (MIT): Hutto and Gilbert's New York Times editorial snippets, shared "
                      "with the package; no other terms stated")
MONTHS = frozenset({"Jan.", "Feb.", "Aug.", "Sept.", "Oct.", "Nov.", "Dec."})  # "On Dec. 19, around noon, ..."
_SENTENCE_START = re.compile(r"(?:^|(?<=[.!?] ))[a-z]")
_PRONOUN = re.compile(r"(?<![\w/.'-])i(?=(?:'m|'ve|'d|'ll)?(?![\w/.'-]))")  # "i", "i'm"; not "i/p" nor "i.e."


def texts(root: Path, member: str) -> list[str]:
    """The text column of one of the data files, in the file's order, from the unpacked source distribution."""
    with tarfile.open(root / ARCHIVE) as tar:
        handle = tar.extractfile(member)
        if handle is None:
            raise FileNotFoundError(f"{member} in {root / ARCHIVE}")
        lines = handle.read().decode("utf-8").splitlines()
    return [line.split("\t", 2)[2] for line in lines if line.count("\t") >= 2]


def capitalised(text: str) -> str:
    """Lower-cased text with the pronoun "I" and each sentence's first letter (at the start, and after a stop and a
    space) in capitals again, so that it can be cut into sentences."""
    text = _PRONOUN.sub("I", text)
    return _SENTENCE_START.sub(lambda m: m.group(0).upper(), text)


def _usable_sentences(paragraphs: list[str], restore_case: bool) -> Iterator[str]:
    seen: set[str] = set()
    for paragraph in paragraphs:
        paragraph = paragraph.replace("''", '"')
        for sentence in sentences_of(capitalised(paragraph) if restore_case else paragraph, TITLES | MONTHS):
            if usable(sentence) and sentence not in seen:
                seen.add(sentence)
                yield sentence


def reviews(root: Path) -> Iterator[str]:
    """The usable sentences of the Amazon review snippets, first letters and "I" in capitals."""
    return _usable_sentences(texts(root, REVIEWS), restore_case=True)


def editorials(root: Path) -> Iterator[str]:
    """The usable sentences of the New York Times editorial snippets."""
    return _usable_sentences(texts(root, EDITORIALS), restore_case=False)
