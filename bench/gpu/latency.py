"""Where one request's time goes on the server: sequential requests, streamed and not, in alternating rounds.

On the H100 a non-streamed request took about 75 ms at the median and a streamed one 12 ms, with and without
batching, where the CPU machine has them equal (docs/experiments.md, "On an NVIDIA H100"). This sends rounds of
sequential requests, non-streamed and streamed in turn, to servers that differ in one setting at a time (the
scheduler in its own process or in a thread; batching on or off), so an effect of order (warm-up), of the
transport or of batching shows in the medians. Then a short closed loop of 8 clients per server. Prints a table and
writes JSON.

    python bench/gpu/latency.py --model weights/en-pt --sentences data/corpus/test.en --device cuda
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from serve import drive, one_request, start_server, wait_ready  # noqa: E402

VARIANTS = {  # name: (batching, extra environment)
    "process": (True, {}),
    "thread": (True, {"TOLK_SCHEDULER_PROCESS": "false"}),
    "process-unbatched": (False, {}),
}


async def rounds(url: str, sentences: list[str], n: int, count: int, options: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    async with aiohttp.ClientSession() as session:
        for r in range(count):
            for stream in (False, True):
                latencies = []
                for i in range(n):
                    latency, _, _ = await one_request(session, url, sentences[i], options, stream)
                    latencies.append(1000 * latency)
                out.append({"round": r, "stream": stream, "median_ms": round(statistics.median(latencies), 2),
                            "min_ms": round(min(latencies), 2), "max_ms": round(max(latencies), 2)})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=ROOT / "weights/en-pt")
    p.add_argument("--sentences", type=Path, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--requests", type=int, default=16, help="sequential requests per round and kind")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--threads", type=int, default=2, help="the server's torch threads (TOLK_THREADS)")
    p.add_argument("--port", type=int, default=8790)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    sentences = args.sentences.read_text(encoding="utf-8").splitlines()[:512]
    options = {"max_new_tokens": 32}
    results: dict[str, Any] = {}
    for k, name in enumerate(args.variants):
        batching, env = VARIANTS[name]
        server_args = argparse.Namespace(rows=128, max_new_tokens=32, dtype=args.dtype, device=args.device,
                                         threads=args.threads)
        saved = dict(os.environ)
        os.environ.update(env)
        try:
            process = start_server(args.model, args.port + k, batching, server_args)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        url = f"http://127.0.0.1:{args.port + k}"
        try:
            wait_ready(url, process)
            start = time.perf_counter()
            seq = asyncio.run(rounds(url, sentences, args.requests, args.rounds, options))
            loops = {stream: asyncio.run(drive(url, sentences[64:], 8, 64, options, stream))
                     for stream in (False, True)}
            results[name] = {"sequential": seq, "clients8": {str(k): v for k, v in loops.items()},
                             "seconds": round(time.perf_counter() - start, 1)}
        finally:
            process.terminate()
            process.wait(30)
        for row in seq:
            print(f"{name:>18} round {row['round']} {'streamed' if row['stream'] else 'plain':>8}: "
                  f"median {row['median_ms']:7.2f} ms (min {row['min_ms']:.2f}, max {row['max_ms']:.2f})", flush=True)
        for stream, r in loops.items():
            print(f"{name:>18} 8 clients {'streamed' if stream else 'plain':>8}: {r['sentences_per_s']:.1f} "
                  f"sentences/s, p50 {r['latency_p50_ms']:.1f} ms", flush=True)
    if args.out:
        summary = {"device": args.device, "dtype": args.dtype, "results": results}
        args.out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
