"""Does holding admissions back help? The offline engine, admitting only when at least G rows are free.

TGI waits until several requests queue before it admits them (its waiting-served ratio), so that the prefill runs
in bigger batches. This times Tolk's engine (DecodeBatch, continuous batching) with that rule for several G on
real sentences, and the share of time spent admitting (encoding). Prints a table and writes JSON. Never run by
the test suite.

    python bench/admission.py --model weights/en-pt --sentences data/corpus/test.en
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model.checkpoint import LoadedModel, load  # noqa: E402
from model.decode import DecodeBatch  # noqa: E402
from model.events import FinishEvent  # noqa: E402
from model.search import step  # noqa: E402


def run(loaded: LoadedModel, sources: list[list[int]], group: int, rows: int, max_new_tokens: int) -> dict[str, float]:
    config = loaded.generation.update(max_new_tokens=max_new_tokens)
    batch = DecodeBatch(loaded.net, rows, max(len(s) for s in sources), max_new_tokens)
    waiting = list(range(len(sources)))
    tokens, admitting = 0, 0.0
    start = time.perf_counter()
    while waiting or len(batch):
        free = batch.free_rows
        if not len(batch) or (waiting and free >= min(group, len(waiting))):
            admit = waiting[:free]
            del waiting[:free]
            t = time.perf_counter()
            batch.admit([((0, i), sources[i], config) for i in admit])
            admitting += time.perf_counter() - t
        for event in step(batch):
            if isinstance(event, FinishEvent):
                tokens += len(event.hypotheses[0].tokens)
    elapsed = time.perf_counter() - start
    return {"group": group, "sentences_per_s": len(sources) / elapsed, "tokens_per_s": tokens / elapsed,
            "admit_share": admitting / elapsed}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=ROOT / "weights" / "en-pt")
    p.add_argument("--sentences", type=Path, default=ROOT / "data" / "corpus" / "test.en")
    p.add_argument("--dtype", default="int8")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--count", type=int, default=256)
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--groups", type=int, nargs="+", default=[1, 4, 8, 16])
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "admission.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load(args.model, device="cpu", dtype=args.dtype)
    lines = args.sentences.read_text(encoding="utf-8").splitlines()[: args.count]
    sources = [loaded.tokenizer.encode(s) for s in lines]
    run(loaded, sources, 1, args.rows, args.max_new_tokens)  # warm-up
    results = []
    print(f"{'pass':>4} {'G':>3} {'sent/s':>8} {'tok/s':>8} {'admitting':>9}")
    for n in range(args.passes):
        for group in args.groups:
            r = {"pass": n, **run(loaded, sources, group, args.rows, args.max_new_tokens)}
            results.append(r)
            print(f"{n:>4} {group:>3} {r['sentences_per_s']:8.1f} {r['tokens_per_s']:8.1f} {r['admit_share']:9.0%}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": str(args.model), "dtype": args.dtype, "threads": args.threads,
                                    "rows": args.rows, "results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
