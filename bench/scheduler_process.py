"""Why the scheduler runs in a process of its own: the GIL, measured.

1. The offline engine alone, then with a second Python thread that only counts: how much the GIL hand-offs of
   every torch call cost the decode loop.
2. Two servers on the same model, the scheduler as a thread (TOLK_SCHEDULER_PROCESS=false) and in a child
   process, driven in turn by closed-loop clients (plain and streamed), with the CPU each server thread used.
Prints a table and writes JSON. Never run by the test suite.

    python bench/scheduler_process.py --model weights/en-pt --sentences data/corpus/test.en
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from serve import drive, wait_ready  # noqa: E402

from model.checkpoint import load  # noqa: E402
from model.search import generate  # noqa: E402


def spinner_cost(args: argparse.Namespace, sentences: list[str]) -> dict[str, float]:
    """Seconds to translate the sentences alone and beside a counting thread."""
    torch.set_num_threads(args.threads)
    loaded = load(args.model, device="cpu", dtype=args.dtype)
    sources = [loaded.tokenizer.encode(s) for s in sentences[: args.spinner_sentences]]
    config = loaded.generation.update(max_new_tokens=args.max_new_tokens)
    generate(loaded.net, sources, config, max_rows=32)  # warm-up
    start = time.perf_counter()
    generate(loaded.net, sources, config, max_rows=32)
    alone = time.perf_counter() - start
    stop = threading.Event()

    def spin() -> None:
        count = 0
        while not stop.is_set():
            count += 1

    thread = threading.Thread(target=spin)
    thread.start()
    start = time.perf_counter()
    generate(loaded.net, sources, config, max_rows=32)
    beside = time.perf_counter() - start
    stop.set()
    thread.join()
    return {"sentences": len(sources), "alone_s": alone, "beside_spinner_s": beside}


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds used so far by each thread of a process (and of its children), by thread id and name."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    pids = [pid] + [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit() and _parent(d) == pid]
    for p in pids:
        for stat in Path(f"/proc/{p}/task").glob("*/stat"):
            try:
                text = stat.read_text()
            except OSError:  # a thread that ended meanwhile
                continue
            fields = text[text.rindex(")") + 2:].split()
            out[f"{p}/{stat.parent.name}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _parent(proc: Path) -> int:
    try:
        text = (proc / "stat").read_text()
    except OSError:  # gone meanwhile
        return -1
    return int(text[text.rindex(")") + 2:].split()[1])


def start_server(args: argparse.Namespace, port: int, process: bool) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TOLK_MAX_BATCH_ROWS": "32", "TOLK_MAX_QUEUE": "100000", "TOLK_REQUEST_TIMEOUT": "600",
           "TOLK_MAX_NEW_TOKENS": str(args.max_new_tokens), "TOLK_DTYPE": args.dtype,
           "TOLK_SCHEDULER_PROCESS": str(process).lower(), "TOLK_TRANSLATION_CACHE_ENTRIES": "0"}
    return subprocess.Popen([sys.executable, "-m", "server", "--model", str(args.model), "--port", str(port),
                             "--threads", str(args.threads), "--log-level", "warning"], cwd=ROOT, env=env)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=ROOT / "weights" / "en-pt")
    p.add_argument("--sentences", type=Path, default=ROOT / "data" / "corpus" / "test.en")
    p.add_argument("--dtype", default="int8")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--requests", type=int, default=320)
    p.add_argument("--stream-requests", type=int, default=160)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--spinner-sentences", type=int, default=32)
    p.add_argument("--port", type=int, default=9300)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "scheduler-process.json")
    args = p.parse_args()
    sentences = args.sentences.read_text(encoding="utf-8").splitlines()[:512]

    spinner = spinner_cost(args, sentences)
    print(f"offline, {spinner['sentences']} sentences: {spinner['alone_s']:.2f} s alone, "
          f"{spinner['beside_spinner_s']:.2f} s beside a counting Python thread")

    modes = {"thread": False, "process": True}
    servers = {m: start_server(args, args.port + i, process) for i, (m, process) in enumerate(modes.items())}
    urls = {m: f"http://127.0.0.1:{args.port + i}" for i, m in enumerate(modes)}
    rows: list[dict[str, Any]] = []
    try:
        for m in modes:
            wait_ready(urls[m], servers[m])
        options = {"max_new_tokens": args.max_new_tokens}
        print(f"{'pass':>4} {'scheduler':>9} {'stream':>6} {'sent/s':>8} {'p50 ms':>7}  "
              "busiest threads (share of wall)")
        for n in range(args.passes):
            for m in modes:
                asyncio.run(drive(urls[m], sentences, 4, 4, options, False))  # warm-up
                for stream in (False, True):
                    before = thread_cpu(servers[m].pid)
                    start = time.perf_counter()
                    r = asyncio.run(drive(urls[m], sentences, args.clients,
                                          args.stream_requests if stream else args.requests, options, stream))
                    wall = time.perf_counter() - start
                    after = thread_cpu(servers[m].pid)
                    busy = sorted(((after[k] - before.get(k, 0.0)) / wall for k in after), reverse=True)[:2]
                    rows.append({"pass": n, "scheduler": m, "stream": stream, "sentences_per_s": r["sentences_per_s"],
                                 "latency_p50_ms": r["latency_p50_ms"], "busiest_threads": busy})
                    print(f"{n:>4} {m:>9} {str(stream):>6} {r['sentences_per_s']:8.1f} {r['latency_p50_ms']:7.0f}  "
                          + ", ".join(f"{b:.0%}" for b in busy))
    finally:
        for server in servers.values():
            server.terminate()
            server.wait(30)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": str(args.model), "dtype": args.dtype, "threads": args.threads,
                                    "clients": args.clients, "spinner": spinner, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
