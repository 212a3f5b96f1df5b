"""Hostile and heavy input against a real server: memory for a file bomb, and short requests beside long ones.

Starts the server as `tolk serve` runs it (the shipped model, int8 on the CPU, the translation cache off so that
every request decodes) and measures, one phase after another:

1. bomb: the 90 KB .docx whose document.xml is 60 MiB of `<w:p/>` (10 million empty paragraphs), POSTed to
   /translate_file: its status and time, and the server's memory before, at its peak and 2 s after (the server's
   own process by RSS, and its process tree, the batcher and file workers included, by PSS);
2. ten bombs at once: the same, with the tree's peak;
3. document: a 6,000-line .txt through POST /documents while another client sends short requests one after another:
   their statuses and latencies;
4. rows: one client sending four texts with a beam of 8 (every row of a 32-row batch; each the corpus's longest
   lines made one sentence, so that they hold their rows a while) over and over while another sends short
   requests: their statuses and latencies.

Prints a table and writes JSON (with the CPU and its flags). Never run by the test suite.

    python bench/hostile_load.py                      # weights/en-pt
    python bench/hostile_load.py --lines 2000 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
FALLBACK = ["Open the file.", "Save your changes before closing the window.", "Click here to continue.",
            "Where is the nearest train station?", "Please enter your password again."]


# (bench/serve.py and bench/engines.py have these, but import aiohttp and torch, which this client does not need)
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server on {url} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:  # refused while starting, or 503 until the model is loaded
            pass
        time.sleep(0.3)
    raise SystemExit(f"server on {url} not ready after {timeout} s")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def cpu() -> dict[str, str]:
    """lscpu's model name and flags."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {"model": fields.get("Model name", "").strip(), "flags": fields.get("Flags", "").strip()}


def bomb() -> bytes:
    """The issue's file: 10 million empty paragraphs, deflated at level 9 (about 88 KB)."""
    document = f'<w:document xmlns:w="{W}"><w:body>'.encode() + b"<w:p/>" * 10_000_000 + b"</w:body></w:document>"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("word/document.xml", document)
    return out.getvalue()


# --- memory of the server's processes ----------------------------------------------------------------------------

def children(pid: int) -> list[int]:
    """Every process under `pid` (the batcher's, the fork server and its file workers)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def field_kb(path: Path, name: str) -> int:
    try:
        for line in path.read_text().splitlines():
            if line.startswith(name):
                return int(line.split()[1])
    except OSError:  # the process ended meanwhile
        pass
    return 0


def memory(pid: int) -> tuple[float, float]:
    """(the server process's RSS, its whole tree's PSS), in MiB."""
    rss = field_kb(Path(f"/proc/{pid}/status"), "VmRSS:") / 1024
    pss = sum(field_kb(Path(f"/proc/{p}/smaps_rollup"), "Pss:") for p in [pid, *children(pid)]) / 1024
    return rss, pss


@contextmanager
def peak(pid: int) -> Iterator[dict[str, float]]:
    """The largest RSS and tree PSS seen while the block runs (sampled every 20 ms)."""
    most = {"rss_mib": 0.0, "tree_pss_mib": 0.0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            rss, pss = memory(pid)
            most["rss_mib"], most["tree_pss_mib"] = max(most["rss_mib"], rss), max(most["tree_pss_mib"], pss)
            done.wait(0.02)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield most
    finally:
        done.set()
        thread.join()


# --- phases -----------------------------------------------------------------------------------------------------

async def upload(client: httpx.AsyncClient, name: str, data: bytes) -> tuple[int, float]:
    start = time.perf_counter()
    r = await client.post("/translate_file", files={"file": (name, data)}, data={"source": "en", "target": "pt"})
    return r.status_code, time.perf_counter() - start


async def bombs(client: httpx.AsyncClient, pid: int, count: int) -> dict[str, Any]:
    data = bomb()
    before = memory(pid)
    with peak(pid) as most:
        answers = await asyncio.gather(*[upload(client, f"bomb{i}.docx", data) for i in range(count)])
    await asyncio.sleep(2)
    after = memory(pid)
    return {"uploads": count, "bytes": len(data), "statuses": sorted({s for s, _ in answers}),
            "max_s": max(t for _, t in answers), "rss_before_mib": before[0], "rss_after_mib": after[0],
            "tree_pss_before_mib": before[1], "tree_pss_after_mib": after[1], **{f"peak_{k}": v
                                                                                 for k, v in most.items()}}


async def short_requests(client: httpx.AsyncClient, probes: list[str], until: asyncio.Task[Any],
                         gap: float) -> dict[str, Any]:
    """Short requests one after another until `until` is done: statuses and latencies."""
    latencies, statuses, i = [], [], 0
    while not until.done():
        start = time.perf_counter()
        r = await client.post("/translate", json={"q": probes[i % len(probes)], "source": "en", "target": "pt"})
        latencies.append(time.perf_counter() - start)
        statuses.append(r.status_code)
        i += 1
        await asyncio.sleep(gap)
    ok = [t for t, s in zip(latencies, statuses, strict=True) if s == 200]
    return {"requests": len(statuses), "answered_200": len(ok), "statuses": sorted(set(statuses)),
            "p50_ms": 1000 * percentile(ok, 0.5), "p99_ms": 1000 * percentile(ok, 0.99),
            "max_ms": 1000 * max(ok, default=float("nan"))}


async def document(url: str, lines: list[str], probes: list[str], gap: float) -> dict[str, Any]:
    text = "\n".join(lines).encode()
    async with httpx.AsyncClient(base_url=url, timeout=600) as owner, httpx.AsyncClient(base_url=url,
                                                                                        timeout=120) as other:
        started = time.perf_counter()
        r = await owner.post("/documents", files={"file": ("long.txt", text)}, data={"target_lang": "pt"})
        r.raise_for_status()
        handle = r.json()

        async def wait() -> dict[str, Any]:
            while True:
                await asyncio.sleep(0.5)
                status = (await owner.post(f"/documents/{handle['document_id']}",
                                           data={"document_key": handle["document_key"]})).json()
                if status["status"] in ("done", "error"):
                    return dict(status)

        waiting = asyncio.create_task(wait())
        shorts = await short_requests(other, probes, waiting, gap)
        status = await waiting
    return {"lines": len(lines), "document_status": status["status"], "document_s": time.perf_counter() - started,
            "short": shorts}


async def rows(url: str, texts: list[str], probes: list[str], seconds: float, gap: float) -> dict[str, Any]:
    body = {"q": texts, "source": "en", "target": "pt", "options": {"beam_size": 8}}
    async with httpx.AsyncClient(base_url=url, timeout=120) as greedy, httpx.AsyncClient(base_url=url,
                                                                                         timeout=120) as other:
        wide: list[float] = []

        async def hog() -> None:
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                (await greedy.post("/translate", json=body)).raise_for_status()
                wide.append(time.perf_counter() - start)

        hogging = asyncio.create_task(hog())
        await asyncio.sleep(0.2)
        shorts = await short_requests(other, probes, hogging, gap)
        await hogging
    return {"texts": len(texts), "beam": 8, "wide_requests": len(wide), "wide_p50_ms": 1000 * percentile(wide, 0.5),
            "short": shorts}


async def measure(url: str, pid: int, args: argparse.Namespace, lines: list[str], probes: list[str]) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        for text in probes[:5]:  # warm-up: the decoder, and the file workers' fork server
            await client.post("/translate", json={"q": text, "source": "en", "target": "pt"})
        await upload(client, "warm.txt", b"Open the file.")
        await asyncio.sleep(1)
        one = await bombs(client, pid, 1)
        ten = await bombs(client, pid, args.bombs)
    long = await document(url, lines[: args.lines], probes, args.gap)
    longest = sorted(set(lines), key=len)[-4:]
    wide = await rows(url, [t.rstrip(".").replace(". ", ", ") + "." for t in longest], probes, args.seconds, args.gap)
    return {"bomb": one, "bombs": ten, "document": long, "rows": wide}


def report(results: dict[str, Any]) -> None:
    one, ten = results["bomb"], results["bombs"]
    print(f"{'phase':<22}{'status':>12}{'seconds':>9}{'RSS before':>12}{'peak':>8}{'after':>8}{'tree peak':>11}")
    for name, r in (("bomb (1 upload)", one), (f"bombs ({ten['uploads']} at once)", ten)):
        print(f"{name:<22}{','.join(map(str, r['statuses'])):>12}{r['max_s']:>9.2f}{r['rss_before_mib']:>12.0f}"
              f"{r['peak_rss_mib']:>8.0f}{r['rss_after_mib']:>8.0f}{r['peak_tree_pss_mib']:>11.0f}")
    print(f"\n{'short requests beside':<34}{'sent':>6}{'200':>6}{'statuses':>10}{'p50 ms':>9}{'p99 ms':>9}")
    for name, r in ((f"a {results['document']['lines']}-line document", results["document"]["short"]),
                    ("4 texts with beam 8", results["rows"]["short"])):
        print(f"{name:<34}{r['requests']:>6}{r['answered_200']:>6}{','.join(map(str, r['statuses'])):>10}"
              f"{r['p50_ms']:>9.0f}{r['p99_ms']:>9.0f}")
    d = results["document"]
    print(f"\nthe document: {d['document_status']} in {d['document_s']:.1f} s; "
          f"the wide requests: {results['rows']['wide_requests']}, p50 {results['rows']['wide_p50_ms']:.0f} ms")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=ROOT / "weights" / "en-pt")
    p.add_argument("--sentences", type=Path, default=ROOT / "data" / "corpus" / "test.en")
    p.add_argument("--lines", type=int, default=6000, help="lines of the long document")
    p.add_argument("--bombs", type=int, default=10, help="bombs uploaded at once in phase 2")
    p.add_argument("--seconds", type=float, default=20, help="how long the wide requests go on in phase 4")
    p.add_argument("--gap", type=float, default=0.05, help="seconds between short requests")
    p.add_argument("--note", default="", help="recorded in the JSON (the machine's state, say)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "hostile-load.json")
    args = p.parse_args()

    corpus = ([line.strip() for line in args.sentences.read_text().splitlines() if line.strip()]
              if args.sentences.exists() else FALLBACK * 200)
    lines = (corpus * (args.lines // len(corpus) + 1))[: args.lines]
    probes = [s for s in corpus if 4 <= len(s.split()) <= 12][:200]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # files of 6,000 lines hold more than the default 200,000 characters to translate
    env = {**os.environ, "TOLK_TRANSLATION_CACHE_ENTRIES": "0", "TOLK_MAX_FILE_CHARS": "2000000"}
    server = subprocess.Popen([sys.executable, "-m", "server", "--model", str(args.model), "--port", str(port),
                               "--log-level", "warning"], cwd=ROOT, env=env)
    try:
        wait_ready(url, server)
        results = asyncio.run(measure(url, server.pid, args, lines, probes))
    finally:
        server.terminate()
        server.wait(60)
    report(results)
    record = {"model": str(args.model), "cpu": cpu(), "cores": os.cpu_count(),
              "note": args.note, "server_env": {k: v for k, v in env.items() if k.startswith("TOLK_")}, **results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
