"""The :class:`Pair` record and the per-source TSV files under the work dir.

Each source step writes ``<work>/pairs/<source>.tsv`` (package, English,
Portuguese; whitespace already collapsed) so steps can be re-run or skipped
independently.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .clean import collapse_ws, normalize


@dataclass(frozen=True)
class Pair:
    """One aligned segment pair and where it came from."""

    en: str
    pt: str
    source: str
    package: str


def unique_pairs(source: str,
                 packages: Iterable[tuple[str, Iterable[tuple[str, str]]]]) -> tuple[list[Pair], list[str]]:
    """Documentation pairs, package by package: normalised (no markup or accelerators to strip in such text), each
    (English, Portuguese) once, untranslated ones left out; and the packages that gave any."""
    out: list[Pair] = []
    used: list[str] = []
    seen: set[tuple[str, str]] = set()
    for package, raw in packages:
        before = len(out)
        for en_raw, pt_raw in raw:
            en = normalize(en_raw, markup=False, accelerators=False)
            pt = normalize(pt_raw, markup=False, accelerators=False)
            if en and pt and en != pt and (en, pt) not in seen:
                seen.add((en, pt))
                out.append(Pair(en, pt, source, package))
        if len(out) > before:
            used.append(package)
    return out, used


def pairs_path(work: Path, source: str) -> Path:
    """Location of the raw pair file for ``source``."""
    return work / "pairs" / f"{source}.tsv"


def write_pairs(path: Path, pairs: Iterable[Pair]) -> int:
    """Write pairs atomically as TSV; returns the number written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    count = 0
    with tmp.open("w", encoding="utf-8") as out:
        for pair in pairs:
            en, pt = collapse_ws(pair.en), collapse_ws(pair.pt)
            if en and pt:
                out.write(f"{pair.package}\t{en}\t{pt}\n")
                count += 1
    tmp.replace(path)
    return count


def read_pairs(path: Path, source: str) -> Iterator[Pair]:
    """Read a TSV written by :func:`write_pairs`."""
    with path.open(encoding="utf-8") as inp:
        for line in inp:
            package, en, pt = line.rstrip("\n").split("\t")
            yield Pair(en, pt, source, package)
