"""A request's sentences as the event loop sees them: submitted together, their events read in order.

Events come from the batcher's thread (or the thread reading a child process's pipe); `deliver` hands them to
each job's event loop with one `call_soon_threadsafe` per loop and batch, so the event loop never waits on the
model and never runs model code.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from model.events import Event, FinishEvent
from server.errors import TolkError

log = logging.getLogger(__name__)


class Job:
    """One request's sentences: `events()` yields the model's events for them, or raises the error that ended it."""

    def __init__(self, request: int, n_sentences: int, stream: bool, cancel: Callable[[Job], None]) -> None:
        self.request = request
        self.n_sentences = n_sentences
        self.stream = stream  # only streaming jobs receive TokenEvents
        self.loop = asyncio.get_running_loop()
        self._cancel = cancel
        self._queue: asyncio.Queue[Event | TolkError] = asyncio.Queue()
        self._open = n_sentences  # sentences whose FinishEvent has not been read yet

    @property
    def done(self) -> bool:
        return self._open == 0

    def cancel(self) -> None:
        """Stop decoding and free the rows (a client went away). Harmless once the job is done."""
        if self._open:
            self._open = 0
            self._cancel(self)

    def put(self, items: list[Event | TolkError]) -> None:
        """Called on the job's event loop (through `deliver`)."""
        for item in items:
            self._queue.put_nowait(item)

    async def events(self) -> AsyncIterator[Event]:
        """TokenEvents (streaming jobs only) and one FinishEvent per sentence; raises the job's error if it fails."""
        while self._open:
            item = await self._queue.get()
            if isinstance(item, TolkError):
                self._open = 0
                raise item
            if isinstance(item, FinishEvent):
                self._open -= 1
            yield item

    async def results(self) -> list[FinishEvent]:
        """Wait for every sentence; FinishEvents in sentence order."""
        out: dict[int, FinishEvent] = {}
        async for event in self.events():
            if isinstance(event, FinishEvent):
                out[event.sentence] = event
        return [out[i] for i in range(self.n_sentences)]


def deliver(out: dict[Job, list[Event | TolkError]]) -> None:
    """Hand events to their jobs' event loops (from any thread): one callback per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Job, list[Event | TolkError]]]] = {}
    for job, items in out.items():
        by_loop.setdefault(job.loop, []).append((job, items))
    for loop, batches in by_loop.items():
        try:
            loop.call_soon_threadsafe(_dispatch, batches)
        except RuntimeError:  # the loop has closed: nobody is listening any more
            log.debug("event loop closed; %d jobs' events dropped", len(batches))


def _dispatch(batches: list[tuple[Job, list[Event | TolkError]]]) -> None:
    for job, items in batches:
        job.put(items)
