"""The offline engine with torch imported before and after the server's process settings, in fresh processes,
alternating.

libgomp reads GOMP_SPINCOUNT once, when torch loads it; `model.runtime.configure` sets 10,000 (as the server does
at start), which holds only if torch is not loaded yet. Each round runs two child processes with GOMP_SPINCOUNT
unset: one imports torch first (libgomp's default, 300,000: torch's threads spin after each parallel region), the
other makes the settings first. Each decodes the same
test sentences one at a time (float32, greedy, no scores, as `bench/engines.py`'s Tolk worker), after an untimed
pass. Prints a table and writes JSON. Never run by the test suite.

    python bench/import_order.py [--model weights/en-pt] [-n 400] [--threads 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from int8_products import cpu_flags

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import sys, time
import warnings
warnings.simplefilter("ignore")  # the torch-first child's warning is what it measures
if sys.argv[1] == "torch-first":
    import torch
    from model import runtime
    runtime.configure()
else:
    from model import runtime
    runtime.configure()
    import torch
from model import checkpoint
from model.generation import GenerationConfig
from model.search import generate
torch.set_num_threads(int(sys.argv[3]))
loaded = checkpoint.load(sys.argv[2], device="cpu", dtype="float32", keep_modules=False)
lines = open(sys.argv[4], encoding="utf-8").read().splitlines()[: int(sys.argv[5])]
sources = [loaded.tokenizer.encode(s) for s in lines]
config = GenerationConfig(beam_size=1, scores=False, max_new_tokens=256)

def run():
    tokens = 0
    with torch.inference_mode():
        for s in sources:
            tokens += len(generate(loaded.net, [s], config, max_rows=1)[0][0].tokens)
    return tokens

run()
start = time.perf_counter()
tokens = run()
print(tokens / (time.perf_counter() - start))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=ROOT / "weights" / "en-pt")
    p.add_argument("--sentences", type=Path, default=ROOT / "data" / "corpus" / "test.en")
    p.add_argument("-n", type=int, default=400)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "import-order.json")
    args = p.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    orders = ("torch-first", "model-first")
    speeds: dict[str, list[float]] = {o: [] for o in orders}
    for r in range(args.rounds):
        for order in orders if r % 2 == 0 else orders[::-1]:
            out = subprocess.run([sys.executable, "-c", CHILD, order, str(args.model), str(args.threads),
                                  str(args.sentences), str(args.n)], capture_output=True, text=True, check=True,
                                 cwd=ROOT, env=env).stdout
            speeds[order].append(float(out.split()[-1]))
            print(f"round {r}: {order} {speeds[order][-1]:.1f} tokens/s", flush=True)
    medians = {o: statistics.median(v) for o, v in speeds.items()}
    print(f"\n| import order | tokens/s (median of {args.rounds}) |\n|---|---:|")
    for o in orders:
        print(f"| {o} | {medians[o]:.1f} |")
    print(f"model first / torch first: {medians['model-first'] / medians['torch-first']:.2f}x")
    args.out.write_text(json.dumps({"cpu_flags": cpu_flags(), "threads": args.threads, "sentences": args.n,
                                    "model": str(args.model), "tokens_per_s": speeds, "median": medians}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
