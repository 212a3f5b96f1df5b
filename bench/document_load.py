"""An interactive request's latency while a long document translates.

Starts the real server (uvicorn, as `tolk serve` runs it, the translation cache off so that every request decodes),
then times short one-sentence POST /translate requests sent one after another: first with the server idle, then
while a long document (an .srt of one sentence per cue, built here) translates through POST /documents. Reports
the median, p90 and worst latency of each phase, the document's time and sentences/s, and how many interactive
requests were refused. Prints a table and writes JSON. Never run by the test suite.

    python bench/document_load.py                       # weights/en-pt, int8, 800 cues
    python bench/document_load.py --cues 300 --requests 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from serve import wait_ready  # noqa: E402

FALLBACK = [
    "Open the file.", "Save your changes before closing the window.", "The meeting starts at nine tomorrow.",
    "Click here to continue.", "Where is the nearest train station?", "This page could not be found.",
    "Please enter your password again.", "The weather is nice today.", "We will send you an email soon.",
    "Select all the files you want to copy.",
]


def sentences(path: Path) -> list[str]:
    """Lines of the test split (or a built-in list), short ones first for the interactive requests."""
    if path.exists():
        return [line.strip() for line in path.read_text().splitlines() if line.strip()]
    return FALLBACK * 200


def subtitles(lines: list[str]) -> bytes:
    cues = []
    for i, line in enumerate(lines):
        start = i * 3
        cues.append(f"{i + 1}\n{stamp(start)} --> {stamp(start + 2)}\n{line}\n")
    return "\n".join(cues).encode()


def stamp(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d},000"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_server(args: argparse.Namespace, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TOLK_TRANSLATION_CACHE_ENTRIES": "0", "TOLK_DTYPE": args.dtype}
    command = [sys.executable, "-m", "server", "--model", str(args.model), "--port", str(port), "--log-level",
               "warning"]
    return subprocess.Popen(command, cwd=ROOT, env=env)


def summary(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    if not ordered:
        return {"n": 0}
    return {"n": len(ordered), "median_ms": 1000 * statistics.median(ordered),
            "p90_ms": 1000 * ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], "max_ms": 1000 * ordered[-1]}


async def probe(client: httpx.AsyncClient, text: str) -> tuple[float, int]:
    """(latency, status) of one interactive request."""
    start = time.perf_counter()
    r = await client.post("/translate", json={"q": text, "source": "en", "target": "pt"})
    return time.perf_counter() - start, r.status_code


async def measure(url: str, probes: list[str], document: bytes, args: argparse.Namespace) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        for text in probes[:3]:  # warm-up
            await probe(client, text)
        idle = [await probe(client, text) for text in probes[: args.requests]]

        started = time.perf_counter()
        r = await client.post("/documents", files={"file": ("long.srt", document)},
                              data={"source_lang": "en", "target_lang": "pt"})
        r.raise_for_status()
        handle = r.json()
        uploaded = time.perf_counter() - started
        status: dict[str, Any] = {"status": "queued"}
        progress: list[tuple[float, float]] = []

        async def watch() -> None:
            nonlocal status
            while status["status"] not in ("done", "error"):
                await asyncio.sleep(0.25)
                answer = await client.post(f"/documents/{handle['document_id']}",
                                           data={"document_key": handle["document_key"]})
                status = answer.json()
                progress.append((time.perf_counter() - started, status["progress"]))

        watcher = asyncio.create_task(watch())
        during: list[tuple[float, int]] = []
        i = 0
        while not watcher.done():
            during.append(await probe(client, probes[args.requests + i % (len(probes) - args.requests)]))
            i += 1
            await asyncio.sleep(args.gap)
        await watcher
        document_s = time.perf_counter() - started
        if status["status"] != "done":
            raise SystemExit(f"the document failed: {status}")
        result = await client.post(f"/documents/{handle['document_id']}/result",
                                   data={"document_key": handle["document_key"]})
        result.raise_for_status()
    ok_during = [t for t, code in during if code == 200]
    return {
        "idle": summary([t for t, code in idle if code == 200]),
        "during_document": summary(ok_during),
        "refused_during_document": sum(code != 200 for _, code in during),
        "statuses_during_document": sorted({code for _, code in during}),
        "document": {"cues": args.cues, "upload_s": uploaded, "seconds": document_s,
                     "sentences_per_s": args.cues / document_s, "bytes_out": len(result.content),
                     "billed_characters": status.get("billed_characters")},
        "during_latencies_ms": [round(1000 * t, 1) for t, _ in during],
        "progress": progress,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=ROOT / "weights" / "en-pt")
    p.add_argument("--sentences", type=Path, default=ROOT / "data" / "corpus" / "test.en")
    p.add_argument("--dtype", default="auto", help="TOLK_DTYPE of the server (auto: int8 on the CPU)")
    p.add_argument("--cues", type=int, default=800, help="sentences of the document (one per cue)")
    p.add_argument("--requests", type=int, default=30, help="interactive requests timed on the idle server")
    p.add_argument("--gap", type=float, default=0.1, help="seconds between interactive requests")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "document-load.json")
    args = p.parse_args()

    lines = sentences(args.sentences)
    short = [s for s in lines if 4 <= len(s.split()) <= 12][: args.requests + 100]
    long_lines = lines[-args.cues:]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(args, port)
    try:
        wait_ready(url, server)
        results = asyncio.run(measure(url, short, subtitles(long_lines), args))
    finally:
        server.terminate()
        server.wait(60)
    print(f"{'phase':<18}{'requests':>9}{'median ms':>11}{'p90 ms':>9}{'max ms':>9}")
    for phase in ("idle", "during_document"):
        s = results[phase]
        print(f"{phase:<18}{s['n']:>9}{s.get('median_ms', 0):>11.1f}{s.get('p90_ms', 0):>9.1f}"
              f"{s.get('max_ms', 0):>9.1f}")
    d = results["document"]
    print(f"document: {d['cues']} cues in {d['seconds']:.1f} s ({d['sentences_per_s']:.1f} sentences/s); "
          f"interactive requests refused meanwhile: {results['refused_during_document']}")
    record = {"model": str(args.model), "dtype": args.dtype, "cpu": platform.processor() or platform.machine(),
              "cores": os.cpu_count(), **results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
