"""A model's scheduler in a process of its own, so that decoding and the event loop do not share one GIL.

With the scheduler as a thread of the server process, every torch call in the decode loop hands the GIL back and
must win it again from the event loop (HTTP, JSON, tokenizing, streaming). Measured on 2 cores with the shipped
model (int8, 32 clients): the scheduler thread was busy 78% of the time and the event loop 20%, together one core,
while the second core idled; streaming, 48% and 51%. In its own process the scheduler keeps its core.

The child process loads the model and runs the ordinary `Scheduler` (the same admission, steps, faults, out-of-memory
halving and metrics). Two one-way pipes join them: commands (submit, cancel, stop) go down; each step's events
come up in one message, with the metric updates the step made and how many sentences have left the queue. The
parent's `ProcessScheduler` has the thread scheduler's interface: `Job`s, cancellation, 429 on a full queue, and
`dead` when the child exits (its requests fail with a 500 and the engine's supervisor calls `restart()`).
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from model.checkpoint import load, resolve_device
from model.generation import GenerationConfig
from server.errors import EngineFailure, NotReady, ShuttingDown, TolkError
from server.metrics import Metrics
from server.scheduler import Event, Finished, Job, Scheduler, deliver, prepare_configs, reserve
from server.settings import Settings

log = logging.getLogger(__name__)

MetricOp = tuple[str, tuple[tuple[str, str], ...], str, float]  # (collector, labels, method, value)


@dataclass
class Target:
    """What the child process serves: the model directory, loaded on `device` in `dtype`."""

    name: str
    directory: Path
    device: str
    dtype: str


class ProcessScheduler:
    """The parent's side: the thread `Scheduler`'s interface, with the work done in a child process."""

    def __init__(self, target: Target, settings: Settings, metrics: Metrics, max_source_tokens: int) -> None:
        self.name = target.name
        self.target = target
        self.settings = settings
        self.max_source_tokens = max_source_tokens
        self._metrics = metrics
        self._children: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # guards _jobs, _submitted and _left
        self._jobs: dict[int, tuple[Job, list[int]]] = {}  # id -> (job, [sentences whose Finished is pending])
        self._ids: dict[Job, int] = {}
        self._next_id = itertools.count()
        self._submitted = 0  # sentences sent to this child
        self._left = 0  # of those, how many have left its queue (admitted or dropped), as the child last said
        self._process: multiprocessing.process.BaseProcess | None = None
        self._commands: Connection | None = None
        self._reader: threading.Thread | None = None
        self._stopping = threading.Event()
        self._failure: BaseException | None = None
        metrics.row_limit.labels(model=self.name).set(settings.max_batch_rows)

    # --- the thread Scheduler's interface ------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._alive() and not self._stopping.is_set() and self._failure is None

    @property
    def dead(self) -> bool:
        return self._process is not None and not self._stopping.is_set() and not self._alive()

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    @property
    def device(self) -> str:
        return str(resolve_device(self.target.device))

    @property
    def queued(self) -> int:
        return self._submitted - self._left

    def start(self, timeout: float = 300.0) -> None:
        """Start the child and wait until it has loaded the model and allocated its cache."""
        context = multiprocessing.get_context("spawn")  # fork would copy the parent's threads and CUDA state
        commands_out, commands_in = context.Pipe(duplex=False)
        events_out, events_in = context.Pipe(duplex=False)
        process = context.Process(
            target=child_main, name=f"tolk-scheduler-{self.name}", daemon=True,
            args=(self.target, self.settings, commands_out, events_in, logging.getLogger().getEffectiveLevel()))
        process.start()
        commands_out.close()
        events_in.close()
        kind, detail = "events", None
        deadline = time.monotonic() + timeout
        while kind == "events":  # metric updates may come before "ready"
            if not events_out.poll(max(0.0, deadline - time.monotonic())):
                process.kill()
                raise RuntimeError(f"scheduler process of {self.name} did not start within {timeout:g} s")
            try:
                message = events_out.recv()
            except EOFError:
                process.join(5)
                message = ("failed", f"it exited with code {process.exitcode}")
            kind, detail = message[0], message[1]
            if kind == "events":
                self._apply(message[3])
        if kind != "ready":
            process.join(5)
            raise RuntimeError(f"scheduler process of {self.name} failed to start: {detail}")
        with self._lock:
            self._submitted = self._left = 0
        self._process, self._commands, self._failure = process, commands_in, None
        self._reader = threading.Thread(target=self._read, args=(events_out,), name=f"tolk-events-{self.name}",
                                        daemon=True)
        self._reader.start()

    def restart(self, timeout: float = 300.0) -> None:
        """A fresh child after the last one died; the jobs it held were already failed."""
        if self._stopping.is_set() or self._alive():
            return
        self._metrics.restarts.labels(model=self.name).inc()
        self.start(timeout)

    def stop(self) -> None:
        """The child fails what it holds (503), then exits; what never reached it fails here."""
        self._stopping.set()
        if self._process is not None and self._process.is_alive():
            self._send(("stop",))
            self._process.join(30)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
        if self._reader is not None:
            self._reader.join(30)
        self._fail_all(ShuttingDown("the server is shutting down"))

    def submit(self, sources: list[list[int]], configs: list[GenerationConfig], stream: bool = False) -> Job:
        if not self.running:
            raise NotReady(f"model {self.name} is not running")
        configs = prepare_configs(configs, self.settings)
        job = Job(self, sources, configs, stream, time.monotonic() + self.settings.request_timeout)
        with self._lock:
            self._submitted += reserve(self.queued, len(sources), self.settings)
            job_id = next(self._next_id)
            self._jobs[job_id] = (job, list(range(len(sources))))
            self._ids[job] = job_id
        if not self._send(("submit", job_id, sources, configs, stream, job.deadline)):
            self._forget(job_id)
            raise NotReady(f"model {self.name} is not running")
        return job

    def cancel(self, job: Job) -> None:
        with self._lock:
            job_id = self._ids.get(job)
        if job_id is not None:
            self._forget(job_id)
            self._send(("cancel", job_id))

    # --- plumbing ---------------------------------------------------------------------------------------------

    def _alive(self) -> bool:
        return (self._process is not None and self._process.is_alive() and self._reader is not None
                and self._reader.is_alive())

    def _send(self, command: tuple[Any, ...]) -> bool:
        try:
            with self._send_lock:
                assert self._commands is not None
                self._commands.send(command)
            return True
        except (OSError, ValueError, AssertionError):  # the child is gone; the reader fails its jobs
            return False

    def _forget(self, job_id: int) -> None:
        with self._lock:
            entry = self._jobs.pop(job_id, None)
            if entry is not None:
                self._ids.pop(entry[0], None)

    def _read(self, events: Connection) -> None:
        """The reader thread: one message per child step, handed to the jobs' event loops."""
        try:
            while True:
                message = events.recv()
                if message[0] == "events":
                    _, items, left, ops = message
                    self._apply(ops)
                    self._route(items, left)
                elif message[0] == "died":
                    self._failure = RuntimeError(message[1])
                    log.error("scheduler process of %s: %s", self.name, message[1])
        except (EOFError, OSError):
            pass
        finally:
            events.close()
            if not self._stopping.is_set():
                if self._failure is None:
                    code = self._process.exitcode if self._process is not None else None
                    self._failure = RuntimeError(f"the scheduler process exited (code {code})")
                    log.error("scheduler process of %s exited unexpectedly (code %s)", self.name, code)
                self._fail_all(EngineFailure("the engine failed while translating"))

    def _route(self, items: list[tuple[int, list[Event | TolkError]]], left: int) -> None:
        out: dict[Job, list[Event | TolkError]] = {}
        with self._lock:
            self._left = left
            for job_id, events in items:
                entry = self._jobs.get(job_id)
                if entry is None:  # cancelled here after the child sent these
                    continue
                job, pending = entry
                for event in events:
                    if isinstance(event, TolkError):
                        pending.clear()
                    elif isinstance(event, Finished) and event.index in pending:
                        pending.remove(event.index)
                if not pending:
                    del self._jobs[job_id]
                    self._ids.pop(job, None)
                out[job] = events
        deliver(out)

    def _apply(self, ops: list[MetricOp]) -> None:
        for name, labels, method, value in ops:
            key = (name, labels)
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = getattr(self._metrics, name).labels(**dict(labels))
            getattr(child, method)(value)

    def _fail_all(self, error: TolkError) -> None:
        with self._lock:
            jobs = [job for job, _ in self._jobs.values()]
            self._jobs.clear()
            self._ids.clear()
            self._submitted = self._left = 0
        deliver({job: [error] for job in jobs})


# --- the child process ---------------------------------------------------------------------------------------


class _Recorder:
    """Stands in for `Metrics` in the child: every update becomes an op sent up with the next step's events."""

    def __init__(self) -> None:
        self.ops: list[MetricOp] = []

    def __getattr__(self, collector: str) -> _Family:
        return _Family(collector, self.ops)


class _Family:
    def __init__(self, collector: str, ops: list[MetricOp]) -> None:
        self.collector, self.ops = collector, ops

    def labels(self, **labels: str) -> _Labelled:
        return _Labelled(self.collector, tuple(sorted(labels.items())), self.ops)


class _Labelled:
    def __init__(self, collector: str, labels: tuple[tuple[str, str], ...], ops: list[MetricOp]) -> None:
        self.collector, self.labels, self.ops = collector, labels, ops

    def inc(self, value: float = 1) -> None:
        self.ops.append((self.collector, self.labels, "inc", value))

    def dec(self, value: float = 1) -> None:
        self.ops.append((self.collector, self.labels, "dec", value))

    def set(self, value: float) -> None:
        self.ops.append((self.collector, self.labels, "set", value))

    def observe(self, value: float) -> None:
        self.ops.append((self.collector, self.labels, "observe", value))


class _RemoteJob:
    """The child's stand-in for a parent's Job: what the scheduler thread reads, and the id to answer to. Equal by
    id, so that a cancel command finds the job's record and rows."""

    def __init__(self, job_id: int, sources: list[list[int]] | None = None,
                 configs: list[GenerationConfig] | None = None, stream: bool = False, deadline: float = 0.0) -> None:
        self.id, self.sources, self.configs = job_id, sources or [], configs or []
        self.stream, self.deadline = stream, deadline

    def __hash__(self) -> int:
        return hash(self.id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _RemoteJob) and other.id == self.id


class _ChildScheduler(Scheduler):
    """The ordinary scheduler, delivering over the events pipe instead of to event loops."""

    def __init__(self, name: str, loaded_model: Any, settings: Settings, recorder: _Recorder,
                 events: Connection) -> None:
        super().__init__(name, loaded_model, settings, recorder)  # type: ignore[arg-type]
        self._recorder = recorder
        self._events = events
        self._send_lock = threading.Lock()  # the scheduler thread sends events; the main thread ready and died
        self._received = 0  # sentences received from the parent

    def take(self, job: _RemoteJob) -> None:
        with self._lock:
            self._queued += len(job.sources)
            self._received += len(job.sources)
        self._inbox.put(("submit", job))  # type: ignore[arg-type]

    def drop(self, job: _RemoteJob) -> None:
        self._inbox.put(("cancel", job))  # type: ignore[arg-type]

    def _deliver(self, out: dict[Any, list[Event | TolkError]]) -> None:
        with self._lock:
            left = self._received - self._queued
        ops, self._recorder.ops[:] = list(self._recorder.ops), []
        self.send(("events", [(job.id, items) for job, items in out.items()], left, ops))

    def send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            self._events.send(message)

    def _receive(self, block: bool) -> None:
        if block and self._recorder.ops:  # about to idle: send what the last steps changed
            self._deliver({})
        super()._receive(block)


def child_main(target: Target, settings: Settings, commands: Connection, events: Connection, level: int) -> None:
    """The child process: load, report ready, then take commands until told to stop or the parent goes away."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        loaded = load(target.directory, device=target.device, dtype=target.dtype)
        scheduler = _ChildScheduler(target.name, loaded.model, settings, _Recorder(), events)
        scheduler.start()
    except Exception as exc:
        events.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    scheduler.send(("ready", None))
    try:
        while scheduler.running:
            if not commands.poll(0.5):
                continue
            command = commands.recv()
            if command[0] == "submit":
                scheduler.take(_RemoteJob(*command[1:]))
            elif command[0] == "cancel":
                scheduler.drop(_RemoteJob(command[1]))
            else:
                break
    except (EOFError, OSError):  # the parent went away
        pass
    if scheduler.dead:
        scheduler.send(("died", f"the scheduler thread died: {scheduler.failure!r}"))
    scheduler.stop()
