"""The resident memory of a CPU `tolk train` run, with and without handing the C allocator's free pages back to
the system every few steps (`model.train.release_freed_memory`). Never run by the tests.

Each mode is its own process (`--mode`, started by this script unless given): `tolk train`'s own Trainer from the
model's weights on the corpus's real token-bucketed batches, `-n` optimizer steps, the process's resident set read
from /proc after every step. Both run at once, one thread each (their memory does not depend on each other; their
speed does, and is not the point). Prints a table, writes JSON.

    python bench/train_memory.py [--corpus data/corpus] [--model weights/en-pt] [-n 200]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model import checkpoint, train  # noqa: E402  (model before torch: OpenMP's spin setting)
from model.buckets import make_batches  # noqa: E402

MODES = ("trim", "no-trim")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_mode(args: argparse.Namespace) -> None:
    """One mode's run in this process; prints one JSON line: the resident MB after each step."""
    import torch

    torch.set_num_threads(1)
    if args.mode == "no-trim":
        train.release_freed_memory = lambda device: None
    with tempfile.TemporaryDirectory() as run:
        parser = argparse.ArgumentParser()
        train.add_arguments(parser)
        targs = parser.parse_args(["--corpus", str(args.corpus), "--run", run, "--init", str(args.model),
                                   "--device", "cpu", "--threads", "1"])
        cfg = replace(checkpoint.read_meta(args.model).cfg, dropout=targs.dropout)
        trainer = train.Trainer(targs, cfg, train.model_vocabularies(args.model), ("en", "pt"))
        trainer.model.train()
        batches = make_batches(trainer.src, trainer.tgt, targs.max_tokens, targs.max_len, 3)
        after = [rss_mb()]
        for step in range(1, args.n + 1):  # `Trainer.run`'s own step, the trim included
            trainer.train_step(batches[(step - 1) * targs.accum: step * targs.accum])
            after.append(rss_mb())
    print(json.dumps({"mode": args.mode, "rss_mb": after}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", type=Path, default=ROOT / "data/corpus")
    p.add_argument("--model", type=Path, default=ROOT / "weights/en-pt")
    p.add_argument("-n", type=int, default=200, help="optimizer steps per mode")
    p.add_argument("--mode", choices=MODES, default=None, help="run one mode in this process")
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/train-memory-cpu.json")
    args = p.parse_args()
    if args.mode:
        run_mode(args)
        return
    from engines import cpu_name
    from int8_products import cpu_flags

    base = [sys.executable, __file__, "--corpus", str(args.corpus), "--model", str(args.model), "-n", str(args.n)]
    procs = {m: subprocess.Popen([*base, "--mode", m], stdout=subprocess.PIPE, text=True) for m in MODES}
    runs = {}
    for m, proc in procs.items():
        out, _ = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"{m} failed ({proc.returncode})")
        runs[m] = json.loads(out.strip().splitlines()[-1])["rss_mb"]
    marks = [s for s in (1, 10, 50, 100, 200, 400, args.n) if s <= args.n]
    marks = sorted(set(marks))
    print(f"resident MB after N optimizer steps of two 4,096-token micro-batches, {args.model.name} geometry, "
          f"one thread, {cpu_name()}")
    print(f"{'mode':8} " + " ".join(f"{s:>7}" for s in marks) + f" {'max':>7}")
    for m in MODES:
        print(f"{m:8} " + " ".join(f"{runs[m][s]:7.0f}" for s in marks) + f" {max(runs[m]):7.0f}")
    result = {"model": args.model.name, "corpus": str(args.corpus.name), "steps": args.n, "cpu": cpu_name(),
              "cpu_flags": cpu_flags(),
              "trim_every": train.TRIM_EVERY, "rss_mb_after_step": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
