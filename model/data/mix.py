"""A fine-tuning corpus mixed from several: each folder's train pairs, some repeated, shuffled; the first one's dev.

    python -m model.data.mix --out data/finetune-distill data/finetune-prose data/distill:2

`DIR:N` repeats DIR's `train.en`/`train.pt` N times (default 1). The dev split is the first folder's, so that a
fine-tune is checked on the same sentences as the model it starts from.
"""

from __future__ import annotations

import argparse
import random
import shutil
from pathlib import Path


def parse_part(text: str) -> tuple[Path, int]:
    folder, sep, times = text.rpartition(":")
    return (Path(folder), int(times)) if sep and times.isdigit() else (Path(text), 1)


def mix(parts: list[tuple[Path, int]], out: Path, seed: int, languages: tuple[str, str] = ("en", "pt")) -> int:
    pairs: list[tuple[str, str]] = []
    for folder, times in parts:
        src, tgt = (folder / f"train.{lang}" for lang in languages)
        lines = list(zip(src.read_text(encoding="utf-8").splitlines(), tgt.read_text(encoding="utf-8").splitlines(),
                         strict=True))
        pairs.extend(lines * times)
    random.Random(seed).shuffle(pairs)
    out.mkdir(parents=True, exist_ok=True)
    for column, lang in enumerate(languages):
        (out / f"train.{lang}").write_text("".join(p[column] + "\n" for p in pairs), encoding="utf-8")
        shutil.copyfile(parts[0][0] / f"dev.{lang}", out / f"dev.{lang}")
    return len(pairs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("parts", nargs="+", metavar="DIR[:N]")
    args = p.parse_args()
    print(f"wrote {args.out}: {mix([parse_part(x) for x in args.parts], args.out, args.seed)} training pairs")


if __name__ == "__main__":
    main()
