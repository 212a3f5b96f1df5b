"""Where a model's batcher runs, and the way to it: a thread of the server process, or a child process.

Both carry the same typed messages (server/messages.py): commands down, `Output` and `Exited` up through the
scheduler's `emit`. The child process is the default: with the batcher as a thread of the server, every torch call in
the decode loop hands the GIL back and must win it again from the event loop (HTTP, JSON, tokenizing, streaming).
Measured on 2 cores with the shipped model (int8, 32 clients), the batcher thread was busy 78% of the time and the
event loop 20%, together one core, while the second core idled; in its own process the batcher keeps its core.
The thread is for tests that look inside the batcher, and for `TOLK_SCHEDULER_PROCESS=false`.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from multiprocessing.connection import Connection
from typing import Protocol

from model import runtime
from model.checkpoint import LoadedModel, load
from server.batcher import Batcher, Emit
from server.messages import Command, Exited, Output, Ready, Stop, Target
from server.settings import Settings

log = logging.getLogger(__name__)


class Transport(Protocol):
    """How a `Scheduler` reaches its batcher: start it, send it commands, know whether it lives, stop it."""

    def start(self, target: Target, settings: Settings, max_source_tokens: int, emit: Emit, timeout: float) -> Ready:
        """Load the model and start a fresh batcher whose output goes to `emit`; raises RuntimeError if it cannot."""
        ...

    def send(self, command: Command) -> bool:
        """False when the batcher is gone (the scheduler then hears `Exited`)."""
        ...

    @property
    def alive(self) -> bool: ...

    def stop(self) -> None:
        """The batcher fails what it holds (503) and ends."""
        ...


class ThreadTransport:
    """The batcher as a thread of this process; `batcher` is there to look into (tests)."""

    def __init__(self, loaded: LoadedModel | None = None) -> None:
        self.batcher: Batcher | None = None
        self._loaded = loaded  # kept across restarts: a fresh thread and batch, the same weights

    def start(self, target: Target, settings: Settings, max_source_tokens: int, emit: Emit, timeout: float) -> Ready:
        if self._loaded is None:
            self._loaded = load(target.directory, device=target.device, dtype=target.dtype, keep_modules=False,
                                int8=target.int8)
        self.batcher = Batcher(target.name, self._loaded.net, settings, max_source_tokens, emit)
        cache_bytes = self.batcher.start(timeout)
        return Ready(str(self._loaded.device), self._loaded.parameters, cache_bytes)

    def send(self, command: Command) -> bool:
        if self.batcher is None or not self.batcher.running:
            return False
        self.batcher.put(command)
        return True

    @property
    def alive(self) -> bool:
        return self.batcher is not None and self.batcher.alive

    def stop(self) -> None:
        if self.batcher is not None:
            self.batcher.stop()


class ProcessTransport:
    """The batcher in a child process of its own, joined by two one-way pipes and a reader thread here."""

    def __init__(self) -> None:
        self.process: multiprocessing.process.BaseProcess | None = None
        self._commands: Connection | None = None
        self._reader: threading.Thread | None = None
        self._send_lock = threading.Lock()
        self._stopping = threading.Event()

    def start(self, target: Target, settings: Settings, max_source_tokens: int, emit: Emit, timeout: float) -> Ready:
        context = multiprocessing.get_context("spawn")  # fork would copy the parent's threads and CUDA state
        commands_out, commands_in = context.Pipe(duplex=False)
        events_out, events_in = context.Pipe(duplex=False)
        process = context.Process(
            target=child_main, name=f"tolk-batcher-{target.name}", daemon=True,
            args=(target, settings, max_source_tokens, commands_out, events_in,
                  logging.getLogger().getEffectiveLevel()))
        process.start()
        commands_out.close()
        events_in.close()
        deadline = time.monotonic() + timeout
        while True:  # the batcher's first output may come before Ready
            if not events_out.poll(max(0.0, deadline - time.monotonic())):
                process.kill()
                raise RuntimeError(f"batcher process of {target.name} did not start within {timeout:g} s")
            try:
                message = events_out.recv()
            except EOFError:
                process.join(5)
                message = Exited(f"it exited with code {process.exitcode}")
            if isinstance(message, Ready):
                break
            if isinstance(message, Exited):
                process.join(5)
                raise RuntimeError(f"batcher process of {target.name} failed to start: {message.reason}")
            emit(message)
        self._stopping.clear()
        self.process, self._commands = process, commands_in
        self._reader = threading.Thread(target=self._read, args=(events_out, emit), name=f"tolk-events-{target.name}",
                                        daemon=True)
        self._reader.start()
        return message

    def send(self, command: Command) -> bool:
        try:
            with self._send_lock:
                if self._commands is None:
                    return False
                self._commands.send(command)
            return True
        except (OSError, ValueError):  # the child is gone; the reader says so
            return False

    @property
    def alive(self) -> bool:
        return (self.process is not None and self.process.is_alive() and self._reader is not None
                and self._reader.is_alive())

    def stop(self) -> None:
        self._stopping.set()
        if self.process is not None and self.process.is_alive():
            self.send(Stop())
            self.process.join(30)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()
        if self._reader is not None:
            self._reader.join(30)

    def _read(self, events: Connection, emit: Emit) -> None:
        """The reader thread: each message of the child goes to `emit`; the end of the pipe is `Exited`."""
        reason = None
        try:
            while True:
                message = events.recv()
                if isinstance(message, Exited):
                    reason = message.reason
                else:
                    emit(message)
        except (EOFError, OSError):
            pass
        finally:
            events.close()
            if not self._stopping.is_set():
                code = self.process.exitcode if self.process is not None else None
                emit(Exited(reason or f"the batcher process exited (code {code})"))


def child_main(target: Target, settings: Settings, max_source_tokens: int, commands: Connection, events: Connection,
               level: int) -> None:
    """The child process: load, report Ready, then serve until told to stop or the parent goes away (the batcher
    thread reads the commands itself)."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    send_lock = threading.Lock()  # the batcher thread sends output; this thread Ready

    def emit(message: Output | Exited | Ready) -> None:
        with send_lock:
            events.send(message)

    runtime.manage_heap()  # the server's settings (server.cli.main), this process's own; the environment came along
    try:
        loaded = load(target.directory, device=target.device, dtype=target.dtype, keep_modules=False,
                      int8=target.int8)
        batcher = Batcher(target.name, loaded.net, settings, max_source_tokens, emit, commands=commands)
        cache_bytes = batcher.start()
    except Exception as exc:
        events.send(Exited(f"{type(exc).__name__}: {exc}"))
        return
    emit(Ready(str(loaded.device), loaded.parameters, cache_bytes))
    batcher.join()  # the batcher reads the commands itself, until Stop or the end of the pipe
