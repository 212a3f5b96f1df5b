"""Continuous batching through the server: invisible to results, rows join mid-flight, disconnects cancel,
a full queue answers 429, a late request 504, a failing step 500, and shutdown ends every request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from model.checkpoint import LoadedModel
from model.events import FinishEvent
from model.search import generate
from server.errors import Overloaded, ShuttingDown
from server.plan import TextDone, Translation, make_plan
from server.scheduler import Scheduler
from tests.helpers import (
    LONG,
    REQUESTS,
    app_client,
    assert_requests_under_load_equal_each_alone,
    batch_of,
    finished_sentences,
    idle,
    metric,
    offline,
    parse_sse,
    scheduler_of,
    server_settings,
    slow_steps,
    thread_scheduler,
    wait_for,
)
from tests.live import live_server


@pytest.fixture(scope="module")
def client(tiny_model_dir: Path) -> Iterator[TestClient]:
    with app_client(tiny_model_dir, max_batch_rows=16) as c:
        yield c


def test_concurrent_requests_equal_each_alone(client: TestClient, tiny_loaded: LoadedModel) -> None:
    def post(item: tuple[str, dict[str, Any]]) -> str:
        r = client.post("/translate", json={"q": item[0], "target": "pt", "options": item[1]})
        assert r.status_code == 200, r.text
        return str(r.json()["translatedText"])

    rows_le_1 = 'tolk_batch_rows_bucket{le="1.0",model="tiny-en-pt"}'
    before = metric(client, "tolk_batch_rows_count"), metric(client, rows_le_1)
    with slow_steps(scheduler_of(client), 0.002), ThreadPoolExecutor(len(REQUESTS)) as pool:
        together = list(pool.map(post, REQUESTS))
    assert together == [offline(tiny_loaded, text, **options) for text, options in REQUESTS]
    steps, single = metric(client, "tolk_batch_rows_count") - before[0], metric(client, rows_le_1) - before[1]
    assert single < steps  # some steps did decode several rows together


def test_float16w_requests_under_load_equal_each_alone(tiny_model_dir: Path) -> None:
    """The CPU precision whose rows never depend on their batch (float16 weights, float32 arithmetic)."""
    assert_requests_under_load_equal_each_alone(tiny_model_dir, "float16w")


def test_rows_join_mid_flight(client: TestClient, tiny_loaded: LoadedModel) -> None:
    scheduler = scheduler_of(client)
    long_src, short_src = (tiny_loaded.tokenizer.encode(t) for t in ("Open the file.", "Disk full."))
    long_cfg = tiny_loaded.generation.update(min_new_tokens=40, max_new_tokens=40)
    short_cfg = tiny_loaded.generation.update(max_new_tokens=3)

    async def scenario() -> tuple[list[int], bool, list[FinishEvent]]:
        long_job = scheduler.submit([long_src], [long_cfg], stream=True)
        events = long_job.events()
        await events.__anext__()  # the long sentence is decoding
        short = await scheduler.submit([short_src], [short_cfg]).results()
        long_still_running = not long_job.done
        rest = [e async for e in events]
        return short[0].hypotheses[0].tokens, long_still_running, [e for e in rest if isinstance(e, FinishEvent)]

    with slow_steps(scheduler, 0.002):
        short_tokens, long_still_running, long_finished = client.portal.call(scenario)  # type: ignore[union-attr]
    assert long_still_running  # the short request joined, finished and left while the long one decoded
    assert len(long_finished[0].hypotheses[0].tokens) == 40
    assert short_tokens == generate(tiny_loaded.net, [short_src], short_cfg)[0][0].tokens


def test_sse_disconnect_cancels_rows(client: TestClient) -> None:
    scheduler = scheduler_of(client)
    before = finished_sentences(client)
    with slow_steps(scheduler, 0.01):
        with client.stream("POST", "/translate/stream", json=LONG) as r:
            for line in r.iter_lines():
                if line.startswith("event: token"):
                    break
        wait_for(lambda: idle(scheduler))
        time.sleep(0.5)  # longer than the 40 steps would take: had it not been cancelled, it would have finished
    assert finished_sentences(client) == before
    assert metric(client, 'tolk_kv_cache_rows_used{model="tiny-en-pt"}') == 0


def test_json_disconnect_cancels_rows(client: TestClient) -> None:
    scheduler = scheduler_of(client)
    app: FastAPI = client.app  # type: ignore[assignment]
    body = httpx.Request("POST", "http://t/translate", json=LONG).read()

    async def post_then_leave() -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []
        gone = asyncio.Event()
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop()
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(dict(message))

        scope = {"type": "http", "method": "POST", "path": "/translate", "raw_path": b"/translate",
                 "query_string": b"", "headers": [(b"content-type", b"application/json")], "http_version": "1.1",
                 "scheme": "http", "server": ("t", 80), "client": ("c", 1), "root_path": "", "state": {}}
        task = asyncio.ensure_future(app(scope, receive, send))
        while not (batch := batch_of(scheduler)) or batch.n == 0:
            await asyncio.sleep(0.002)
        gone.set()
        await task
        return sent

    before = finished_sentences(client)
    with slow_steps(scheduler, 0.01):
        sent = client.portal.call(post_then_leave)  # type: ignore[union-attr]
        wait_for(lambda: idle(scheduler))
        time.sleep(0.5)
    assert sent[0]["status"] == 499
    assert finished_sentences(client) == before


def test_real_disconnects_cancel_rows(client: TestClient) -> None:
    scheduler = scheduler_of(client)
    before = finished_sentences(client)
    with slow_steps(scheduler, 0.01), live_server(client.app, lifespan=False) as url:  # type: ignore[arg-type]
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/translate", json=LONG, timeout=0.2)
        wait_for(lambda: idle(scheduler))
        with httpx.stream("POST", f"{url}/translate/stream", json=LONG, timeout=5) as r:
            assert r.headers["x-accel-buffering"] == "no"
            for line in r.iter_lines():
                if line.startswith("event: token"):
                    break
        wait_for(lambda: idle(scheduler))
        time.sleep(0.5)
        r = httpx.post(f"{url}/translate", json={"q": "Disk full.", "target": "pt"}, timeout=5)
        assert r.status_code == 200
    assert finished_sentences(client) == before


def test_full_queue_answers_429_and_loses_nothing(tiny_model_dir: Path) -> None:
    with app_client(tiny_model_dir, max_batch_rows=1, max_queue=2, retry_after=3) as client:
        scheduler = scheduler_of(client)
        with slow_steps(scheduler, 0.01), ThreadPoolExecutor(2) as pool:
            first = pool.submit(client.post, "/translate", json=LONG)
            wait_for(lambda: (batch := batch_of(scheduler)) is not None and batch.n == 1)
            second = pool.submit(client.post, "/translate", json={**LONG, "q": ["Disk full.", "Undo."]})
            wait_for(lambda: scheduler.queued == 2)
            r = client.post("/translate", json={"q": "Open.", "target": "pt"})
            assert (r.status_code, r.json()["error_type"]) == (429, "overloaded")
            assert r.headers["retry-after"] == "3"
            r = client.post("/translate/stream", json={"q": "Open.", "target": "pt"})
            assert r.status_code == 429
            assert first.result().status_code == 200 and second.result().status_code == 200
        assert client.post("/translate", json={"q": "Open.", "target": "pt"}).status_code == 200


def test_late_requests_get_504(tiny_model_dir: Path) -> None:
    with app_client(tiny_model_dir, max_batch_rows=1, request_timeout=0.3) as client:
        scheduler = scheduler_of(client)
        with slow_steps(scheduler, 0.02), ThreadPoolExecutor(2) as pool:
            running = pool.submit(client.post, "/translate", json=LONG)
            wait_for(lambda: (batch := batch_of(scheduler)) is not None and batch.n == 1)
            waiting = client.post("/translate", json=LONG)  # never gets the row before its deadline
            assert (waiting.status_code, waiting.json()["error_type"]) == (504, "timeout")
            assert running.result().status_code == 504
            r = client.post("/translate/stream", json=LONG)
            assert r.status_code == 200 and parse_sse(r.text)[-1] == (
                "error", {"error": "the request did not finish within 0.3 s", "error_type": "timeout"})
        wait_for(lambda: idle(scheduler))
        assert client.post("/translate", json={"q": "Open.", "target": "pt"}).status_code == 200


def test_unbatched_server_decodes_one_sentence_at_a_time(tiny_model_dir: Path, tiny_loaded: LoadedModel) -> None:
    with app_client(tiny_model_dir, batching=False) as client, ThreadPoolExecutor(4) as pool:
        texts = [text for text, _ in REQUESTS[:4]]
        out = list(pool.map(lambda t: client.post("/translate", json={"q": t, "target": "pt"}), texts))
        assert [r.json()["translatedText"] for r in out] == [offline(tiny_loaded, t) for t in texts]
        steps = metric(client, "tolk_batch_rows_count")
        assert steps > 0 and metric(client, 'tolk_batch_rows_bucket{le="1.0",model="tiny-en-pt"}') == steps


def test_steps_run_at_once_translate_and_count_as_steps_one_by_one(tiny_model_dir: Path,
                                                                   tiny_loaded: LoadedModel) -> None:
    """A server that runs plain greedy steps at once while nothing waits (`steps_at_once_ms`) against one that never
    does: the same translations, alone, streamed and concurrent, and the same decode steps in its metrics (one
    observation a step, however many ran in one call). The runs did happen, several steps each."""
    texts = ["Open the file.", "Save changes before closing.", "Disk full.", "Select all copy paste undo.",
             "The file could not be opened.", "Click here to continue."]
    options = [{}, {"max_new_tokens": 7}, {"min_new_tokens": 10}, {}, {"max_new_tokens": 30}, {}]
    results, runs = [], []
    for budget in (0.0, 50.0):
        with app_client(tiny_model_dir, steps_at_once_ms=budget, max_batch_rows=4) as client:
            batch = batch_of(scheduler_of(client))
            assert batch is not None
            greedy_steps = batch.greedy_steps

            def counted(most: int, greedy_steps: Any = greedy_steps, budget: float = budget) -> Any:
                out = greedy_steps(most)
                if out is not None:
                    runs.append((budget, len(out)))
                return out

            batch.greedy_steps = counted  # type: ignore[method-assign]

            def post(i: int, client: TestClient = client) -> str:
                r = client.post("/translate", json={"q": texts[i], "target": "pt", "options": options[i]})
                assert r.status_code == 200, r.text
                return str(r.json()["translatedText"])

            alone = [post(i) for i in range(len(texts))]
            counted_steps = metric(client, "tolk_decode_step_seconds_count")
            streamed = parse_sse(client.post("/translate/stream", json={"q": texts[3], "target": "pt"}).text)
            with ThreadPoolExecutor(len(texts)) as pool:
                together = list(pool.map(post, range(len(texts))))
            results.append((alone, together, streamed, counted_steps))
    assert results[0] == results[1]
    assert results[0][0] == [offline(tiny_loaded, t, **o) for t, o in zip(texts, options, strict=True)]
    assert results[0][1] == results[0][0] and streamed[-1][1]["translatedText"] == results[0][0][3]
    assert all(budget for budget, _ in runs) and max(n for _, n in runs) > 4


def test_engine_failure_is_a_500_and_the_server_recovers(client: TestClient) -> None:
    scheduler = scheduler_of(client)
    batch = batch_of(scheduler)
    assert batch is not None

    def broken(choose: bool = False) -> Any:
        raise RuntimeError("device lost")

    batch.forward = broken  # type: ignore[method-assign]
    r = client.post("/translate", json={"q": "Open the file.", "target": "pt"})
    assert (r.status_code, r.json()) == (500, {"error": "the engine failed while translating",
                                               "error_type": "engine_failure"})
    wait_for(lambda: batch_of(scheduler) is not batch)  # rebuilt after the failed jobs were told
    assert client.post("/translate", json={"q": "Open the file.", "target": "pt"}).status_code == 200


def test_failed_admission_is_a_500_not_a_hang(client: TestClient) -> None:
    scheduler = scheduler_of(client)
    batch = batch_of(scheduler)
    assert batch is not None

    def broken(items: Any) -> None:
        raise RuntimeError("out of memory")

    batch.admit = broken  # type: ignore[method-assign]
    r = client.post("/translate", json={"q": "Open the file.", "target": "pt"})
    assert (r.status_code, r.json()["error_type"]) == (500, "engine_failure")
    wait_for(lambda: batch_of(scheduler) is not batch)
    assert scheduler.queued == 0
    assert client.post("/translate", json={"q": "Open the file.", "target": "pt"}).status_code == 200


def test_shutdown_ends_every_request(tiny_loaded: LoadedModel, tiny_model_dir: Path) -> None:
    scheduler = thread_scheduler(tiny_loaded, server_settings(tiny_model_dir, max_batch_rows=1))
    scheduler.start()
    config = tiny_loaded.generation.update(min_new_tokens=40, max_new_tokens=40)
    plan = make_plan(["Open the file. Disk full."], tiny_loaded.tokenizer, False, 64)

    async def scenario() -> tuple[list[Any], BaseException | None]:
        streamed = Translation(plan, scheduler.submit(plan.sources, [config] * 2, stream=True), tiny_loaded.tokenizer)
        waiting = scheduler.submit(plan.sources, [config] * 2)
        events = []
        async for event in streamed.stream():
            events.append(event)
            if len(events) == 1:
                await asyncio.get_running_loop().run_in_executor(None, scheduler.stop)
        try:
            await waiting.results()
        except ShuttingDown as exc:
            return events, exc
        return events, None

    with slow_steps(scheduler, 0.005):
        events, error = asyncio.run(scenario())
    assert isinstance(error, ShuttingDown)
    assert isinstance(events[-1], TextDone) and events[-1].result.finish_reason == "cancelled"
    assert not scheduler.running
    with pytest.raises(Exception, match="not running"):
        asyncio.run(_submit(scheduler, plan.sources, config))


async def _submit(scheduler: Scheduler, sources: list[list[int]], config: Any) -> None:
    scheduler.submit(sources, [config] * len(sources))


def test_overloaded_carries_retry_after() -> None:
    assert Overloaded("busy", 5).retry_after == 5


def test_a_quiet_stream_gets_keep_alive_comments(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """While no token comes (slow steps here), the stream sends SSE comments, which clients ignore, so that proxies
    do not close it; the events around them are the same as without."""
    from server.routes import translate as route

    body = {"q": "Open the file.", "target": "pt", "options": {"max_new_tokens": 3}}
    plain = client.post("/translate/stream", json=body).text
    monkeypatch.setattr(route, "SSE_PING", 0.01)
    with slow_steps(scheduler_of(client), 0.05):
        quiet = client.post("/translate/stream", json=body).text
    assert ": ping" in quiet and ": ping" not in plain
    assert parse_sse(quiet) == parse_sse(plain)
