"""Running servers driven in turn by the same closed-loop clients, streamed and not: an A/B of server changes.

Start the servers to compare yourself (e.g. one from a worktree of the previous commit, one from this one, on the
same model and settings), then name them; each round drives every server in turn (the order alternating), so slow
drifts of a shared machine fall on both. Prints a table and writes JSON.

    python bench/stream_load.py --server before=http://127.0.0.1:8801 --server after=http://127.0.0.1:8802 \
        --sentences tiny --clients 32 --rounds 4 --out bench/results/stream-load.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from serve import drive  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", action="append", required=True, metavar="NAME=URL")
    p.add_argument("--sentences", default="tiny", help="a file of sentences, or 'tiny' (the test corpus)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--requests", type=int, default=256, help="streamed requests per phase (plain: half)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    servers = dict(s.split("=", 1) for s in args.server)
    if args.sentences == "tiny":
        from tests.tiny import corpus_lines

        sentences = corpus_lines(512, seed=2)
    else:
        sentences = Path(args.sentences).read_text(encoding="utf-8").splitlines()[:512]
    options = {"max_new_tokens": args.max_new_tokens}
    rows: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        order = list(servers.items()) if rnd % 2 == 0 else list(servers.items())[::-1]
        for name, url in order:
            for stream in (True, False):
                n = args.requests if stream else args.requests // 2
                r = asyncio.run(drive(url, sentences, args.clients, n, options, stream))
                rows.append({"round": rnd, "server": name, "stream": stream, **r})
                print(f"round {rnd} {name:>10} {'streamed' if stream else 'plain':>8}: {r['sentences_per_s']:7.1f} "
                      f"sentences/s, p50 {r['latency_p50_ms']:6.0f} ms", flush=True)
    print(f"\n{'server':>10} {'streamed':>9} {'plain':>9}   (median sentences/s over {args.rounds} rounds)")
    summary = {}
    for name in servers:
        med = {s: statistics.median(r["sentences_per_s"] for r in rows if r["server"] == name and r["stream"] == s)
               for s in (True, False)}
        summary[name] = {"streamed": med[True], "plain": med[False]}
        print(f"{name:>10} {med[True]:9.1f} {med[False]:9.1f}")
    if args.out:
        args.out.write_text(json.dumps({"clients": args.clients, "servers": servers, "summary": summary,
                                        "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
