"""How long numba's JIT takes to compile the CPU kernels from an empty cache: a process's first translations.

A process that finds no compiled kernels (no `tolk build-kernels` extension, numba's cache empty: a fresh CI
machine, a new container) compiles every kernel it calls the first time it calls it. That time is most of a cold
test run (the suite took 18:46 with numba's cache empty and 8:31 with it full on the 2-core Intel Xeon) and of a
server's first start without kernels compiled ahead. Each trial is a child process with an empty cache of its own
(`NUMBA_CACHE_DIR`) and `TOLK_KERNELS=jit`: it makes the suite's tiny model, loads it in one precision and
translates two sentences with one search, timed from before the load to the end of the translation.

    python bench/compile_time.py [--trees DIR ...] [--configs float32:1 int8:1 float32:4] [--repeats 3]

`--trees` compares source trees (two checkouts), trial by trial in turn, so that both share the machine's state;
the table gives each tree's median and its ratio to the first tree's. `--events N` also prints, per trial, the N
functions whose compiling took longest by numba's compile events (`numba.core.event`): each function's own time,
without the functions it compiled on the way, and its time with them.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def worker(dtype: str, beam: int, events: int) -> None:
    import dataclasses

    import torch
    from numba.core import event

    import model
    from model import checkpoint
    from model.search import generate
    from tests.tiny import make_model_dir

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        directory = make_model_dir(Path(tmp) / "tiny")
        with event.install_recorder("numba:compile") as recorder:
            start = time.perf_counter()
            loaded = checkpoint.load(directory, device="cpu", dtype=dtype)
            config = dataclasses.replace(loaded.generation, beam_size=beam, max_new_tokens=8)
            generate(loaded.net, [[5, 6, 7, 8], [9, 10]], config, max_rows=4 * beam)
            seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "model": str(Path(model.__file__).parent),
                      "events": compile_events(recorder.buffer, events)}))


def compile_events(buffer: list[tuple[float, Any]], n: int) -> list[dict[str, Any]]:
    """The n functions whose compiling took longest by their own time: (name, own s, with callees s, compiles)."""
    total: collections.Counter[str] = collections.Counter()
    inner: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    stack: list[tuple[str, float]] = []
    for stamp, ev in buffer:
        name = ev.data["dispatcher"].py_func.__qualname__
        if ev.is_start:
            stack.append((name, stamp))
            continue
        name, began = stack.pop()
        total[name] += stamp - began
        count[name] += 1
        if stack:
            inner[stack[-1][0]] += stamp - began
    own = {name: total[name] - inner[name] for name in total}
    top = sorted(own, key=own.__getitem__, reverse=True)[:n]
    return [{"function": k, "own_s": round(own[k], 2), "with_callees_s": round(total[k], 2), "compiles": count[k]}
            for k in top]


def trial(tree: Path, dtype: str, beam: int, events: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache, "TOLK_KERNELS": "jit", "PYTHONPATH": str(tree)}
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", dtype, str(beam),
                              str(events)], cwd=tree, env=env, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if Path(result["model"]).resolve() != (tree / "model").resolve():
        raise SystemExit(f"the trial in {tree} imported {result['model']}")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", nargs="+", type=Path, default=[ROOT], help="source trees to compare (default: this one)")
    p.add_argument("--configs", nargs="+", default=["float32:1", "int8:1", "float32:4"],
                   help="PRECISION:BEAMS, each timed in its own process")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--events", type=int, default=0, help="print the N longest compiles of each trial")
    p.add_argument("--worker", nargs=3, metavar=("DTYPE", "BEAM", "EVENTS"), help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "compile-time.json")
    args = p.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), int(args.worker[2]))
        return
    trees = [t.resolve() for t in args.trees]
    times: dict[str, dict[str, list[float]]] = {c: {str(t): [] for t in trees} for c in args.configs}
    events: dict[str, dict[str, list[Any]]] = {c: {str(t): [] for t in trees} for c in args.configs}
    for r in range(args.repeats):
        for config in args.configs:
            dtype, beam = config.split(":")
            for tree in trees:
                result = trial(tree, dtype, int(beam), args.events)
                times[config][str(tree)].append(result["seconds"])
                print(f"repeat {r + 1} {config:>10} {tree}: {result['seconds']:.1f} s", flush=True)
                for e in result["events"]:
                    print(f"    {e['own_s']:6.2f} s own, {e['with_callees_s']:6.2f} s with callees, "
                          f"x{e['compiles']} {e['function']}")
                if args.events:
                    events[config][str(tree)].append(result["events"])
    rows = []
    print(f"\n{'config':>10} " + " ".join(f"{t.name:>16}" for t in trees) + "   ratio to the first")
    for config in args.configs:
        medians = [statistics.median(times[config][str(t)]) for t in trees]
        ratios = [m / medians[0] for m in medians]
        print(f"{config:>10} " + " ".join(f"{m:15.1f}s" for m in medians) + "   "
              + " ".join(f"{x:.3f}" for x in ratios))
        rows.append({"config": config, "median_s": dict(zip(map(str, trees), medians, strict=True)),
                     "ratio_to_first": ratios, "seconds": times[config],
                     **({"events": events[config]} if args.events else {})})
    from engines import cpu_name
    from int8_products import cpu_flags

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"cpu": cpu_name(), "cpu_flags": cpu_flags(), "cores": os.cpu_count(),
                                    "date": time.strftime("%Y-%m-%d %H:%M"), "repeats": args.repeats,
                                    "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
