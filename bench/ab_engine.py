"""The offline engine (model.search.generate) of this checkout against an earlier revision, paired, in turns.

On a shared 2-core machine one run of the same code moves by 10-30% from the next, so two benchmarks made one after
the other cannot show a change of 10%. Here each round runs both trees, one process each (the order alternating
between rounds), on the same sentences and settings; the report is each tree's median and the median of the
rounds' ratios head / base. The earlier revision is checked out into a git worktree and runs with this checkout's
virtual environment (its numba cache is warmed by a first, untimed run of each tree). Prints a table and writes
JSON. Never run by the test suite.

    python bench/ab_engine.py --base HEAD~1 [--configs float32:1:4,int8:8:4] [--rounds 6] [-n 100] [--threads 2]

A config is dtype:batch:beam (batch: sentences decoded together, as `bench/engines.py`'s batches).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from int8_products import cpu_flags

ROOT = Path(__file__).resolve().parents[1]

# One timed run in a fresh process: prints "seconds tokens". argv: tree, model, sentences, n, threads, dtype, batch,
# beam. The server's process settings before torch loads (model/runtime.py; a tree from before it made them when
# `model` was imported).
RUN = """
import sys, time
sys.path.insert(0, sys.argv[1])
import model
try:
    from model import runtime
    runtime.configure()
except ImportError:
    pass
import torch
from pathlib import Path
from model import checkpoint
from model.generation import GenerationConfig
from model.search import generate
_, _, model_dir, sentences, n, threads, dtype, batch, beam = sys.argv
n, batch, beam = int(n), int(batch), int(beam)
torch.set_num_threads(int(threads))
loaded = checkpoint.load(Path(model_dir), dtype=dtype, keep_modules=False)
ids = [loaded.tokenizer.encode(line)[:250] for line in Path(sentences).read_text().splitlines()[:n]]
config = GenerationConfig(beam_size=beam, scores=False)
def run():
    out = []
    for i in range(0, len(ids), batch):
        out += generate(loaded.net, ids[i:i + batch], config, max_rows=batch * beam)
    return out
run()  # warm-up: numba's cache, the allocator, the helper threads
start = time.perf_counter()
out = run()
print(time.perf_counter() - start, sum(len(h[0].tokens) for h in out))
"""


def timed(tree: Path, args: argparse.Namespace, dtype: str, batch: int, beam: int) -> float:
    """Generated tokens per second of one run of `tree`."""
    cmd = [sys.executable, "-c", RUN, str(tree), str(args.model.resolve()), str(args.sentences.resolve()), str(args.n),
           str(args.threads), dtype, str(batch), str(beam)]
    seconds, tokens = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split()[-2:]
    return int(tokens) / float(seconds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the earlier revision (any git revision)")
    p.add_argument("--configs", default="float32:1:4,int8:1:4,float32:8:4,int8:8:4", help="dtype:batch:beam,...")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("-n", type=int, default=100, help="sentences per run")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", type=Path, default=ROOT / "weights/en-pt")
    p.add_argument("--sentences", type=Path, default=ROOT / "data/corpus/test.en")
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/ab-engine.json")
    args = p.parse_args()
    configs = [(d, int(b), int(k)) for d, b, k in (c.split(":") for c in args.configs.split(","))]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as work:
        base = Path(work) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.base], check=True,
                       capture_output=True)
        try:
            revision = subprocess.run(["git", "-C", str(base), "rev-parse", "--short", "HEAD"], check=True,
                                      capture_output=True, text=True).stdout.strip()
            trees = {"base": base, "head": ROOT}
            for dtype, batch, beam in configs:
                speeds: dict[str, list[float]] = {"base": [], "head": []}
                for r in range(args.rounds + 1):  # round 0 warms both trees' numba caches, untimed
                    for name in ("base", "head") if r % 2 else ("head", "base"):
                        speed = timed(trees[name], args, dtype, batch, beam)
                        if r:
                            speeds[name].append(speed)
                ratios = [h / b for h, b in zip(speeds["head"], speeds["base"], strict=True)]
                rows.append({"dtype": dtype, "batch": batch, "beam": beam, "base_tokens_per_s": speeds["base"],
                             "head_tokens_per_s": speeds["head"], "ratios": [round(x, 3) for x in ratios],
                             "median_ratio": round(statistics.median(ratios), 3)})
                print(f"{dtype} batch {batch} beam {beam}: base {statistics.median(speeds['base']):.1f}, head "
                      f"{statistics.median(speeds['head']):.1f} tokens/s, head / base {statistics.median(ratios):.3f}"
                      f" (rounds {', '.join(f'{x:.2f}' for x in ratios)})", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False,
                           capture_output=True)
    print("\n| precision | batch | beam | base tokens/s | head tokens/s | head / base (median of rounds) |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['dtype']} | {row['batch']} | {row['beam']} | {statistics.median(row['base_tokens_per_s']):.1f} "
              f"| {statistics.median(row['head_tokens_per_s']):.1f} | {row['median_ratio']:.3f} |")
    meta = {"base": revision, "rounds": args.rounds, "sentences": args.n, "threads": args.threads,
            "cpu_flags": cpu_flags(), "date": time.strftime("%Y-%m-%d %H:%M")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
