"""The event loop's side of one model's continuous batching: jobs, the queue's limit, and the way to the batcher.

`submit` turns a request's sentences into a `Job` and sends them to the model's `Batcher` (server/batcher.py)
through a `Transport` (server/transport.py): a child process by default, a thread of this process in tests. The
batcher's `Output` comes back on another thread; its events go to their jobs' event loops (server/jobs.py) and its
metrics to the collectors. When the batcher ends without being asked (`Exited`), every job still open fails (500)
and `dead` turns true, so the registry's supervisor calls `restart()`.

A long request goes to the batcher in pieces: at most `window` of its sentences are there unfinished at once, and
the next piece is sent (from the job's event loop) when half of them have finished. So a 6,000-line document fills
the rows without filling the queue, and the queue's bound (429) measures a full server, not one busy with a file:
a request arriving at an empty queue was always taken whole, and 3,000 lines then refused everyone else.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import random
import threading
import time
from dataclasses import dataclass, field

from model.events import Event, FinishEvent, TokenEvent
from model.generation import GenerationConfig
from server.cache import CacheKey, Finished, cache_keys
from server.errors import EngineFailure, NotReady, Overloaded, ShuttingDown, TolkError
from server.jobs import Job, deliver
from server.messages import Cancel, Exited, Output, Ready, Submit, Target
from server.metrics import Metrics, SchedulerStats
from server.settings import Settings
from server.shared_cache import open_cache
from server.transport import Transport

log = logging.getLogger(__name__)


@dataclass
class _Open:
    """A job with sentences at the batcher."""

    job: Job
    due: set[int]  # sentences whose FinishEvent has not come yet
    keys: list[CacheKey | None]  # each sentence's translation-cache key (None: never kept)
    sent: list[int] | None = None  # the request's index of each sentence sent (None: all were, in order)
    copies: dict[int, list[int]] = field(default_factory=dict)  # a sentence sent -> its repeats in the request
    logprobs: dict[int, list[float]] = field(default_factory=dict)  # streamed token log-probs per sentence
    rest: Submit | None = None  # every sentence to send, when they go in pieces
    next: int = 0  # of those, how many were sent
    open: int = 0  # sentences sent whose FinishEvent has not come
    refilling: bool = False  # a next piece is on its way to the event loop


def _with_copies(events: list[Event | TolkError], copies: dict[int, list[int]]) -> list[Event | TolkError]:
    """Each event of a sentence followed by the same event for each of its repeats in the request."""
    out: list[Event | TolkError] = []
    for e in events:
        out.append(e)
        if not isinstance(e, TolkError):
            out.extend(dataclasses.replace(e, sentence=j) for j in copies.get(e.sentence, ()))
    return out


class Scheduler:
    """One model's jobs and its batcher, wherever the transport runs it."""

    def __init__(self, target: Target, settings: Settings, metrics: Metrics, max_source_tokens: int,
                 transport: Transport) -> None:
        self.name = target.name
        self.target = target
        self.settings = settings
        self.max_source_tokens = max_source_tokens
        self.transport = transport
        self.window = max(1, min(settings.max_queue, 2 * settings.max_batch_rows))  # a request's unfinished sentences
        self.ready: Ready | None = None  # what the batcher said when it started
        self._metrics = metrics
        self._lock = threading.Lock()  # guards _jobs, _submitted and _left
        self._jobs: dict[int, _Open] = {}  # request -> its job and sentences still at the batcher
        self._requests = itertools.count()
        self._submitted = 0  # sentences sent to the batcher
        self._left = 0  # of those, how many have left its queue (admitted or dropped), as it last said
        self._stopping = threading.Event()
        self._failure: str | None = None
        self.cache = open_cache(settings, target.name, target.directory)
        for counter in (metrics.out_of_memory, metrics.restarts):  # at 0 from the start: a panel shows 0, not nothing
            counter.labels(model=self.name)

    @property
    def running(self) -> bool:
        return self.transport.alive and not self._stopping.is_set() and self._failure is None

    @property
    def dead(self) -> bool:
        """The batcher started and then ended without being asked to stop."""
        return self.ready is not None and not self._stopping.is_set() and not self.transport.alive

    @property
    def failure(self) -> str | None:
        return self._failure

    @property
    def busy(self) -> bool:
        """Some job still has sentences at the batcher."""
        with self._lock:
            return bool(self._jobs)

    @property
    def queued(self) -> int:
        """Sentences submitted and not yet admitted."""
        return self._submitted - self._left

    def start(self, timeout: float = 300.0) -> None:
        """Start the batcher and wait until it has loaded the model and allocated its cache."""
        ready = self.transport.start(self.target, self.settings, self.max_source_tokens, self._receive, timeout)
        with self._lock:
            self._submitted = self._left = 0
        self.ready, self._failure = ready, None

    def restart(self, timeout: float = 300.0) -> None:
        """A fresh batcher after the last one died; the jobs it held were already failed."""
        if self._stopping.is_set() or self.transport.alive:
            return
        self._metrics.restarts.labels(model=self.name).inc()
        self.start(timeout)

    def stop(self) -> None:
        """The batcher fails what it holds (503) and ends; what never reached it fails here."""
        self._stopping.set()
        self.transport.stop()
        self._fail_all(ShuttingDown("the server is shutting down"))

    def submit(self, sources: list[list[int]], configs: list[GenerationConfig], stream: bool = False,
               timeout: float | None = None, constraints: list[list[list[list[int]]]] | None = None,
               constraint_sources: list[list[list[int]] | None] | None = None) -> Job:
        """Queue a request's sentences; raises NotReady, or Overloaded (429) when the queue is full.

        The job fails with 504 after `timeout` seconds (default: the settings' request_timeout). `constraints`: per
        sentence, the terms its translation must contain (each a list of alternative target-token sequences, as
        model.constraints takes them); such a sentence is
        never answered from, nor kept in, the translation cache. `constraint_sources`: per sentence, the source
        positions of each of its terms, or None.
        """
        if not self.running:
            raise NotReady(f"model {self.name} is not running")
        # Samples get their seed now, so that a sentence decoded again after an out-of-memory error comes out the same.
        configs = [c.update(seed=random.getrandbits(62)) if c.do_sample and c.seed is None else c for c in configs]
        keys = cache_keys(sources, configs)
        if constraints is not None:
            keys = [None if terms else key for key, terms in zip(keys, constraints, strict=True)]
        failures = self.cache.errors
        hits = self.cache.lookup(keys, stream, [c.scores for c in configs]) if self.cache.enabled else {}
        first: dict[CacheKey, int] = {}  # a sentence repeated within the request is decoded once
        copies: dict[int, list[int]] = {}
        sent = []
        for i, key in enumerate(keys):
            if i in hits:
                continue
            if key is not None and self.cache.enabled and key in first:
                copies.setdefault(first[key], []).append(i)
                continue
            if key is not None:
                first[key] = i
            sent.append(i)
        if self.cache.enabled:
            kept = len(keys) - keys.count(None)  # sampled sentences are neither hits nor misses
            missed = "error" if self.cache.errors > failures else "miss"  # the shared cache could not be read
            self._metrics.translation_cache.labels(model=self.name, result="hit").inc(len(hits))
            self._metrics.translation_cache.labels(model=self.name, result=missed).inc(kept - len(hits))
        timeout = timeout if timeout is not None else self.settings.request_timeout
        terms = [constraints[i] for i in sent] if constraints is not None and any(constraints) else None
        where = [constraint_sources[i] for i in sent] if terms is not None and constraint_sources is not None else None
        head = min(len(sent), self.window)  # the first piece
        with self._lock:
            if sent and self.queued and self.queued + head > self.settings.max_queue:
                raise Overloaded("too many sentences are waiting; retry later", self.settings.retry_after)
            job = Job(next(self._requests), len(sources), stream, self.cancel)
            if sent:
                whole = Submit(job.request, [sources[i] for i in sent], [configs[i] for i in sent], stream,
                               time.monotonic() + timeout, timeout, terms, where)
                self._submitted += head
                due = set(sent).union(*copies.values())
                renumbered = len(sent) < len(sources)
                self._jobs[job.request] = _Open(job, due, keys, sent if renumbered else None, copies,
                                                rest=whole if head < len(sent) else None, next=head, open=head)
        if hits:  # answered here, before anything the batcher sends
            job.put([event for i, entry in hits.items() for event in entry.events(job.request, i, stream)])
        if not sent:
            return job
        submit = whole.piece(0, head) if head < len(sent) else whole
        if not self.transport.send(submit):
            self._forget(job.request)
            raise NotReady(f"model {self.name} is not running")
        return job

    def cancel(self, job: Job) -> None:
        if self._forget(job.request):
            self.transport.send(Cancel(job.request))

    def _send_more(self, request: int) -> None:
        """The request's next piece, on its event loop (`_receive`'s thread must not wait on the batcher's pipe)."""
        with self._lock:
            entry = self._jobs.get(request)
            if entry is None or entry.rest is None:
                return
            entry.refilling = False
            start, stop = entry.next, min(len(entry.rest.sources), entry.next + self.window - entry.open)
            if stop <= start:
                return
            entry.next, entry.open = stop, entry.open + stop - start
            self._submitted += stop - start
            piece = entry.rest.piece(start, stop)
            if stop == len(entry.rest.sources):
                entry.rest = None
        self.transport.send(piece)  # a batcher that is gone fails the job through `Exited`

    def _forget(self, request: int) -> bool:
        with self._lock:
            return self._jobs.pop(request, None) is not None

    def _receive(self, message: Output | Exited) -> None:
        """The batcher's output (on the thread that carries it): events to their jobs, then metrics to the collectors.

        Events first: the event loop starts waking while the metrics (a few dozen histogram observations a request
        at one client) are applied, instead of after. The loop runs no Python until this thread lets go of the GIL
        (at its next read, or after the interpreter's switch interval of 5 ms), so a response does not go out
        before its metrics are counted."""
        if isinstance(message, Exited):
            self._failure = message.reason
            log.error("batcher of %s: %s", self.name, message.reason)
            self._fail_all(EngineFailure("the engine failed while translating"))
            return
        out: dict[Job, list[Event | TolkError]] = {}
        finished: list[Finished] = []
        more: list[Job] = []  # jobs whose next piece is due
        with self._lock:
            self._left = message.left
            for request, events in message.events.items():
                entry = self._jobs.get(request)
                if entry is None:  # cancelled here after the batcher sent these
                    continue
                if entry.rest is not None:
                    entry.open -= sum(isinstance(e, FinishEvent) for e in events)
                    if not entry.refilling and entry.open <= self.window // 2:
                        entry.refilling = True
                        more.append(entry.job)
                if entry.sent is not None:  # some sentences were not sent: number the rest as the request did
                    events = [e if isinstance(e, TolkError) else dataclasses.replace(e, sentence=entry.sent[e.sentence])
                              for e in events]
                if entry.copies:  # and a sentence's repeats get its events
                    events = _with_copies(events, entry.copies)
                for event in events:
                    if isinstance(event, TolkError):
                        entry.due.clear()
                    elif isinstance(event, FinishEvent):
                        entry.due.discard(event.sentence)
                        self._keep(entry, event, finished)
                    elif isinstance(event, TokenEvent) and entry.job.stream:
                        entry.logprobs.setdefault(event.sentence, []).append(event.logprob)
                if not entry.due:
                    del self._jobs[request]
                out[entry.job] = events
        # Kept before delivering where that costs nothing (in memory): a client that has its answer and asks again
        # at once must find it (the loop may take the GIL from this thread between the two, on a loaded machine).
        # Redis is a round trip away: after delivering, and outside the lock.
        local = self.cache.enabled and self.cache.local
        if local:
            self.cache.put_many(finished)
        deliver(out)
        for job in more:
            try:
                job.loop.call_soon_threadsafe(self._send_more, job.request)
            except RuntimeError:  # its event loop has closed: nobody waits for it any more
                self._forget(job.request)
        message.stats.apply(self._metrics, self.name)
        if self.cache.enabled and not local:
            self.cache.put_many(finished)

    def _keep(self, entry: _Open, event: FinishEvent, finished: list[Finished]) -> None:
        """A finished sentence is to go into the translation cache (with its streamed token log-probs, if any)."""
        key = entry.keys[event.sentence]
        if key is not None:
            streamed = entry.job.stream and key[1].beam_size == 1
            finished.append((key, event, entry.logprobs.pop(event.sentence, []) if streamed else None))

    def _fail_all(self, error: TolkError) -> None:
        with self._lock:
            jobs = [entry.job for entry in self._jobs.values()]
            self._jobs.clear()
            self._submitted = self._left = 0
        SchedulerStats(running=0, waiting=0, rows_used=0).apply(self._metrics, self.name)
        deliver({job: [error] for job in jobs})
