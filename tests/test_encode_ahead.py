"""Encoding ahead (server/batcher.py): sentences that join a decoding batch are encoded on the encoder thread, and
come out as if translated alone; a request that ends while its sentences encode leaves no rows behind, and an
out-of-memory encoding is retried with half the sentences."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import torch

from model.checkpoint import LoadedModel
from model.decode import DecodeBatch, Encoded
from model.events import FinishEvent
from server.batcher import cpu_cores
from server.jobs import Job
from server.scheduler import Scheduler
from tests.helpers import OPTIONS, TEXTS, app_client, batch_of, batcher_of, expected, scheduler_of, slow_steps, wait_for

LONG = "Save changes before closing the file, then click here to continue."


def on_encoder_thread() -> bool:
    return threading.current_thread().name.startswith("tolk-encoder")


def watch_encode(batch: DecodeBatch, delay: float = 0.0, fails: Any = None) -> list[tuple[str, int]]:
    """Record (thread name, sources) of every batch.encode; on the encoder thread, sleep `delay` first and raise an
    out-of-memory error where fails(sources) says so."""
    original = batch.encode
    seen: list[tuple[str, int]] = []

    def encode(sources: list[list[int]]) -> Encoded:
        seen.append((threading.current_thread().name, len(sources)))
        if on_encoder_thread():
            time.sleep(delay)
            if fails is not None and fails(sources):
                raise torch.OutOfMemoryError("out of memory (simulated)")
        return original(sources)

    batch.encode = encode  # type: ignore[method-assign]
    return seen


async def results(job: Job) -> dict[int, FinishEvent]:
    return {e.sentence: e async for e in job.events() if isinstance(e, FinishEvent)}


def long_job(scheduler: Scheduler, loaded: LoadedModel) -> Job:
    """One sentence that keeps the batch decoding for 60 steps."""
    return scheduler.submit([loaded.tokenizer.encode(LONG)], [loaded.generation.update(min_new_tokens=60,
                                                                                       max_new_tokens=60)])


def test_sentences_joining_a_decoding_batch_are_encoded_ahead_and_decode_as_alone(
        scheduler: Scheduler, tiny_loaded: LoadedModel) -> None:
    batch = batch_of(scheduler)
    assert batch is not None
    seen = watch_encode(batch)
    configs = [tiny_loaded.generation.update(**o) for o in OPTIONS]
    sources = [tiny_loaded.tokenizer.encode(t) for t in TEXTS]

    async def scenario() -> tuple[dict[int, FinishEvent], list[dict[int, FinishEvent]]]:
        first = long_job(scheduler, tiny_loaded)
        await asyncio.sleep(0)
        wait_for(lambda: batch.n > 0)
        jobs = [scheduler.submit([src], [c]) for src, c in zip(sources, configs, strict=True)]
        return await results(first), [await results(j) for j in jobs]

    with slow_steps(scheduler, 0.005):  # 60 steps of the tiny model otherwise end before wait_for looks
        first, each = asyncio.run(scenario())
    assert any(on_encoder for on_encoder in (name.startswith("tolk-encoder") for name, _ in seen))
    assert len(first[0].hypotheses[0].tokens) == 60
    for i, (text, config) in enumerate(zip(TEXTS, configs, strict=True)):
        if not config.do_sample:  # a sample's seed is drawn at submission; alone it would be another
            assert each[i][0].hypotheses[0].tokens == expected(tiny_loaded, config, text), text
    wait_for(lambda: batch.n == 0)
    assert scheduler.queued == 0


def test_a_request_cancelled_while_its_sentences_encode_leaves_no_rows(
        scheduler: Scheduler, tiny_loaded: LoadedModel) -> None:
    batch = batch_of(scheduler)
    assert batch is not None
    seen = watch_encode(batch, delay=0.1)
    config = tiny_loaded.generation

    async def scenario() -> tuple[dict[int, FinishEvent], dict[int, FinishEvent]]:
        first = long_job(scheduler, tiny_loaded)
        wait_for(lambda: batch.n > 0)
        cancelled = scheduler.submit([tiny_loaded.tokenizer.encode(t) for t in TEXTS[:3]], [config] * 3)
        wait_for(lambda: any(name.startswith("tolk-encoder") for name, _ in seen))  # its encoding is under way
        cancelled.cancel()
        after = scheduler.submit([tiny_loaded.tokenizer.encode(TEXTS[3])], [config])
        return await results(first), await results(after)

    with slow_steps(scheduler, 0.01):  # the first request decodes for 0.6 s: the cancel lands while it encodes
        first, after = asyncio.run(scenario())
    assert len(first[0].hypotheses[0].tokens) == 60
    assert after[0].hypotheses[0].tokens == expected(tiny_loaded, config, TEXTS[3])
    wait_for(lambda: batch.n == 0 and not batch.seqs)
    assert scheduler.queued == 0


def test_out_of_memory_while_encoding_ahead_is_retried_with_half(
        scheduler: Scheduler, tiny_loaded: LoadedModel) -> None:
    batch = batch_of(scheduler)
    assert batch is not None
    seen = watch_encode(batch, fails=lambda sources: len(sources) > 2)
    config = tiny_loaded.generation
    sources = [tiny_loaded.tokenizer.encode(t) for t in TEXTS]

    async def scenario() -> dict[int, FinishEvent]:
        first = long_job(scheduler, tiny_loaded)
        wait_for(lambda: batch.n > 0)
        job = scheduler.submit(sources, [config] * len(TEXTS))
        finished = await results(job)
        await results(first)
        return finished

    with slow_steps(scheduler, 0.005):  # as above: the first request must still decode when the second comes
        finished = asyncio.run(scenario())
    ahead = [n for name, n in seen if name.startswith("tolk-encoder")]
    assert ahead[:3] == [6, 3, 1]  # halved until it fits (3 // 2 = 1)
    assert [finished[i].hypotheses[0].tokens for i in range(len(TEXTS))] == [
        expected(tiny_loaded, config, t) for t in TEXTS]
    assert scheduler.queued == 0


def test_no_encoder_thread_where_the_decoder_takes_every_core(tiny_model_dir: Path) -> None:
    """Encoding ahead needs a core the decoder leaves free: with as many torch threads as cores, the second of which
    waits for steps spinning, an encoder thread beside them made float32 at 8 clients 3.2 times slower on 2 cores
    (`bench/ab_serve.py`, docs/benchmarks.md). Fewer threads than cores keep it."""
    cores = cpu_cores()
    for threads, ahead in ((cores, False), (cores - 1, True)):
        if threads < 1:
            continue
        with app_client(tiny_model_dir, threads=threads) as client:
            assert (batcher_of(scheduler_of(client))._encoder is not None) is ahead  # noqa: SLF001
