"""Faults: out-of-memory halves the batch and loses nothing; a dead scheduler turns /ready to 503 and is restarted."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from model.checkpoint import LoadedModel
from server.app import create_app
from server.scheduler import Scheduler
from tests.helpers import (
    OPTIONS,
    TEXTS,
    batch_of,
    batcher_of,
    expected,
    inject,
    metric,
    metric_of,
    run_job,
    scheduler_of,
    server_settings,
    slow_steps,
    wait_for,
)


def test_out_of_memory_step_halves_the_rows_and_loses_nothing(scheduler: Scheduler, tiny_loaded: LoadedModel) -> None:
    """After three steps with every row, memory 'runs out' above 3 rows: the newest sentences leave and are decoded
    again; every sentence still ends exactly as alone, and streamed tokens are neither lost nor sent twice."""
    batch = batch_of(scheduler)
    assert batch is not None
    steps = inject(batch, "forward", lambda b: len(steps) > 3 and b.n > 3)
    sources = [tiny_loaded.tokenizer.encode(t) for t in TEXTS]
    configs = [tiny_loaded.generation.update(**o) for o in OPTIONS]
    streamed, finished = run_job(scheduler, sources, configs)

    assert steps[:4] == [7, 7, 7, 7]  # 7 rows (one sentence has two beams) until the fault
    assert max(steps[4:]) <= 3  # then the row limit holds
    assert metric_of(scheduler, "out_of_memory") >= 1
    for i, config in enumerate(configs):
        tokens = finished[i].hypotheses[0].tokens
        if config.beam_size == 1:  # beams stream only their final result
            assert streamed[i] == tokens, TEXTS[i]
        if config.do_sample and config.seed is None:
            continue  # a random seed: equal to itself streamed (above), nothing to compare offline
        assert tokens == expected(tiny_loaded, config, TEXTS[i]), TEXTS[i]
    wait_for(lambda: batch.n == 0)


def test_out_of_memory_admission_is_retried_with_half(scheduler: Scheduler, tiny_loaded: LoadedModel) -> None:
    batch = batch_of(scheduler)
    assert batch is not None
    admissions = inject(batch, "admit", lambda b, items: len(items) > 2)
    sources = [tiny_loaded.tokenizer.encode(t) for t in TEXTS]
    config = tiny_loaded.generation
    _, finished = run_job(scheduler, sources, [config] * len(TEXTS))
    assert admissions[:3] == [6, 3, 1]  # halved until it fits (3 // 2 = 1)
    assert [finished[i].hypotheses[0].tokens for i in range(len(TEXTS))] == [
        expected(tiny_loaded, config, t) for t in TEXTS]
    assert scheduler.queued == 0


def test_out_of_memory_with_one_sentence_fails_it_alone(scheduler: Scheduler, tiny_loaded: LoadedModel) -> None:
    batch = batch_of(scheduler)
    assert batch is not None
    inject(batch, "admit", lambda b, items: any(len(src) > 8 for _, src, _ in items))
    long_ = tiny_loaded.tokenizer.encode("Save changes before closing the file, then click here to continue.")
    assert len(long_) > 8
    with pytest.raises(Exception, match="out of memory"):
        run_job(scheduler, [long_], [tiny_loaded.generation])
    streamed, finished = run_job(scheduler, [tiny_loaded.tokenizer.encode("Disk full.")], [tiny_loaded.generation])
    assert streamed[0] == finished[0].hypotheses[0].tokens
    assert scheduler.running and scheduler.queued == 0


def test_dead_scheduler_fails_its_requests_turns_ready_to_503_and_is_restarted(tiny_model_dir: Path) -> None:
    # the test calls the supervisor itself
    settings = server_settings(tiny_model_dir, watchdog_interval=3600, scheduler_process=False)
    body = {"q": "Open the file.", "target": "pt", "options": {"min_new_tokens": 30, "max_new_tokens": 30}}
    with TestClient(create_app(settings)) as client:
        scheduler = scheduler_of(client)
        registry = client.app.state.registry  # type: ignore[attr-defined]
        died = threading.Event()

        def broken(now: float) -> None:
            died.set()
            raise RuntimeError("bug in the scheduler's bookkeeping (simulated)")

        with ThreadPoolExecutor(1) as pool, slow_steps(scheduler, 0.01):
            pending = pool.submit(client.post, "/translate", json=body)
            wait_for(lambda: (batch := batch_of(scheduler)) is not None and batch.n > 0)
            batcher_of(scheduler)._expire = broken  # type: ignore[method-assign]
            r = pending.result(timeout=30)
        assert died.is_set()
        assert (r.status_code, r.json()["error_type"]) == (500, "engine_failure")
        wait_for(lambda: scheduler.dead)
        assert client.get("/ready").status_code == 503
        assert client.post("/translate", json=body).status_code == 503
        assert registry.revive() == ["tiny-en-pt"]  # the bug is fixed by the restart: a fresh batcher
        assert client.get("/ready").status_code == 200
        assert client.post("/translate", json=body).status_code == 200
        assert metric(client, 'tolk_scheduler_restarts_total{model="tiny-en-pt"}') == 1


def test_supervisor_restarts_a_dead_scheduler_by_itself(tiny_model_dir: Path) -> None:
    settings = server_settings(tiny_model_dir, watchdog_interval=0.05, scheduler_process=False)
    with TestClient(create_app(settings)) as client:
        scheduler = scheduler_of(client)
        calls = 0

        def broken_once(now: float) -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("simulated")

        batcher_of(scheduler)._expire = broken_once  # type: ignore[method-assign]
        assert client.post("/translate", json={"q": "Open the file.", "target": "pt"}).status_code in (200, 500)
        wait_for(lambda: metric(client, 'tolk_scheduler_restarts_total{model="tiny-en-pt"}') == 1)
        wait_for(lambda: client.get("/ready").status_code == 200)
        assert client.post("/translate", json={"q": "Open the file.", "target": "pt"}).status_code == 200
