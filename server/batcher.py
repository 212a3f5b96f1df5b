"""Continuous batching: the one thread that owns a model's device.

Commands (`Submit`, `Cancel`) enter through an inbox. The thread loops: take commands, fail requests past their
deadline, admit waiting sentences while there are free cache rows and the admission's source tokens fit the budget
(`model.search.admissible`), then run ONE decoder step for every active row (`model.search.steps`). Finished
sentences leave the batch at once, so their rows go to the next waiting sentence at the next step. While no sentence
waits to join, plain greedy rows on the CPU take several steps at once in one compiled call, until one of them
finishes or about `steps_at_once_ms` has passed: the same tokens, without the Python between steps. What a turn
produced (events, errors, metrics) goes up as one `Output` through `emit`; the thread knows nothing of event loops
or processes, so the same code runs as a thread of the server or in a child process (server/transport.py).

Encoding ahead: on the CPU, sentences that join a batch already decoding are encoded on a second thread (the
encoder thread) while this one goes on stepping, and join the batch at the first turn after their encoding ends;
encoding is a third to a half of the engine's work on a loaded server, and the decode thread's core need not wait
for it. One admission is in flight at a time; sentences arriving meanwhile wait and are encoded together next.
Torch releases the GIL inside its operators and the fused step releases it throughout, so the two threads run at
once. When the batch is empty there is nothing to overlap: sentences are encoded on this thread, as on a GPU.

Faults: a step or admission that raises fails the requests it touched (500) and the thread goes on with a fresh
batch. An out-of-memory error halves instead: an admission is retried with half the sentences, and a step drops its
newest half of the rows back to the head of the queue (they are decoded again from the start; tokens already
streamed are not sent twice) and lowers the row limit, which climbs back after `recover_steps` calm steps. If the
thread itself dies, its requests fail (500) and it emits `Exited`, so the scheduler can start a fresh one.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import cast

import torch

from model import runtime
from model.decode import DecodeBatch, Encoded
from model.events import Event, TokenEvent
from model.frozen import FrozenTransformer
from model.search import admissible, steps
from server.errors import EngineFailure, ShuttingDown, TimedOut, TolkError
from server.messages import Cancel, Command, Exited, Output, Stop, Submit
from server.settings import Settings
from server.waiting import Pending, Waiting

log = logging.getLogger(__name__)

Emit = Callable[[Output | Exited], None]
STATS_EVERY = 0.05  # seconds: metrics without events wait at most this long before they go up


@dataclass
class _Record:
    """What the thread knows about a live request."""

    submit: Submit
    received: float
    admitted: int = 0  # sentences 0..admitted-1 have been admitted (admission is in sentence order)
    finished: int = 0
    first_event: bool = False
    last_token: dict[int, float] = field(default_factory=dict)
    emitted: dict[int, int] = field(default_factory=dict)  # tokens sent, per sentence
    skip: dict[int, int] = field(default_factory=dict)  # tokens of a sentence decoded again to drop, not resend


@dataclass
class _Ahead:
    """Sentences taken from the queue that are being encoded on the encoder thread."""

    items: list[Pending]
    encoded: Future[Encoded]


class Batcher:
    """Owns one model's DecodeBatch and the thread that drives it; one instance runs one thread, once."""

    def __init__(self, name: str, net: FrozenTransformer, settings: Settings, max_source_tokens: int,
                 emit: Emit, commands: Connection | None = None) -> None:
        """`commands`: in a child process, the pipe from the server, read by this thread itself (a thread that read
        it and passed each command on was one more wake-up per request: on this 2-core VM, waking an idle thread
        costs about 0.1 ms); otherwise commands come through `put`."""
        self.name = name
        self.net = net
        self.settings = settings
        self.max_source_tokens = max_source_tokens
        self.batch: DecodeBatch | None = None  # created and touched only by the thread
        self.failure: BaseException | None = None
        self.recover_steps = 256  # steps without a fault before the row limit and admission cap double again
        self._emit = emit
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._commands = commands
        # requests take turns, each within its share of the rows (server/waiting.py)
        self._waiting = Waiting(settings.max_request_rows or max(1, settings.max_batch_rows * 3 // 4))
        self._records: dict[int, _Record] = {}
        self._out = Output()
        self._gauges: tuple[int, int] = (0, 0)  # (running, waiting) as last sent
        self._left_sent = 0
        self._stats_sent = 0.0  # when metrics last went up
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"tolk-batcher-{name}", daemon=True)
        self._row_limit = settings.max_batch_rows  # lowered after an out-of-memory step
        self._admit_cap = 0  # sentences per admission, 0 = no cap; set after an out-of-memory admission
        self._calm_steps = 0
        self._step_s = 0.0  # the last decoder step's time, a step of a run of steps at once counted as its share
        self._encoder: ThreadPoolExecutor | None = None  # encodes sentences ahead, on the CPU (module docstring)
        self._ahead: _Ahead | None = None

    # --- any thread ---------------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._started.is_set() and self._thread.is_alive() and not self._stopping.is_set()

    @property
    def alive(self) -> bool:
        """The thread has not ended (it may be stopping)."""
        return self._thread.is_alive()

    def start(self, timeout: float = 300.0) -> int:
        """Start the thread and wait until its cache is allocated; its size in bytes. Raises what went wrong."""
        self._thread.start()
        self._started.wait(timeout)
        if self.failure is not None or self.batch is None:
            raise RuntimeError(f"batcher of {self.name} failed to start: {self.failure}") from self.failure
        return self.batch.cache.nbytes

    def put(self, command: Command) -> None:
        self._inbox.put(command)

    def join(self) -> None:
        """Wait until the thread ends: told to stop, the server gone, or the thread dead."""
        self._thread.join()

    def stop(self) -> None:
        """Fail what is still queued or decoding (503) and join the thread."""
        self._stopping.set()
        self._inbox.put(Stop())
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    # --- the thread ---------------------------------------------------------------------------------------------

    def _new_batch(self) -> DecodeBatch:
        s = self.settings
        graphs = s.cuda_graphs and self.net.device.type == "cuda"
        batch = DecodeBatch(self.net, s.max_batch_rows, self.max_source_tokens, s.max_new_tokens, graphs=graphs)
        self._out.stats.cache_bytes = batch.cache.nbytes
        self._out.stats.rows_used = 0
        self._out.stats.row_limit = self._row_limit
        return batch

    def _run(self) -> None:
        try:
            threads = self.settings.threads or (cpu_threads() if self.net.device.type == "cpu" else None)
            if threads:
                torch.set_num_threads(threads)
            if (threads or 1) > 1 and self.net.device.type == "cpu":
                self.net.warm_parts()  # steps cut over the threads: compiled before the scheduler says it runs
            self.batch = batch = self._new_batch()
            if self.settings.encode_ahead and self.settings.batching and self.net.device.type == "cpu":
                if (threads or torch.get_num_threads()) >= cpu_cores():  # no core left for it (`encode_ahead`)
                    log.info("sentences are encoded in the decode thread: its %d torch threads take every core",
                             threads or torch.get_num_threads())
                else:
                    self._encoder = ThreadPoolExecutor(1, f"tolk-encoder-{self.name}", torch.set_num_threads,
                                                       (threads or torch.get_num_threads(),))
        except Exception as exc:  # reported to start()
            self.failure = exc
            self._started.set()
            return
        self._started.set()
        log.info("batcher of %s running: %d rows, %.1f MB of KV cache", self.name, batch.cache.rows,
                 batch.cache.nbytes / 1e6)
        try:
            while not self._stopping.is_set():
                self._receive(block=not self._waiting and not len(batch) and self._ahead is None)
                self._expire(time.monotonic())
                try:
                    if self._admit(batch):
                        self._flush()  # the queue shrank: the scheduler's bound (429) should know before the step
                    if len(batch):
                        self._step(batch)
                except Exception:
                    log.exception("decode step of %s failed; failing the requests in the batch", self.name)
                    for request in [r for r, rec in self._records.items() if rec.admitted]:
                        self._close(request, EngineFailure("the engine failed while translating"), release=False)
                    self.batch = batch = self._new_batch()
                self._flush()
        except BaseException as exc:  # the thread dies: its clients hear of it, and the scheduler restarts it
            log.exception("batcher of %s died", self.name)
            self.failure = exc
            self._fail_remaining(EngineFailure("the engine failed while translating"))
        finally:
            if self._encoder is not None:
                self._encoder.shutdown(wait=False, cancel_futures=True)
            self._fail_remaining(ShuttingDown("the server is shutting down"))
            self._flush(idle=True)
            if not self._stopping.is_set():
                self._emit(Exited(f"the batcher thread died: {self.failure!r}"))

    def _flush(self, idle: bool = False) -> None:
        """Send what this turn produced: events and the queue's progress at once; metrics alone at most every
        STATS_EVERY seconds, or before the thread idles. (Sent after every step, they were a message through the pipe
        per step: 6-7% of the scheduler process's time at one client, in a py-spy profile.)"""
        running = sum(1 for rec in self._records.values() if rec.admitted)
        gauges = (running, len(self._records) - running)
        if gauges != self._gauges:
            self._gauges = gauges
            self._out.stats.running, self._out.stats.waiting = gauges
        now = time.monotonic()
        metrics_due = idle or now - self._stats_sent >= STATS_EVERY
        if self._out.events or self._out.left != self._left_sent or (metrics_due and self._out.stats):
            out, self._out = self._out, Output(left=self._out.left)
            self._left_sent, self._stats_sent = out.left, now
            self._emit(out)

    def _fail_remaining(self, error: TolkError) -> None:
        """Every request still queued, in the inbox or decoding ends with this error (at shutdown: 503)."""
        self._receive(block=False)
        for request in list(self._records):
            self._close(request, error, release=False)

    def _take(self, block: bool) -> Command | None:
        """The next command; None when there is none and `block` is off, or the thread is stopping."""
        if self._commands is None:
            try:
                return self._inbox.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                if not block:
                    return None
            if self.batch is None or not len(self.batch):
                runtime.trim_heap()  # idle half a second, as below
            return self._inbox.get()  # (`stop` puts a Stop here)
        try:
            return self._inbox.get_nowait()  # (`stop` puts a Stop here)
        except queue.Empty:
            pass
        try:
            trimmed = False
            while not self._commands.poll(0.5 if block else 0):
                if not block or self._stopping.is_set():
                    return None
                if not trimmed and (self.batch is None or not len(self.batch)):
                    # idle half a second: hand back what the last burst's buffers freed (glibc keeps it)
                    trimmed = True
                    runtime.trim_heap()
            return cast(Command, self._commands.recv())
        except (EOFError, OSError):  # the server went away
            return Stop()

    def _receive(self, block: bool) -> None:
        """Take new commands; waits for one when there is nothing else to do."""
        while True:
            if block:
                self._flush(idle=True)  # about to idle: send what the last turns changed
            command = self._take(block)
            if command is None:
                return
            block = False
            if isinstance(command, Stop):
                self._stopping.set()
                return
            if isinstance(command, Submit):
                self._take_submit(command)
            elif isinstance(command, Cancel):
                self._close(command.request, None)

    def _take_submit(self, command: Submit) -> None:
        """A new request's sentences, or the next ones of a request that came in pieces: they wait after everything
        waiting. The next pieces of a request that has ended (cancelled, failed, timed out) leave at once."""
        rec = self._records.get(command.request)
        if command.first and rec is None:
            self._out.left += len(command.sources)
            return
        if rec is None:
            self._records[command.request] = _Record(command, time.monotonic())
        else:
            rec.submit = rec.submit.extend(command)
        self._waiting.add(Pending(command.request, command.first + i, c.beam_size, len(src)) for i, (src, c) in
                          enumerate(zip(command.sources, command.configs, strict=True)))

    def _expire(self, now: float) -> None:
        for request in [r for r, rec in self._records.items() if now > rec.submit.deadline]:
            timeout = self._records[request].submit.timeout
            self._close(request, TimedOut(f"the request did not finish within {timeout:g} s"))

    def _close(self, request: int, error: TolkError | None, release: bool = True) -> None:
        """End a request early: free its rows (unless the batch is being rebuilt) and say why."""
        rec = self._records.pop(request, None)
        if rec is None:
            return
        if release and self.batch is not None:
            for i in range(rec.admitted):
                self.batch.cancel((request, i))
            self._out.stats.rows_used = self.batch.n
        self._waiting.drop(request)
        self._out.left += len(rec.submit.sources) - rec.admitted
        if error is not None:
            self._out.events[request] = [error]

    def _admit(self, batch: DecodeBatch) -> bool:
        """Admit waiting sentences, the waiting requests in turn, while rows and the token budget allow; whether any
        joined. While the batch decodes, on the CPU, the chosen sentences are encoded on the encoder thread and join
        at a later turn (module docstring)."""
        if self._ahead is not None:
            if len(batch) and not self._ahead.encoded.done():
                return False  # decode on; they join when encoded
            return self._join_ahead(batch)  # (with an empty batch: waits for the encoder)
        if not self.settings.batching and len(batch):
            return False
        held: Counter[int] = Counter()  # rows per request
        for (request, _), seq in batch.seqs.items():
            held[request] += seq.beam
        count = admissible(
            ((p.beam, p.tokens) for p in self._waiting.order(held)),
            min(batch.free_rows, self._row_limit - batch.n), max_tokens=self.settings.max_admit_tokens,
            max_items=1 if not self.settings.batching else self._admit_cap or None,
            batch_empty=not len(batch), total_free_rows=batch.free_rows)
        items = self._waiting.take(count, held)
        if not items:
            return False
        if self._encoder is not None and len(batch):
            sources = [self._records[p.request].submit.sources[p.sentence] for p in items]
            self._ahead = _Ahead(items, self._encoder.submit(batch.encode, sources))
            return False
        return self._join(batch, items, None)

    def _join_ahead(self, batch: DecodeBatch) -> bool:
        """The sentences encoded ahead join the batch, but for those whose request ended meanwhile; if the row limit
        fell meanwhile (an out-of-memory step) and they no longer fit, they go back to the head of the queue."""
        ahead, self._ahead = self._ahead, None
        assert ahead is not None
        live = [i for i, p in enumerate(ahead.items) if p.request in self._records]
        items = [ahead.items[i] for i in live]
        if sum(p.beam for p in items) > min(batch.free_rows, self._row_limit - batch.n):
            self._waiting.push_front(items)
            return False
        return self._join(batch, items, ahead.encoded, live) if items else False

    def _join(self, batch: DecodeBatch, items: list[Pending], encoded: Future[Encoded] | None,
              keep: list[int] | None = None) -> bool:
        """Admit these sentences into the batch (encoding them here unless `encoded`, of which the `keep`
        positions are theirs, holds them); whether they joined."""
        try:
            ready = encoded.result().select(keep or []) if encoded is not None else None
            sent = [(p, self._records[p.request].submit) for p in items]
            admitted = [((p.request, p.sentence), s.sources[p.sentence], s.configs[p.sentence]) for p, s in sent]
            if any(s.constraints for _, s in sent):  # a glossary's terms, and where they are in the sources
                batch.admit(admitted, [s.constraints[p.sentence] if s.constraints else None for p, s in sent],
                            [s.constraint_sources[p.sentence] if s.constraint_sources and s.constraints
                             and s.constraints[p.sentence] else None for p, s in sent], encoded=ready)
            else:
                batch.admit(admitted, encoded=ready)
        except Exception as exc:  # these sentences left the queue without reaching the batch
            if out_of_memory(exc):
                self._admitting_out_of_memory(items)
                return False
            for request in {p.request for p in items}:
                self._close(request, EngineFailure("the engine failed while translating"), release=False)
            raise
        now = time.monotonic()
        for p in items:
            rec = self._records[p.request]
            if rec.admitted == 0:
                self._out.stats.queue.append(now - rec.received)
            if p.sentence >= rec.admitted:  # (a sentence decoded again was admitted and counted before)
                self._out.left += 1
                rec.admitted = p.sentence + 1
        self._out.stats.input_tokens += sum(p.tokens for p in items)
        self._out.stats.rows_used = batch.n
        return True

    def _admitting_out_of_memory(self, items: list[Pending]) -> None:
        """Retry with half of the sentences at the next turn; a single sentence that does not fit fails alone."""
        self._admit_cap = len(items) // 2
        self._calm_steps = 0
        self._count_oom(f"admitting {len(items)} sentences")
        if items[1:]:
            self._waiting.push_front(items)
            return
        self._close(items[0].request, EngineFailure("out of memory translating this sentence"))
        self._admit_cap = 1

    def _most_steps(self) -> int:
        """How many steps may run at once now (`model.search.steps`): while nothing waits to join, as many as fit
        in `steps_at_once_ms` at the last step's pace (1 until a step was timed), at most 256."""
        budget = self.settings.steps_at_once_ms / 1000
        if not budget or self._waiting or self._ahead is not None or not self._inbox.empty() or not self._step_s:
            return 1
        return max(1, min(256, int(budget / self._step_s)))

    def _step(self, batch: DecodeBatch) -> None:
        """One decoder step for all active rows, or several at once (`_most_steps`); route its events to their
        requests."""
        rows = batch.n
        start = time.perf_counter()
        try:
            events = steps(batch, self._most_steps())
        except Exception as exc:
            if not out_of_memory(exc) or len(batch) < 2:
                raise
            self._halve(batch)
            return
        taken = batch.stepped
        stats = self._out.stats
        self._step_s = (time.perf_counter() - start) / taken
        stats.step += [self._step_s] * taken
        stats.batch_rows += [rows] * taken
        self._calm()
        now = time.monotonic()
        for event in events:
            self._route(event, now)
        stats.rows_used = batch.n

    def _route(self, event: Event, now: float) -> None:
        rec = self._records[event.request]
        if not rec.first_event:
            rec.first_event = True
            self._out.stats.ttft.append(now - rec.received)
        s = event.sentence
        if isinstance(event, TokenEvent):
            if rec.skip.get(s):  # decoded again after an out-of-memory step: the client has this one
                rec.skip[s] -= 1
                return
            last = rec.last_token.get(s)
            if last is not None:
                self._out.stats.itl.append(now - last)
            rec.last_token[s] = now
            if rec.submit.stream:
                self._out.events.setdefault(event.request, []).append(event)
                rec.emitted[s] = rec.emitted.get(s, 0) + 1
            return
        best = event.hypotheses[0]
        generated = self._out.stats.generated
        generated[best.finish_reason] = generated.get(best.finish_reason, 0) + len(best.tokens)
        self._out.events.setdefault(event.request, []).append(event)
        rec.finished += 1
        rec.last_token.pop(s, None)
        if rec.finished == rec.submit.count:
            del self._records[event.request]

    def _halve(self, batch: DecodeBatch) -> None:
        """Out of memory in a step: the newest sentences leave until half the rows remain, and wait at the head
        of the queue to be decoded again from the start; the row limit drops to what remains."""
        keep, again = batch.n // 2, []
        for key in reversed(list(batch.seqs)):
            if batch.n <= keep or len(batch) == 1:
                break
            request, sentence = key
            seq = batch.seqs[key]
            batch.cancel(key)
            rec = self._records[request]
            rec.skip[sentence] = rec.emitted.get(sentence, 0)
            rec.last_token.pop(sentence, None)
            again.append(Pending(request, sentence, seq.beam, seq.src_len))
        self._waiting.push_front(again[::-1])  # `again` is newest first; the oldest goes to the head
        self._row_limit = max(1, batch.n)
        self._calm_steps = 0
        self._out.stats.rows_used = batch.n
        self._count_oom(f"a step of {batch.n + sum(p.beam for p in again)} rows")

    def _count_oom(self, what: str) -> None:
        log.warning("out of memory in %s of %s; row limit now %d, admission cap %s", what, self.name,
                    self._row_limit, self._admit_cap or "none")
        self._out.stats.out_of_memory += 1
        self._out.stats.row_limit = self._row_limit
        if self.net.device.type == "cuda":
            torch.cuda.empty_cache()

    def _calm(self) -> None:
        """A step went through: after enough of them, let the row limit and admission cap grow again."""
        if self._row_limit == self.settings.max_batch_rows and not self._admit_cap:
            return
        self._calm_steps += 1
        if self._calm_steps >= self.recover_steps:
            self._calm_steps = 0
            self._row_limit = min(self.settings.max_batch_rows, self._row_limit * 2)
            self._admit_cap = 0 if self._admit_cap * 2 >= self.settings.max_batch_rows else self._admit_cap * 2
            self._out.stats.row_limit = self._row_limit


def cpu_cores() -> int:
    """The cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_threads() -> int:
    """Every core this process may use but one: the event loop (HTTP, JSON, tokenizing, streaming) needs one, and a
    decode thread that shares it stalls (measured on 2 cores: 138 sentences/s with 1 torch thread, 83 with 2)."""
    return max(1, cpu_cores() - 1)


def out_of_memory(exc: BaseException) -> bool:
    """A device (CUDA) or host allocation failure, as opposed to a bug."""
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc))
