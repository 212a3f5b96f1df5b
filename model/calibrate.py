"""Fixed input ranges for int8 products, measured on real sentences, so that a row's translation is its own.

fbgemm's dynamic int8 product scales its input by the largest value of the whole call, so the rounding of one
sentence depends on the other sentences of its batch: the same request can come back translated differently
depending on traffic. With a fixed range per product, measured once here by translating sentences in float32 and
stored beside the weights (`int8.json`), every row is quantized alone, at the same speed (docs/benchmarks.md, "int8
with fixed input ranges"). `checkpoint.load(..., dtype="int8")` applies the file when the model directory has one;
without it, int8 stays dynamic.

    python -m model.calibrate MODEL_DIR SENTENCES.txt [--limit 1000]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch

from model.frozen import FrozenTransformer
from model.generation import GenerationConfig
from model.search import generate

RANGES_FILE = "int8.json"


def measure(net: FrozenTransformer, sources: list[list[int]], config: GenerationConfig) -> dict[str, list[float]]:
    """The smallest and largest input of every product while `net` translates the sources."""
    projections = net.projections()
    for p in projections.values():
        p.observed = torch.full((2,), math.inf)
    net.products_changed()
    try:
        generate(net, sources, config)
        return {name: [float(p.observed[0]), -float(p.observed[1])]
                for name, p in projections.items() if p.observed is not None}
    finally:
        for p in projections.values():
            p.observed = None
        net.products_changed()


def apply(net: FrozenTransformer, ranges: dict[str, list[float]]) -> None:
    """Give every int8 product of `net` its fixed input range; the names must be exactly `net`'s products."""
    projections = net.projections()
    if set(ranges) != set(projections):
        missing, extra = sorted(set(projections) - set(ranges)), sorted(set(ranges) - set(projections))
        raise ValueError(f"int8 ranges do not fit this network: missing {missing}, unknown {extra}")
    for name, (lo, hi) in ranges.items():
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise ValueError(f"int8 range of {name} is not a finite interval: {[lo, hi]}")
        projections[name].set_range(lo, hi)
    net.products_changed()


def read(directory: Path) -> dict[str, list[float]] | None:
    path = directory / RANGES_FILE
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return {str(k): [float(lo), float(hi)] for k, (lo, hi) in data["ranges"].items()}


def main() -> None:
    from model import checkpoint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="model directory; int8.json is written into it")
    parser.add_argument("sentences", type=Path, help="source-language text, one sentence per line")
    parser.add_argument("--limit", type=int, default=1000, help="sentences to translate (default 1000)")
    args = parser.parse_args()
    lm = checkpoint.load(args.model, device="cpu", dtype="float32")
    lines = [line.strip() for line in args.sentences.read_text().splitlines() if line.strip()][: args.limit]
    ranges = measure(lm.net, [lm.tokenizer.encode(line) for line in lines], lm.generation)
    out = {"sentences": len(lines), "from": args.sentences.name, "ranges": ranges}
    (args.model / RANGES_FILE).write_text(json.dumps(out, indent=1) + "\n")
    print(f"{args.model / RANGES_FILE}: ranges of {len(ranges)} products from {len(lines)} sentences")


if __name__ == "__main__":
    main()
