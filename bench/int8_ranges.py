"""int8 with fixed input ranges (int8.json, model/calibrate.py) against dynamic int8 and float32, on the test split.

For each shipped direction: BLEU and chrF of greedy decoding, the share of sentences whose tokens equal float32's,
and offline speed (sentences/s, 32 rows, one thread, the precisions in turn, best of two passes). Then whether a
sentence's translation depends on its batch: the first N sentences translated one at a time, and again inside
batches of 32 in three shuffled orders of a larger set; counted are the (sentence, order) pairs whose tokens differ
from the sentence alone. Prints a table and writes bench/results/int8-ranges.json.

    python bench/int8_ranges.py [--limit 2000] [--alone 64]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import sacrebleu
import torch

from model import checkpoint
from model.search import generate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from int8_products import cpu_flags  # noqa: E402

PAIRS = {"en-pt": ("test.en", "test.pt"), "pt-en": ("test.pt", "test.en")}
VARIANTS = {"float32": ("float32", "auto"), "int8 dynamic": ("int8", "dynamic"),
            "int8 fixed ranges": ("int8", "ranges"), "int8 per row": ("int8", "rows")}


def tokens(lm: checkpoint.LoadedModel, sources: list[list[int]]) -> list[list[int]]:
    return [hyps[0].tokens for hyps in generate(lm.net, sources, lm.generation, max_rows=32)]


def batch_changes(lm: checkpoint.LoadedModel, sources: list[list[int]], alone_n: int, orders: int = 3) -> int:
    """Pairs (one of the first alone_n sentences, a shuffled order) whose tokens differ from the sentence alone."""
    alone = [tokens(lm, [s])[0] for s in sources[:alone_n]]
    changed = 0
    for seed in range(orders):
        order = list(range(len(sources)))
        random.Random(seed).shuffle(order)
        out = tokens(lm, [sources[i] for i in order])
        by_index = dict(zip(order, out, strict=True))
        changed += sum(by_index[i] != alone[i] for i in range(alone_n))
    return changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=ROOT / "data" / "corpus")
    parser.add_argument("--limit", type=int, default=2000)
    parser.add_argument("--alone", type=int, default=64, help="sentences checked alone against in batches")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "int8-ranges.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = []
    print("| model | precision | BLEU | chrF | tokens = float32 | sent/s (32 rows) | changed by batch |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for pair, (src_name, ref_name) in PAIRS.items():
        src = (args.corpus / src_name).read_text().splitlines()[: args.limit]
        ref = (args.corpus / ref_name).read_text().splitlines()[: args.limit]
        models = {name: checkpoint.load(ROOT / "weights" / pair, device="cpu", dtype=dtype, int8=arithmetic)
                  for name, (dtype, arithmetic) in VARIANTS.items()}
        sources = [models["float32"].tokenizer.encode(s) for s in src]
        speed: dict[str, float] = {}
        out: dict[str, list[list[int]]] = {}
        for _ in range(2):  # the precisions in turn, twice; the faster pass counts
            for name, lm in models.items():
                start = time.perf_counter()
                out[name] = tokens(lm, sources)
                speed[name] = max(speed.get(name, 0.0), len(sources) / (time.perf_counter() - start))
        for name, lm in models.items():
            text = [lm.tokenizer.decode(t) for t in out[name]]
            row = {"model": pair, "precision": name, "sentences": len(src),
                   "bleu": sacrebleu.corpus_bleu(text, [ref]).score, "chrf": sacrebleu.corpus_chrf(text, [ref]).score,
                   "same_as_float32": sum(a == b for a, b in zip(out[name], out["float32"], strict=True)) / len(src),
                   "sentences_per_s": speed[name],
                   "changed_by_batch": batch_changes(lm, sources[: 4 * args.alone], args.alone),
                   "checked_by_batch": 3 * args.alone}
            results.append(row)
            print(f"| {pair} | {name} | {row['bleu']:.2f} | {row['chrf']:.2f} | {row['same_as_float32']:.1%} | "
                  f"{row['sentences_per_s']:.1f} | {row['changed_by_batch']} of {row['checked_by_batch']} |",
                  flush=True)
    args.out.write_text(json.dumps({"torch": torch.__version__, "threads": 1, "cpu_flags": cpu_flags(),
                                    "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
