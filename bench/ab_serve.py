"""One request at a time through two servers at once: this checkout against an earlier revision, paired.

On a shared 2-core machine a server's latency moves by 30% from one minute to the next (CTranslate2's own
one-sentence time read 7.1 to 13.1 ms in four runs of bench/serve.py within ten minutes), so two runs made one
after the other cannot show a change of a millisecond. Here both servers are up together, on the same model and
settings, and each sentence goes to one then the other (the order alternating), so drift hits both alike. The
earlier revision is checked out into a git worktree; both run with this checkout's virtual environment.

Reports each server's median latency, the median of the paired differences, and how many translations are the
same text. With `--clients N`, throughput instead: closed-loop phases of N clients (plain requests, as
LibreTranslate's clients send them), the two servers taking turns phase by phase for `--rounds` rounds, each round's
ratio head / base in sentences/s. Prints a table and writes JSON. Never run by the test suite.

    python bench/ab_serve.py --base HEAD~2 [--model weights/en-pt] [--sentences data/corpus/test.en] [-n 400]
    python bench/ab_serve.py --base HEAD~2 --clients 32 [--rounds 4] [-n 512]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from int8_products import cpu_flags  # noqa: E402
from serve import wait_ready  # noqa: E402


def start(tree: Path, port: int, args: argparse.Namespace, threads: int, extra: list[str]
          ) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TOLK_DTYPE": args.dtype, "TOLK_TRANSLATION_CACHE_ENTRIES": "0", "TOLK_MAX_QUEUE": "100000"}
    env.update(item.split("=", 1) for item in extra)
    return subprocess.Popen([sys.executable, "-m", "server", "--model", str(args.model.resolve()), "--port", str(port),
                             "--threads", str(threads), "--log-level", "warning"], cwd=tree, env=env)


async def pairs(ports: dict[str, int], sentences: list[str], warmup: int) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        async def one(name: str, text: str) -> tuple[float, str]:
            body = {"q": text, "source": "en", "target": "pt"}
            start = time.perf_counter()
            async with session.post(f"http://127.0.0.1:{ports[name]}/translate", json=body) as r:
                r.raise_for_status()
                answer = await r.json()
            return time.perf_counter() - start, answer["translatedText"]

        for text in sentences[:warmup]:
            for name in ports:
                await one(name, text)
        times: dict[str, list[float]] = {name: [] for name in ports}
        same = 0
        for i, text in enumerate(sentences):
            order = list(ports) if i % 2 else list(ports)[::-1]
            out = {}
            for name in order:
                seconds, out[name] = await one(name, text)
                times[name].append(seconds)
            same += out["base"] == out["head"]
    paired = [1000 * (b - h) for b, h in zip(times["base"], times["head"], strict=True)]
    return {"sentences": len(sentences), "same_text": same,
            "base_p50_ms": 1000 * statistics.median(times["base"]),
            "head_p50_ms": 1000 * statistics.median(times["head"]),
            "paired_base_minus_head_p50_ms": statistics.median(paired)}


async def load(ports: dict[str, int], sentences: list[str], clients: int, rounds: int) -> dict[str, Any]:
    """Rounds of one closed-loop phase per server (order alternating); sentences/s per phase, ratio per round."""
    async def phase(port: int) -> float:
        connector = aiohttp.TCPConnector(limit=clients + 4)
        async with aiohttp.ClientSession(connector=connector) as session:
            queue = iter(sentences)

            async def client() -> None:
                for text in queue:
                    body = {"q": text, "source": "en", "target": "pt"}
                    async with session.post(f"http://127.0.0.1:{port}/translate", json=body) as r:
                        r.raise_for_status()
                        await r.read()

            start = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(clients)))
            return len(sentences) / (time.perf_counter() - start)

    for port in ports.values():  # warm-up
        await phase(port)
    rates: dict[str, list[float]] = {name: [] for name in ports}
    for i in range(rounds):
        for name in (list(ports) if i % 2 else list(ports)[::-1]):
            rates[name].append(await phase(ports[name]))
    ratios = [h / b for h, b in zip(rates["head"], rates["base"], strict=True)]
    return {"clients": clients, "sentences_per_phase": len(sentences), "rounds": rounds,
            "base_sentences_per_s": rates["base"], "head_sentences_per_s": rates["head"],
            "ratio_head_over_base": ratios, "ratio_median": statistics.median(ratios)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the earlier revision (any git revision)")
    p.add_argument("--model", type=Path, default=ROOT / "weights" / "en-pt")
    p.add_argument("--sentences", type=Path, default=ROOT / "data" / "corpus" / "test.en")
    p.add_argument("-n", type=int, default=400, help="sentences, each sent to both servers")
    p.add_argument("--dtype", default="int8")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--base-threads", type=int, default=0, help="the base server's --threads (default: --threads); "
                   "with --base HEAD, compares two settings of one revision")
    p.add_argument("--base-env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable for the base server only (repeatable)")
    p.add_argument("--head-env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable for the head server only (repeatable)")
    p.add_argument("--clients", type=int, default=0, help="throughput with this many closed-loop clients instead")
    p.add_argument("--rounds", type=int, default=4, help="with --clients: phases per server")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ab-serve.json")
    args = p.parse_args()
    sentences = [s for s in args.sentences.read_text().splitlines() if s.strip()][: args.n]
    base_rev = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, check=True, capture_output=True,
                              text=True).stdout.strip()
    head_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True, capture_output=True,
                              text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="tolk-ab-") as work:
        base = Path(work) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), base_rev], cwd=ROOT, check=True,
                       capture_output=True)
        ports = {"base": 8451, "head": 8452}
        processes = {"base": start(base, ports["base"], args, args.base_threads or args.threads, args.base_env),
                     "head": start(ROOT, ports["head"], args, args.threads, args.head_env)}
        try:
            for name, process in processes.items():
                wait_ready(f"http://127.0.0.1:{ports[name]}", process)
            if args.clients:
                result = asyncio.run(load(ports, sentences, args.clients, args.rounds))
            else:
                result = asyncio.run(pairs(ports, sentences, warmup=20))
        finally:
            for process in processes.values():
                process.terminate()
                process.wait()
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)
    model = args.model.resolve()
    shown = model.relative_to(ROOT) if model.is_relative_to(ROOT) else model
    result.update({"base": base_rev, "head": head_rev, "model": str(shown), "dtype": args.dtype,
                   "threads": args.threads, "base_threads": args.base_threads or args.threads,
                   "base_env": args.base_env, "head_env": args.head_env,
                   "cpu": platform.processor() or platform.machine(), "flags": cpu_flags(),
                   "note": "head's working tree as it is, uncommitted changes included"})
    if args.clients:
        print(f"{'round':>5} {'base sent/s':>12} {'head sent/s':>12} {'head/base':>10}")
        for i, (b, h) in enumerate(zip(result["base_sentences_per_s"], result["head_sentences_per_s"], strict=True)):
            print(f"{i + 1:>5} {b:12.1f} {h:12.1f} {h / b:9.2f}x")
        print(f"{args.clients} clients, base {base_rev}, head {head_rev}: median ratio {result['ratio_median']:.2f}x")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
        return
    print(f"{'server':>6} {'revision':>9} {'p50 ms':>8}")
    print(f"{'base':>6} {base_rev:>9} {result['base_p50_ms']:8.2f}")
    print(f"{'head':>6} {head_rev:>9} {result['head_p50_ms']:8.2f}")
    print(f"paired, base minus head: {result['paired_base_minus_head_p50_ms']:.2f} ms median; "
          f"same text {result['same_text']}/{result['sentences']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
