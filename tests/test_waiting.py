"""Waiting requests take turns: a short request behind a long document is admitted at one of the next free rows."""

from __future__ import annotations

import asyncio
from pathlib import Path

from model.checkpoint import LoadedModel
from model.events import FinishEvent
from server.jobs import Job
from server.waiting import Pending, Waiting
from tests.helpers import app_client, scheduler_of, slow_steps


def pending(request: int, n: int) -> list[Pending]:
    return [Pending(request, i, 1, 5) for i in range(n)]


def test_requests_take_turns_and_keep_their_own_order() -> None:
    w = Waiting()
    w.add(pending(0, 4))  # a document
    w.add(pending(1, 2))
    assert [(p.request, p.sentence) for p in w.order()] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (0, 3)]
    assert [(p.request, p.sentence) for p in w.take(1)] == [(0, 0)]
    w.add(pending(2, 1))  # arrives while the others wait
    assert [(p.request, p.sentence) for p in w.take(2)] == [(1, 0), (0, 1)]  # request 0 was served last
    assert [(p.request, p.sentence) for p in w.order()] == [(2, 0), (1, 1), (0, 2), (0, 3)]
    assert len(w) == 4


def test_sentences_sent_back_go_first_and_dropped_requests_vanish() -> None:
    w = Waiting()
    w.add(pending(0, 3))
    w.add(pending(1, 1))
    taken = w.take(3)  # (0, 0), (1, 0), (0, 1)
    w.push_front(taken)  # an admission ran out of memory: the same sentences, oldest first, go again first
    assert [(p.request, p.sentence) for p in w.order()][:3] == [(0, 0), (1, 0), (0, 1)]
    w.drop(0)
    assert [(p.request, p.sentence) for p in w.order()] == [(1, 0)] and len(w) == 1
    w.drop(1)
    assert not w and list(w.order()) == []


def test_a_short_request_does_not_wait_behind_a_long_document(tiny_model_dir: Path,
                                                              tiny_loaded: LoadedModel) -> None:
    document = [tiny_loaded.tokenizer.encode(f"Line {i} of the manual.") for i in range(24)]
    short = tiny_loaded.tokenizer.encode("Disk full.")
    config = tiny_loaded.generation.update(min_new_tokens=6, max_new_tokens=6)
    with app_client(tiny_model_dir, max_batch_rows=2) as client:
        scheduler = scheduler_of(client)

        async def scenario() -> list[str]:
            finished: list[str] = []

            async def read(job: Job, name: str) -> None:
                async for e in job.events():
                    if isinstance(e, FinishEvent):
                        finished.append(name)

            doc = asyncio.ensure_future(read(scheduler.submit(document, [config] * len(document)), "doc"))
            while not finished and not doc.done():  # the document is decoding, most of its sentences wait
                await asyncio.sleep(0.001)
            await asyncio.gather(doc, read(scheduler.submit([short], [config]), "short"))
            return finished

        with slow_steps(scheduler, 0.002):
            finished = client.portal.call(scenario)  # type: ignore[union-attr]
    assert finished.count("doc") == len(document)
    assert finished.index("short") <= 6  # behind what was decoding when it came; first come, first served: 25th
