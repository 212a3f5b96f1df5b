"""Load and soak, bounded: many clients on a real socket, mixed short and long texts, streams and plain requests,
some clients leaving mid-stream. Every request ends in a result or an error the client sees; rows, queue and
memory come back to where they were; the queue bound holds; /metrics counts what the clients counted."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from model import runtime
from server.app import create_app
from server.jobs import Job
from server.scheduler import Scheduler
from tests.helpers import batcher_of, idle, server_settings, wait_for
from tests.live import live_server

pytestmark = pytest.mark.slow  # the bounded soak: many clients on a real socket

CLIENTS = 48
ROUNDS = 8
MAX_QUEUE = 24  # sentences; every request below has at most 6, so the bound is exact
SHORT = ["Open the file.", "Disk full.", "Save changes before closing.", "Click here to continue."]
LONG = "Open the file. Save changes.\nThe file could not be opened. Disk full.\n\nClick here. Select all."
RETRIES = 100
KINDS = ["short", "long", "stream", "leave", "list", "bad", "sampled", "stream_long"]


def body(kind: str, n: int) -> dict[str, Any]:
    text = SHORT[n % len(SHORT)]
    if kind in ("long", "stream_long"):
        return {"q": LONG, "source": "en", "target": "pt"}
    if kind == "list":
        return {"q": [text, SHORT[(n + 1) % len(SHORT)]], "source": "en", "target": "pt"}
    if kind == "bad":
        return {"q": text, "source": "en", "target": "pt", "options": {"beam_size": 0}}
    if kind == "sampled":
        return {"q": text, "source": "en", "target": "pt", "options": {"do_sample": True, "top_p": 0.9}}
    return {"q": text, "source": "en", "target": "pt", "options": {"beam_size": 2} if n % 3 == 0 else {}}


def refused(r: httpx.Response, text: str) -> str:
    """The outcome of an answer that is not a translation: its error body must say what happened."""
    error = json.loads(text)
    assert set(error) == {"error", "error_type"} and error["error"], text
    if r.status_code == 429:
        assert int(r.headers["Retry-After"]) >= 1
    return error["error_type"]


async def plain(client: httpx.AsyncClient, kind: str, n: int) -> tuple[str, int]:
    r = await client.post("/translate", json=body(kind, n))
    if r.status_code != 200:
        return refused(r, r.text), r.status_code
    out = r.json()["translatedText"]
    assert all(out) if isinstance(out, list) else out.strip(), out
    return "translated", 200


async def stream(client: httpx.AsyncClient, kind: str, n: int) -> tuple[str, int]:
    """Read a stream to its end (or leave after the first token): the pieces must add up to the done event."""
    async with client.stream("POST", "/translate/stream", json=body(kind, n)) as r:
        if r.status_code != 200:
            return refused(r, (await r.aread()).decode()), r.status_code
        pieces: dict[int, str] = {}
        event = ""
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                if event == "token":
                    if kind == "leave":
                        return "left", 200  # closing the response here drops the connection mid-stream
                    pieces[data["index"]] = pieces.get(data["index"], "") + data["token"]["text"]
                elif event == "error":
                    return refused(r, line[6:]), 200
                elif event == "done":
                    assert data["finish_reason"] in ("eos", "length")
                    assert pieces.get(data["index"], "") == data["translatedText"]
                    return "translated", 200
    raise AssertionError("the stream ended without a done or an error event")


async def client_loop(url: str, c: int, outcomes: Counter[tuple[str, str, int]], finals: Counter[str]) -> None:
    """ROUNDS requests, each tried again after a 429 as a polite client would (every try is counted)."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        for r in range(ROUNDS):
            kind = KINDS[(c + r) % len(KINDS)]
            route = "/translate/stream" if kind in ("stream", "leave", "stream_long") else "/translate"
            for attempt in range(RETRIES):
                outcome, status = await (stream if route.endswith("stream") else plain)(client, kind, c * ROUNDS + r)
                outcomes[(route, outcome, status)] += 1
                if outcome != "overloaded":
                    break
                await asyncio.sleep(0.01 * (attempt + 1))
            finals[outcome] += 1


async def sample_queue(scheduler: Scheduler, peak: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], scheduler.queued)
        await asyncio.sleep(0.002)


async def soak(url: str, scheduler: Scheduler, clients: int) -> tuple[
        Counter[tuple[str, str, int]], Counter[str], int, float]:
    """Every client's rounds at once: the outcome of every try, the final outcome of every round, the largest
    number of sentences seen queued, and the seconds it took."""
    outcomes: Counter[tuple[str, str, int]] = Counter()
    finals: Counter[str] = Counter()
    peak, stop = [0], asyncio.Event()
    sampler = asyncio.create_task(sample_queue(scheduler, peak, stop))
    start = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(client_loop(url, c, outcomes, finals) for c in range(clients))), 300)
    seconds = time.perf_counter() - start
    stop.set()
    await sampler
    return outcomes, finals, peak[0], seconds


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url + "/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def trimmed_rss_bytes() -> int:
    """Resident memory once glibc has handed back its free pages, as the scheduler does after half a second idle:
    what a burst's buffers freed is not a leak, but how much of it glibc keeps depends on what ran before in the
    process (the whole suite once left 35.6 MiB, this file alone 4)."""
    gc.collect()
    runtime.trim_heap()
    return rss_bytes()


def live_jobs() -> int:
    gc.collect()
    return sum(type(o) is Job for o in gc.get_objects())


def test_soak_loses_nothing_and_returns_to_baseline(tiny_model_dir: Path, figures: dict[str, object]) -> None:
    app = create_app(server_settings(tiny_model_dir, max_batch_rows=8, max_queue=MAX_QUEUE, request_timeout=60,
                                     scheduler_process=False))
    with live_server(app) as url:
        scheduler: Scheduler = app.state.registry.models[0].scheduler
        batcher = batcher_of(scheduler)
        asyncio.run(soak(url, scheduler, CLIENTS))  # warm-up: allocators and pools grow to this load here
        wait_for(lambda: idle(scheduler) and not batcher._records)
        baseline, jobs_before, before = trimmed_rss_bytes(), live_jobs(), metrics(url)

        outcomes, finals, peak_queue, seconds = asyncio.run(soak(url, scheduler, CLIENTS))

        wait_for(lambda: idle(scheduler) and not batcher._records)
        after = metrics(url)
        grown_untrimmed = rss_bytes() - baseline
        grown = trimmed_rss_bytes() - baseline
        jobs_after = live_jobs()

    total = sum(outcomes.values())
    by_outcome: Counter[str] = Counter()
    for (_, outcome, _), n in outcomes.items():
        by_outcome[outcome] += n
    # every round ended in a translation, the client leaving, or the refusal of its bad settings: nothing was
    # lost (a lost request raises in the client) and nobody was turned away for good
    assert sum(finals.values()) == CLIENTS * ROUNDS
    assert set(finals) == {"translated", "left", "invalid_settings"}, finals
    assert set(by_outcome) == set(finals) | {"overloaded"}, by_outcome  # the burst did pass the queue bound
    assert peak_queue <= MAX_QUEUE
    # nothing left behind: rows, queue, gauges, job objects, memory
    assert scheduler.queued == 0 and not batcher._waiting and not scheduler._jobs
    model = (("model", "tiny-en-pt"),)
    for gauge in ("tolk_requests_running", "tolk_requests_waiting", "tolk_kv_cache_rows_used"):
        assert after[(gauge, model)] == 0, gauge
    assert jobs_after <= jobs_before
    assert grown < 32 * 2**20, f"resident memory grew by {grown / 2**20:.1f} MiB"

    # /metrics counted what the clients counted
    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    statuses: Counter[tuple[str, int]] = Counter()
    left: Counter[str] = Counter()
    for (route, outcome, status), n in outcomes.items():
        if outcome == "left":
            left[route] += n
        else:
            statuses[(route, status)] += n
    for (route, status), n in statuses.items():
        if status != 200:
            assert delta("tolk_requests_total", route=route, status=str(status)) == n, (route, status)
    for route in {r for r, _ in statuses} | set(left):
        # a stream its client left counts as 499, or as 200 if its last byte went before the server saw it go
        reset = delta("tolk_requests_total", route=route, status="499")
        answered = delta("tolk_requests_total", route=route, status="200") + reset
        assert answered == statuses[(route, 200)] + left[route] and reset <= left[route], route
    assert delta("tolk_request_failures_total", error_type="overloaded") == by_outcome["overloaded"]
    assert delta("tolk_request_failures_total", error_type="invalid_settings") == by_outcome["invalid_settings"]
    for error_type in ("engine_failure", "timeout", "shutting_down", "not_ready"):
        assert delta("tolk_request_failures_total", error_type=error_type) == 0, error_type

    figures["soak"] = {
        "clients": CLIENTS, "requests": total, "seconds": round(seconds, 1),
        "outcomes": dict(sorted(by_outcome.items())), "rounds": dict(sorted(finals.items())), "lost": 0,
        "peak_queued_sentences": peak_queue,
        "queue_bound": MAX_QUEUE, "rss_growth_mib": round(grown / 2**20, 1),
        "rss_growth_untrimmed_mib": round(grown_untrimmed / 2**20, 1),
    }
