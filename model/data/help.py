"""`tolk data help`: the GNOME help pairs that the corpus's train split holds, written as a folder of their own.

GNOME's user help (the `mallard` source) is the corpus's only prose, and the fine-tuning mixes repeat it
(`python -m model.data.mix --out ... data/corpus data/help:9`). A pair belongs here when the source's raw pairs
(`data/work/pairs/mallard.tsv`, as `tolk data build` left them) have it and train has it, the same English and
the same Portuguese: held-out, rejected and deduplicated pairs are not in train, so they are not here either.
The pairs keep train's order.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterable
from pathlib import Path

from . import extra
from .pairs import Pair, pairs_path, read_pairs

log = logging.getLogger(__name__)

SOURCE = "mallard"


def help_pairs(train: Iterable[tuple[str, str]], raw: Iterable[Pair]) -> list[Pair]:
    """The (English, Portuguese) pairs of `train` that `raw` has too, in train's order, each once."""
    packages = {(p.en, p.pt): p.package for p in raw}
    kept: list[Pair] = []
    for en, pt in train:
        package = packages.pop((en, pt), None)
        if package is not None:
            kept.append(Pair(en, pt, SOURCE, package))
    return kept


def read_train(corpus: Path) -> list[tuple[str, str]]:
    """The corpus's train split as (English, Portuguese) pairs."""
    en, pt = ((corpus / f"train.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("en", "pt"))
    if len(en) != len(pt):
        raise ValueError(f"{corpus}: train.en has {len(en)} lines, train.pt {len(pt)}")
    return list(zip(en, pt, strict=True))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("data/help"))
    p.add_argument("--corpus", type=Path, default=Path("data/corpus"), help="what `tolk data build` wrote")
    p.add_argument("--work", type=Path, default=Path("data/work"), help="its working folder (pairs/mallard.tsv)")


def main(args: argparse.Namespace) -> int:
    """Write the help pairs; returns a process exit status."""
    raw_path = pairs_path(args.work, SOURCE)
    if not raw_path.is_file() or not (args.corpus / "train.en").is_file():
        log.error("needs %s and %s/train.{en,pt}: run `tolk data build` first", raw_path, args.corpus)
        return 1
    try:
        train = read_train(args.corpus)
    except ValueError as exc:
        log.error("%s", exc)
        return 1
    raw = list(read_pairs(raw_path, SOURCE))
    kept = help_pairs(train, raw)
    packages = sorted({p.package for p in kept})
    extra.write_train(args.out, kept, "Tolk help pairs: sources\n\n"
                      f"mallard: GNOME's user help, the pairs of {args.corpus}'s train split from the packages "
                      f"{', '.join(packages)}; their licences are in {args.corpus}/NOTICE, [mallard].\n",
                      {SOURCE: {"raw": len(raw), "in_train": len(kept), "packages": packages}})
    log.info("wrote %s: %d of %d raw help pairs are in train", args.out, len(kept), len(raw))
    return 0
