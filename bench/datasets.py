"""Throughput of `tolk translate-dataset`: one process and Ray with 1 and 2 actors, against `tolk translate` on the
same rows, at several sizes; and a paper estimate of a cluster of N such nodes. Never run by the test suite.

Rows are one to three sentences of the corpus (data/corpus/train.en, made by `tolk data build`; a built-in list
without it), a share of them repeating earlier rows as real datasets do (`--repeat`). Each system runs as a process
of its own, in turn: `tolk translate` (its time less its start, measured on one line), the job here with 2 and 1
threads, and the job on a Ray cluster of this machine's CPUs, started here once, with 1 actor of 2 threads, 2 actors
of 1 thread, and 1 of 1. A job's time is what its report gives: from its engine loaded (here) or from Ray joined
(on Ray: the actors' start included) to its last part written; `translating` counts from the first engine ready
(on Ray: the first actor's model loaded), as `tolk translate`'s time less its start does.
Prints a table and writes JSON (bench/results/datasets.json).

    python bench/datasets.py                                   # weights/en-pt, int8, 10k and 100k rows
    python bench/datasets.py --rows 2000 --systems job-2 ray-2x1   # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
TOLK = [sys.executable, "-c", "import sys; from server.cli import main; sys.exit(main(sys.argv[1:]))"]
# name -> (Ray actors or None for one process, threads)
SYSTEMS: dict[str, tuple[int | None, int]] = {
    "job-2": (None, 2), "job-1": (None, 1), "ray-1x2": (1, 2), "ray-2x1": (2, 1), "ray-1x1": (1, 1),
}
FALLBACK = ["Open the file.", "Save your changes before closing the window.", "The meeting starts at nine.",
            "Click here to continue.", "This page could not be found.", "Select all the files you want to copy."]
HEAD = """
import signal, sys, time, ray
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
ray.init(num_cpus=int(sys.argv[2]), include_dashboard=False, _temp_dir=sys.argv[1])
print(ray.get_runtime_context().gcs_address, flush=True)
while True:
    time.sleep(1)
"""


def make_rows(n: int, sentences: Path, repeat: float, seed: int = 0) -> list[str]:
    """n rows of 1 to 3 sentences, a share `repeat` of them copies of earlier rows."""
    rng = random.Random(seed)
    pool = ([line.strip() for line in sentences.read_text().splitlines() if line.strip()] if sentences.exists()
            else FALLBACK)
    rng.shuffle(pool)
    fresh = iter(pool * (1 + 3 * n // len(pool)))
    rows: list[str] = []
    for _ in range(n):
        if rows and rng.random() < repeat:
            rows.append(rng.choice(rows))
        else:
            rows.append(" ".join(next(fresh) for _ in range(rng.choice((1, 1, 1, 2, 3)))))
    return rows


def run(command: list[str], stdin: Path | None = None, env: dict[str, str] | None = None) -> float:
    """Run to completion; its wall time."""
    started = time.perf_counter()
    with open(stdin or os.devnull, "rb") as f:
        done = subprocess.run(command, stdin=f, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    if done.returncode:
        raise RuntimeError(f"{command[3:5]} failed: {done.stderr.decode()[-2000:]}")
    return time.perf_counter() - started


def tolk_translate(model: Path, dtype: str, lines: Path, work: Path) -> dict[str, Any]:
    """`tolk translate` over the rows' lines: its time less its start (the same command on one line)."""
    one = work / "one.txt"
    one.write_text("Open the file.\n")
    command = [*TOLK, "translate", "--model", str(model), "--dtype", dtype]
    start = min(run(command, one) for _ in range(2))
    wall = run(command, lines)
    return {"seconds": wall - start, "wall": wall, "start": start}


def job(model: Path, dtype: str, source: Path, work: Path, actors: int | None, threads: int, block_rows: int,
        address: str | None, env: dict[str, str]) -> dict[str, Any]:
    output, report = work / "out.parquet", work / "report.json"
    shutil.rmtree(work / "out.parquet.tolk-parts", ignore_errors=True)
    output.unlink(missing_ok=True)
    command = [*TOLK, "translate-dataset", str(source), str(output), "--column", "text", "--source", "en",
               "--target", "pt", "--model", str(model), "--dtype", dtype, "--threads", str(threads), "--quiet",
               "--block-rows", str(block_rows), "--report", str(report)]
    if actors is not None:
        command += ["--ray", address or "auto", "--actors", str(actors)]
    wall = run(command, env=env)
    figures: dict[str, Any] = json.loads(report.read_text())
    return {**figures, "wall": wall}


def start_ray(cpus: int, env: dict[str, str]) -> tuple[subprocess.Popen[str], str, str]:
    temp = tempfile.mkdtemp(prefix="tolk-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    head = subprocess.Popen([sys.executable, "-c", HEAD, temp, str(cpus)], stdout=subprocess.PIPE, text=True, env=env)
    assert head.stdout is not None
    address = head.stdout.readline().strip()
    if not address:
        raise RuntimeError("the Ray head did not start")
    return head, address, temp


def cluster_estimate(results: dict[str, dict[str, Any]], rows: int, block_rows: int,
                     nodes: list[int]) -> list[dict[str, Any]]:
    """On paper: N nodes like this one, each running its best Ray configuration measured here, every actor kept busy
    by Ray Data (blocks at least twice the actors) and reading and writing a shared volume. Time = the actors' start
    + rows / (N x the node's rows per second) + one block's time (the last block of an actor, the tail)."""
    ray = {k: v for k, v in results.items() if k.startswith("ray-")}
    if not ray:
        return []
    best = max(ray, key=lambda k: ray[k]["translating_per_second"])
    figures = ray[best]
    per_row = figures["sentences"] / figures["rows"]
    node_rows = figures["translating_per_second"] / per_row  # rows per second of one node
    start = figures["seconds"] - figures["translating_seconds"]  # the actors loading the model
    actors = SYSTEMS[best][0] or 1
    tail = block_rows / (node_rows / actors)
    estimate = []
    for n in nodes:
        seconds = start + rows / (n * node_rows) + tail
        estimate.append({"nodes": n, "configuration": best, "rows": rows, "hours": seconds / 3600,
                         "rows_per_day": 86400 * n * node_rows, "sentences_per_second": n * node_rows * per_row})
    return estimate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=ROOT / "weights" / "en-pt")
    p.add_argument("--dtype", default="int8")
    p.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--repeat", type=float, default=0.2, help="share of rows that repeat an earlier row")
    p.add_argument("--sentences", type=Path, default=ROOT / "data" / "corpus" / "train.en")
    p.add_argument("--block-rows", type=int, default=1000)
    p.add_argument("--systems", nargs="+", default=["tolk-translate", *SYSTEMS],
                   choices=["tolk-translate", *SYSTEMS])
    p.add_argument("--nodes", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--estimate-rows", type=int, default=10_000_000)
    p.add_argument("--note", default="", help="what the machine was doing (shared, quiet)")
    p.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "datasets.json")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stopped: the Ray head it started stops too (finally)

    load_before = os.getloadavg()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    cpus = os.cpu_count() or 2
    ray_head = None
    if any(s.startswith("ray-") for s in args.systems):
        ray_head = start_ray(cpus, env)
    table: dict[int, dict[str, dict[str, Any]]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="tolk-bench-datasets-") as tmp:
            work = Path(tmp)
            for n in args.rows:
                rows = make_rows(n, args.sentences, args.repeat)
                source, lines = work / "in.parquet", work / "in.txt"
                pq.write_table(pa.table({"id": list(range(n)), "text": rows}), source)
                lines.write_text("".join(f"{r}\n" for r in rows))
                table[n] = {}
                for system in args.systems:
                    if system == "tolk-translate":
                        table[n][system] = tolk_translate(args.model, args.dtype, lines, work)
                    else:
                        actors, threads = SYSTEMS[system]
                        table[n][system] = job(args.model, args.dtype, source, work, actors, threads,
                                               args.block_rows, ray_head[1] if ray_head else None, env)
                    print(f"{n} rows, {system}: {table[n][system]['seconds']:.1f} s", file=sys.stderr)
                sentences = next((r["sentences"] for r in table[n].values() if "sentences" in r), None)
                if sentences and "tolk-translate" in table[n]:
                    figures = table[n]["tolk-translate"]
                    figures["sentences"] = sentences
                    figures["sentences_per_second"] = figures["translating_per_second"] = sentences / figures["seconds"]
    finally:
        if ray_head is not None:
            ray_head[0].terminate()
            ray_head[0].wait(60)
            shutil.rmtree(ray_head[2], ignore_errors=True)

    print(f"\n{'rows':>8} {'system':<15} {'sentences/s':>12} {'translating':>12} {'seconds':>8} {'s/1k rows':>10} "
          f"{'decoded':>8} {'RSS MB':>7}")
    for n, results in table.items():
        for system, r in results.items():
            print(f"{n:>8} {system:<15} {r.get('sentences_per_second', 0):>12.1f} "
                  f"{r.get('translating_per_second', 0):>12.1f} {r['seconds']:>8.1f} "
                  f"{1000 * r['seconds'] / n:>10.2f} {r.get('decoded', '-')!s:>8} {r.get('max_rss_mb', 0):>7.0f}")
    biggest = table[max(table)]
    estimate = cluster_estimate(biggest, args.estimate_rows, args.block_rows, args.nodes)
    if estimate:
        print(f"\nPaper estimate, {args.estimate_rows:,} rows, nodes like this one ({estimate[0]['configuration']}):")
        for e in estimate:
            print(f"  {e['nodes']:>4} nodes: {e['hours']:7.2f} h, {e['rows_per_day']:,.0f} rows/day, "
                  f"{e['sentences_per_second']:,.0f} sentences/s")
    for n, results in table.items():
        for ray_system in ("ray-1x2", "ray-2x1"):
            if "job-2" in results and ray_system in results:
                whole, translating = (results[ray_system][k] / results["job-2"][k]
                                      for k in ("sentences_per_second", "translating_per_second"))
                print(f"{n} rows: {ray_system} / job-2 (the same 2 threads): {whole:.2f} of the whole run, "
                      f"{translating:.2f} translating")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "machine": {"cpu": platform.processor() or platform.machine(), "cpus": cpus, "flags": cpu_flags(),
                    "load_before": load_before, "note": args.note},
        "model": str(args.model), "dtype": args.dtype, "repeat": args.repeat, "block_rows": args.block_rows,
        "results": {str(n): r for n, r in table.items()}, "cluster_estimate": estimate,
    }, indent=2) + "\n")
    print(f"wrote {args.output}")


def cpu_flags() -> str:
    """The lscpu model name and the flags that decide int8 and float speed (avx2, avx512*, vnni)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return ""
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("Flags")), [])
    return f"{model}: {' '.join(f for f in flags if f.startswith(('avx', 'fma', 'amx')) or 'vnni' in f)}"


if __name__ == "__main__":
    main()
