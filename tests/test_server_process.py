"""The scheduler in its own process (the default): the same answers as the thread, and the same guarantees.

Answers equal the engine's own, batched and streamed; a cancelled job frees its rows; a full queue answers 429;
a killed child fails its requests with a 500, turns /ready to 503 and is started again; metrics cross over.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from model.checkpoint import LoadedModel
from model.events import FinishEvent, TokenEvent
from model.generation import GenerationConfig
from model.search import generate
from server.app import create_app
from server.errors import NotReady, Overloaded, ShuttingDown, TimedOut
from server.messages import Target
from server.metrics import Metrics
from server.scheduler import Scheduler
from server.transport import ProcessTransport
from tests.helpers import metric, server_settings, wait_for

TEXTS = ["Open the file.", "Save changes before closing.", "The file could not be opened.", "Disk full.",
         "Select all copy paste undo.", "Click here to continue."]
LONG = {"min_new_tokens": 40, "max_new_tokens": 40}


def process_scheduler(directory: Path, metrics: Metrics | None = None, **changes: object) -> Scheduler:
    settings = server_settings(directory, scheduler_process=True, **changes)
    scheduler = Scheduler(Target("tiny-en-pt", directory, "cpu", "float32"), settings, metrics or Metrics(),
                          settings.max_source_tokens, ProcessTransport())
    scheduler.start()
    return scheduler


@pytest.fixture(scope="module")
def app_client(tiny_model_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(server_settings(tiny_model_dir, scheduler_process=True))) as client:
        yield client


def test_the_app_serves_through_a_child_process(app_client: TestClient, tiny_loaded: LoadedModel) -> None:
    """Concurrent requests (batched together in the child) each get what the engine gives for that text alone;
    streamed pieces add up to the same translation."""
    scheduler = app_client.app.state.registry.models[0].scheduler  # type: ignore[attr-defined]
    transport = scheduler.transport
    assert isinstance(transport, ProcessTransport) and transport.process is not None
    assert transport.process.pid != os.getpid()
    config = tiny_loaded.generation
    alone = {t: tiny_loaded.tokenizer.decode(generate(tiny_loaded.net, [tiny_loaded.tokenizer.encode(t)],
                                                      config)[0][0].tokens) for t in TEXTS}

    def ask(text: str) -> str:
        r = app_client.post("/translate", json={"q": text, "source": "en", "target": "pt"})
        assert r.status_code == 200, r.text
        return str(r.json()["translatedText"])

    with ThreadPoolExecutor(len(TEXTS)) as pool:
        answers = dict(zip(TEXTS, pool.map(ask, TEXTS), strict=True))
    assert answers == alone
    with app_client.stream("POST", "/translate/stream", json={"q": TEXTS[1], "target": "pt"}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    pieces = [json.loads(line[6:]).get("token", {}).get("text", "") for line in lines[:-1]]
    assert "".join(pieces) == alone[TEXTS[1]] == json.loads(lines[-1][6:])["translatedText"]
    assert metric(app_client, 'tolk_kv_cache_bytes{model="tiny-en-pt"}') > 0  # set in the child, seen here
    wait_for(lambda: metric(app_client, 'tolk_kv_cache_rows_used{model="tiny-en-pt"}') == 0)
    assert metric(app_client, 'tolk_input_tokens_total{model="tiny-en-pt"}') > 0
    assert app_client.get("/models").json()[0]["device"] == "cpu"


def test_cancel_frees_the_rows_and_a_full_queue_is_refused(tiny_model_dir: Path, tiny_loaded: LoadedModel) -> None:
    metrics = Metrics()
    scheduler = process_scheduler(tiny_model_dir, metrics, max_batch_rows=1, max_queue=2)
    rows = metrics.rows_used.labels(model="tiny-en-pt")
    source = tiny_loaded.tokenizer.encode(TEXTS[0])
    long_config = tiny_loaded.generation.update(**LONG)
    try:
        async def scenario() -> list[FinishEvent]:
            first = scheduler.submit([source], [long_config], stream=True)
            events = first.events()
            assert isinstance(await anext(events), TokenEvent)  # decoding: the only row is taken
            waiting = scheduler.submit([source, source], [tiny_loaded.generation] * 2)
            assert scheduler.queued == 2
            with pytest.raises(Overloaded):
                scheduler.submit([source], [tiny_loaded.generation])
            first.cancel()  # its row goes to the waiting job
            return await waiting.results()

        finished = asyncio.run(scenario())
        assert [f.hypotheses[0].tokens for f in finished] == [
            generate(tiny_loaded.net, [source], tiny_loaded.generation)[0][0].tokens] * 2
        wait_for(lambda: rows._value.get() == 0 and scheduler.queued == 0)  # type: ignore[attr-defined]
    finally:
        scheduler.stop()


def test_a_killed_child_fails_its_requests_and_is_started_again(tiny_model_dir: Path,
                                                                 tiny_loaded: LoadedModel) -> None:
    settings = server_settings(tiny_model_dir, scheduler_process=True, watchdog_interval=3600)
    # about a thousand distinct sentences of 512 tokens: seconds of decoding, where one sentence of 200 tokens took
    # 30 ms with the compiled CPU step and could end before the kill
    texts = [" ".join(f"Open file {j}{i}." for i in range(120)) for j in range(8)]
    body = {"q": texts, "target": "pt", "options": {"min_new_tokens": 512, "max_new_tokens": 512}}
    with TestClient(create_app(settings)) as client:
        registry = client.app.state.registry  # type: ignore[attr-defined]
        scheduler = registry.models[0].scheduler
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(client.post, "/translate", json=body)
            wait_for(lambda: metric(client, 'tolk_kv_cache_rows_used{model="tiny-en-pt"}') > 0)
            os.kill(scheduler.transport.process.pid, signal.SIGKILL)
            r = pending.result(timeout=30)
        assert (r.status_code, r.json()["error_type"]) == (500, "engine_failure")
        wait_for(lambda: scheduler.dead)
        assert client.get("/ready").status_code == 503
        assert client.post("/translate", json=body).status_code == 503
        assert registry.revive() == ["tiny-en-pt"]
        assert client.get("/ready").status_code == 200
        assert client.post("/translate", json={"q": "Disk full.", "target": "pt"}).status_code == 200
        assert metric(client, 'tolk_scheduler_restarts_total{model="tiny-en-pt"}') == 1


def test_timeouts_and_shutdown_reach_the_client(tiny_model_dir: Path, tiny_loaded: LoadedModel) -> None:
    source = tiny_loaded.tokenizer.encode(TEXTS[2])
    # as long as the tiny model's positions allow (128): some 127 steps a sentence
    endless: GenerationConfig = tiny_loaded.generation.update(min_new_tokens=512, max_new_tokens=512)
    hasty = process_scheduler(tiny_model_dir, max_batch_rows=1, request_timeout=0.02)
    try:
        async def timed_out() -> None:
            # 64 sentences one row at a time: some 8,000 steps, far over 20 ms even where one step takes 10 us (a
            # single sentence's 127 steps took under 20 ms on a Zen 5 EPYC)
            with pytest.raises(TimedOut):
                await hasty.submit([source] * 64, [endless] * 64).results()

        asyncio.run(timed_out())
    finally:
        hasty.stop()

    scheduler = process_scheduler(tiny_model_dir, max_batch_rows=1)
    try:
        async def shut_down() -> None:
            decoding = scheduler.submit([source], [endless], stream=True)
            waiting = scheduler.submit([source], [endless])
            events = decoding.events()
            await anext(events)
            await asyncio.get_running_loop().run_in_executor(None, scheduler.stop)
            with pytest.raises(ShuttingDown):
                async for _ in events:
                    pass
            with pytest.raises(ShuttingDown):
                await waiting.results()

        asyncio.run(shut_down())
        assert not scheduler.running and not scheduler.dead
    finally:
        scheduler.stop()


def test_a_child_that_cannot_load_says_why(tmp_path: Path, tiny_model_dir: Path) -> None:
    settings = server_settings(tiny_model_dir, scheduler_process=True)
    scheduler = Scheduler(Target("missing", tmp_path, "cpu", "float32"), settings, Metrics(), 64, ProcessTransport())
    with pytest.raises(RuntimeError, match="failed to start"):
        scheduler.start()
    assert not scheduler.running
    with pytest.raises(NotReady):
        scheduler.submit([[5, 6]], [GenerationConfig()])
