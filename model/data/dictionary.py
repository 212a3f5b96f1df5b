"""``tolk data dictionary``: the FreeDict English-Portuguese and Portuguese-English dictionaries as word pairs.

The small models mistranslate everyday words they have seen in a hundred sentences: "praia" (beach) comes back as
"pleasure", "avós" (grandparents) as "abors", "neblina" (fog) as "nebline". A bilingual dictionary states each
such word's translation once, with nothing around it. Debian packages FreeDict's two dictionaries in the dict
server's format (`dict-freedict-eng-por`, about 15,800 headwords, and `dict-freedict-por-eng`, about 10,700):
an index of headwords with the place of each entry in a dictzip file (gzip-compatible), and entries such as

    corner /kɔːnər/
    1. abarcar, açambarcar, fazer truste
    2. esquina

Each numbered sense (or the one unnumbered line) gives one pair: the headword and the sense's first translation
("corner" / "abarcar", "corner" / "esquina"). Explanations rather than translations (a parenthesis, an ellipsis,
more than `MAX_WORDS` words) are left out. Human translations, written as training pairs (train split only):

    tolk data dictionary --out data/dict-freedict

Pairs whose words match a held-out sentence (`distill.HELD_OUT`, as `tolk data distill` does; none of today's
held-out lines is one word, so none did) are dropped, and the rest go through the corpus's cleaning, which takes a word
spelt the same in both languages for one left untranslated and drops it. A Portuguese side in a form used only in
Portugal ("comboio", "facto", "acção": the English-Portuguese dictionary predates the spelling reform) is dropped
too (`variety.brazilian_only`).
"""

from __future__ import annotations

import argparse
import gzip
import logging
import re
from collections.abc import Iterator
from pathlib import Path

from . import apt, extra
from .distill import held_out_keys
from .notice import deb_version
from .pairs import Pair

log = logging.getLogger(__name__)
PACKAGES = {"dict-freedict-eng-por": "en", "dict-freedict-por-eng": "pt"}  # package -> its headwords' language
LICENCE = "GPL-2+ (FreeDict; the English-Portuguese dictionary was made from Ergane's)"
MAX_WORDS = 4  # a translation longer than this is an explanation ("pequeno programa escrito em JavaScript ...")
_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_SENSE = re.compile(r"^\d+\.\s+")
_HEAD_END = re.compile(r"\s+[/<]")


def dictd_number(text: str) -> int:
    """An offset or a length in a dictd index: base 64, most significant digit first."""
    value = 0
    for char in text:
        value = value * 64 + _B64.index(char)
    return value


def entries(index: str, data: bytes) -> Iterator[tuple[str, str]]:
    """(headword, entry text) for each line of a dictd index; the database's own "00-database-..." entries skipped."""
    for line in index.splitlines():
        fields = line.split("\t")
        if len(fields) < 3 or fields[0].startswith("00-database") or fields[0].startswith("00database"):
            continue
        start, length = dictd_number(fields[1]), dictd_number(fields[2])
        yield fields[0], data[start:start + length].decode("utf-8", errors="replace")


def sense_translations(entry: str) -> list[str]:
    """The first translation of each sense of an entry (its lines after the headword line), explanations left out."""
    out = []
    for line in entry.strip("\n").split("\n")[1:]:
        first = _SENSE.sub("", line.strip()).split(", ")[0].strip()
        if first and not any(mark in first for mark in ("(", "...", '"')) and len(first.split()) <= MAX_WORDS:
            out.append(first)
    return out


def headword(entry: str, indexed: str) -> str:
    """The headword as the entry's first line writes it (before its pronunciation and word class)."""
    first = entry.lstrip("\n").split("\n", 1)[0]
    return _HEAD_END.split(first, 1)[0].strip() or indexed


def word_pairs(index: str, data: bytes, lang: str) -> Iterator[tuple[str, str]]:
    """(English, Portuguese) for each sense of each entry of a dictionary whose headwords are in `lang`."""
    for indexed, entry in entries(index, data):
        head = headword(entry, indexed)
        for translation in sense_translations(entry):
            yield (head, translation) if lang == "en" else (translation, head)


def read_dictionary(root: Path, package: str) -> tuple[str, bytes]:
    """The index and the uncompressed data of an extracted `dict-freedict-*` package."""
    stem = package.removeprefix("dict-")
    folder = root / "usr/share/dictd"
    return ((folder / f"{stem}.index").read_text(encoding="utf-8"),
            gzip.decompress((folder / f"{stem}.dict.dz").read_bytes()))


def dictionary_pairs(found: list[tuple[str, str, str]], held: set[str]) -> tuple[list[Pair], dict[str, int]]:
    """(English, Portuguese, package) triples as cleaned pairs, each once, none matching a held-out sentence and
    none in a form used only in Portugal (the older dictionary's "comboio", "facto"); and how many were dropped
    for what."""
    return extra.train_pairs(found, "freedict", held)


def add_arguments(p: argparse.ArgumentParser) -> None:
    extra.add_arguments(p, Path("data/dict-freedict"))


def main(args: argparse.Namespace) -> int:
    """Write the dictionaries' pairs; returns a process exit status."""
    work, out = args.work.resolve(), args.out.resolve()
    env = apt.prepare(work / "apt")
    found: list[tuple[str, str, str]] = []
    versions = []
    for package, lang in PACKAGES.items():
        deb = apt.download(env, package)
        if deb is None:
            log.error("could not download %s", package)
            return 1
        index, data = read_dictionary(apt.extract(deb, work / "extract" / package), package)
        found.extend((en, pt, package) for en, pt in word_pairs(index, data, lang))
        versions.append(f"Debian package {package} {deb_version(deb)}")
    kept, stats = dictionary_pairs(found, held_out_keys(args.held_out))
    extra.write_train(out, kept, "Tolk dictionary pairs: sources\n\n"
                      f"freedict: the headwords and translations of FreeDict's English-Portuguese and "
                      f"Portuguese-English dictionaries, {', '.join(versions)}, {LICENCE}. Human translations.\n",
                      {"freedict": {"senses": len(found), "kept": len(kept), "rejected": stats}})
    log.info("wrote %s: %d pairs (%s)", out, len(kept), stats)
    return 0
