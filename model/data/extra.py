"""Human translations found outside the corpus's sources, written as a train split only: a dictionary's word pairs
(`tolk data dictionary`), children's software (`tolk data edu`).

They are cleaned as the corpus is (`build.clean_pairs`), each (English, Portuguese) kept once. A pair with a side
that matches a held-out sentence (`distill.HELD_OUT`: the corpus's dev, test and prose splits and the everyday
sentences) is dropped, as `tolk data distill` drops it, and so is a Portuguese side in a form used only in Portugal
(`variety.brazilian_only`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

from . import build
from .clean import MAX_TOKENS, normalize
from .distill import HELD_OUT
from .pairs import Pair
from .split import source_key
from .variety import brazilian_only


def add_arguments(p: argparse.ArgumentParser, out: Path) -> None:
    """The options such a recipe takes: where to write, where to download, what is held out."""
    p.add_argument("--out", type=Path, default=out)
    p.add_argument("--work", type=Path, default=Path("data/work"), help="downloads and extracted packages")
    p.add_argument("--held-out", type=Path, nargs="*", default=[Path(p) for p in HELD_OUT],
                   help="files (either language) whose sentences must not be trained on (missing files are skipped)")


def train_pairs(found: Iterable[tuple[str, str, str]], source: str, held: set[str], *,
                markup: bool = False, accelerators: bool = False) -> tuple[list[Pair], dict[str, int]]:
    """(English, Portuguese, package) triples as cleaned pairs of `source`, each once; and how many were dropped for
    what. `markup` and `accelerators`: strip them, as from user-interface text."""
    seen: set[tuple[str, str]] = set()
    pairs: list[Pair] = []
    dropped = 0
    for en_raw, pt_raw, package in found:
        en = normalize(en_raw, markup=markup, accelerators=accelerators)
        pt = normalize(pt_raw, markup=markup, accelerators=accelerators)
        if (en, pt) in seen:
            continue
        seen.add((en, pt))
        if source_key(en) in held or source_key(pt) in held:
            dropped += 1
            continue
        pairs.append(Pair(en, pt, source, package))
    kept, reasons = build.clean_pairs(pairs, MAX_TOKENS)
    kept = brazilian_only(kept, reasons)
    return kept, {"held_out_dropped": dropped, **reasons}


def write_train(out: Path, kept: list[Pair], notice: str, stats: dict[str, object]) -> None:
    """`train.en`, `train.pt`, `NOTICE` and `stats.json` in `out`."""
    build.write_splits(out, {"train": kept})
    (out / "NOTICE").write_text(notice, encoding="utf-8")
    (out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
