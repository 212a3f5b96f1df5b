"""Fair admission: a long request enters the batch in pieces within the queue's bound, and one request holds at
most its share of the rows, so a short request from another client is neither refused (429) nor kept waiting
behind it. Probed as a client would: a 3,000-line file made 28 of 39 short requests 429; four texts with a beam of
8 held every row while short requests waited 3.5 s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from model.checkpoint import LoadedModel
from model.decode import DecodeBatch
from model.events import FinishEvent
from model.generation import GenerationConfig
from model.search import steps
from server import batcher
from server.jobs import Job
from server.messages import Submit
from server.scheduler import Scheduler
from server.waiting import Pending, Waiting
from tests.helpers import app_client, scheduler_of, wait_for

LINES = "".join(f"Line {i} of the manual.\n" for i in range(80))  # 80 sentences in one text
SLOW = {"min_new_tokens": 8, "max_new_tokens": 8}


# --- the share of rows, in the waiting order -------------------------------------------------------------------

def keys(items: Iterator[Pending] | list[Pending]) -> list[tuple[int, int]]:
    return [(p.request, p.sentence) for p in items]


def test_a_request_stops_at_its_share_of_rows() -> None:
    w = Waiting(share=4)
    w.add(Pending(0, i, 2, 5) for i in range(4))  # four sentences with a beam of 2: 8 rows wanted
    w.add([Pending(1, 0, 1, 5)])
    assert keys(w.order()) == [(0, 0), (1, 0), (0, 1)]  # 2 + 2 rows: the third would pass 4
    assert keys(w.order({0: 2})) == [(0, 0), (1, 0)]  # holding 2 already
    assert keys(w.order({0: 4})) == [(1, 0)]  # at its share: only the other request
    assert keys(w.take(5, {0: 4})) == [(1, 0)]
    assert keys(w.order()) == [(0, 0), (0, 1)]


def test_a_request_holding_no_rows_may_take_a_beam_wider_than_its_share() -> None:
    w = Waiting(share=2)
    w.add([Pending(0, 0, 8, 5), Pending(0, 1, 8, 5)])
    assert keys(w.order()) == [(0, 0)]
    assert keys(Waiting().order({0: 30})) == []  # (nothing waits)


# --- a request in pieces ----------------------------------------------------------------------------------------

def test_pieces_of_a_submit_join_back_into_it(tiny_loaded: LoadedModel) -> None:
    config = tiny_loaded.generation
    whole = Submit(7, [[5, 6, 2], [7, 2], [8, 9, 2], [4, 2]], [config] * 4, False, 1.0, 1.0,
                   [[], [[[11, 12]]], [], []], [None, [[0]], None, None])
    first, second = whole.piece(0, 3), whole.piece(3, 4)
    assert (first.first, first.total, second.first, second.total) == (0, 4, 3, 4)
    assert first.count == second.count == 4
    assert first.extend(second).sources == whole.sources
    assert first.extend(second).constraints == whole.constraints
    plain = Submit(7, [[5, 2]], [config], False, 1.0, 1.0)
    joined = plain.extend(whole.piece(1, 2))
    assert joined.constraints == [[], [[[11, 12]]]] and joined.constraint_sources == [None, [[0]]]


def test_a_long_request_is_queued_in_pieces(tiny_model_dir: Path, tiny_loaded: LoadedModel) -> None:
    """80 sentences with a window of 8: the queue holds at most the window, and the answers are the same."""
    sources = [tiny_loaded.tokenizer.encode(f"Line {i} of the manual.") for i in range(80)]
    config = tiny_loaded.generation.update(**SLOW)
    with app_client(tiny_model_dir, max_batch_rows=4, max_queue=24) as client:
        scheduler = scheduler_of(client)
        assert scheduler.window == 8
        most = 0

        async def run() -> list[list[int]]:
            nonlocal most
            job = scheduler.submit(sources, [config] * len(sources))
            results = asyncio.ensure_future(job.results())
            while not results.done():
                most = max(most, scheduler.queued)
                await asyncio.sleep(0.001)
            return [f.hypotheses[0].tokens for f in results.result()]

        tokens = client.portal.call(run)  # type: ignore[union-attr]
        alone = client.portal.call(one_by_one, scheduler, sources, config)  # type: ignore[union-attr]
    assert 0 < most <= 8
    assert tokens == alone


async def one_by_one(scheduler: Scheduler, sources: list[list[int]], config: GenerationConfig) -> list[list[int]]:
    out = []
    for source in sources:
        finished = await scheduler.submit([source], [config]).results()
        out.append(finished[0].hypotheses[0].tokens)
    return out


def test_short_requests_are_not_refused_while_a_long_one_translates(tiny_model_dir: Path) -> None:
    """Before: the 80 lines were queued whole (the queue was empty), and every short request then got 429."""
    with app_client(tiny_model_dir, max_batch_rows=4, max_queue=24) as client:
        scheduler = scheduler_of(client)
        with ThreadPoolExecutor(1) as pool:
            long = pool.submit(client.post, "/translate", json={"q": LINES, "target": "pt", "options": SLOW})
            wait_for(lambda: scheduler.queued > 0)
            statuses = []
            while not long.done():
                statuses.append(client.post("/translate", json={"q": "Disk full.", "target": "pt"}).status_code)
            assert long.result().status_code == 200
    assert len(statuses) >= 3 and set(statuses) == {200}


def test_a_cancelled_long_request_leaves_nothing_queued(tiny_model_dir: Path, tiny_loaded: LoadedModel) -> None:
    sources = [tiny_loaded.tokenizer.encode(f"Line {i} of the manual.") for i in range(40)]
    config = tiny_loaded.generation.update(**SLOW)
    with app_client(tiny_model_dir, max_batch_rows=2, max_queue=24) as client:
        scheduler = scheduler_of(client)

        async def run() -> None:
            job = scheduler.submit(sources, [config] * len(sources))
            events = job.events()
            while not isinstance(await anext(events), FinishEvent):
                pass
            job.cancel()
            await asyncio.sleep(0.05)

        client.portal.call(run)  # type: ignore[union-attr]
        wait_for(lambda: scheduler.queued == 0 and not scheduler.busy)
        assert client.post("/translate", json={"q": "Disk full.", "target": "pt"}).status_code == 200


# --- the share of rows, through the batcher ----------------------------------------------------------------------

@contextmanager
def rows_per_step(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[int, int]]]:
    """The rows each request holds at every turn of decoding (whichever step the batch takes)."""
    seen: list[dict[int, int]] = []

    def recorded(batch: DecodeBatch, most: int = 1) -> Any:
        held: dict[int, int] = {}
        for (request, _), seq in batch.seqs.items():
            held[request] = held.get(request, 0) + seq.beam
        seen.append(held)
        time.sleep(0.002)
        return steps(batch, most)

    monkeypatch.setattr(batcher, "steps", recorded)
    yield seen


def test_one_request_leaves_rows_for_the_next(tiny_model_dir: Path, tiny_loaded: LoadedModel,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Four sentences with a beam of 2 want all 8 rows; they get 6, and a short request joins within a few steps
    (before: it waited for one of them to finish, 30 steps)."""
    wide = tiny_loaded.generation.update(beam_size=2, min_new_tokens=30, max_new_tokens=30)
    sources = [tiny_loaded.tokenizer.encode(f"Open file {i}.") for i in range(4)]
    short = tiny_loaded.tokenizer.encode("Disk full.")
    with app_client(tiny_model_dir, max_batch_rows=8, steps_at_once_ms=0) as client:
        scheduler = scheduler_of(client)
        with rows_per_step(monkeypatch) as seen:

            async def run() -> tuple[int, Job]:
                big = scheduler.submit(sources, [wide] * 4)
                deadline = time.monotonic() + 10
                while len(seen) < 3:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.001)
                arrived = len(seen)
                await scheduler.submit([short], [tiny_loaded.generation]).results()
                await big.results()
                return arrived, big

            arrived, big = client.portal.call(run)  # type: ignore[union-attr]
    assert max(held.get(big.request, 0) for held in seen) == 6
    joined = next(i for i, held in enumerate(seen) if len(held) > 1)
    assert joined - arrived <= 3
