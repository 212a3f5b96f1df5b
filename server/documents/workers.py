"""Files read and rebuilt in processes of their own, a bounded number at once.

A file's parse can cost far more memory than its bytes (lxml's nodes, the readers' spans), and glibc keeps what a
process once held: in the server's process a hostile .docx left a gigabyte behind, and its Python walk took the
event loop's GIL. So each read and each rebuild runs in a fresh process forked from a small fork server (which has
imported the readers once: a fork costs milliseconds, not an interpreter's start) and that process ends with its
task, handing all its memory back. At most `workers` run at once; up to `waiting` more wait their turn, and beyond
that an upload gets 429. A rebuild reads the file again, so nothing of a parse outlives its process while the
document translates (which may take minutes).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool

from server.documents import Limits, find_format
from server.errors import EmptyText, EngineFailure, Overloaded, PayloadTooLarge
from server.text import split_html

log = logging.getLogger(__name__)
T = TypeVar("T")



@dataclass(frozen=True)
class ReadFile:
    """What the route needs of a file: its texts (markup for the HTML path), the start of its text (for detection),
    and its number of characters to translate."""

    texts: list[str]
    sample: str
    characters: int


def visible(text: str) -> str:
    """A text's words without its markup, as server/routing.py:visible_text reads HTML (without importing the
    registry, and with it torch, into the readers' processes)."""
    return " ".join(part for is_text, part in split_html(text) if is_text)


def read_file(data: bytes, name: str, limits: Limits, max_chars: int, sample_chars: int,
              target: str | None) -> ReadFile:
    """In a worker: the file's texts within the limit of characters (413), or the reader's refusal; `target`, the
    language translated into when known (a catalog's plural forms)."""
    fmt, _ = find_format(name)
    document = fmt.read(data, name, limits, target)
    shown = [visible(text) for text in document.texts]
    chars = sum(len(v) for v in shown)
    if not any(v.strip() for v in shown):
        raise EmptyText(f"{name} has no text to translate")
    if chars > max_chars:
        raise PayloadTooLarge(f"{name} has {chars} characters to translate; the limit is {max_chars}")
    sample = " ".join(v.strip() for v in shown if v.strip())[:sample_chars]
    return ReadFile(document.texts, sample, chars)


def rebuild_file(data: bytes, name: str, limits: Limits, target: str | None, translated: list[str]) -> bytes:
    """In a worker: the file read again and rebuilt with the translation of each of its texts."""
    fmt, _ = find_format(name)
    return fmt.read(data, name, limits, target).rebuild(translated)


def in_a_process(task: Callable[..., T], *args: Any) -> T:
    """`task(*args)` in a fresh process forked from the fork server; the process ends with it (a pool of one, shut
    down at once: a long-lived pool with `max_tasks_per_child=1` crashes its manager thread when shut down while it
    replaces a worker, in Python 3.11)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("forkserver")) as pool:
        try:
            return pool.submit(task, *args).result()
        except BrokenProcessPool:  # the process died (killed for its memory?)
            log.warning("a file worker died reading %s", args[1] if len(args) > 1 else "a file")
            raise EngineFailure("reading the file failed") from None


class FileWorkers:
    """The processes that read and rebuild files for the routes, at most `workers` at once; lives on the event
    loop."""

    def __init__(self, workers: int, waiting: int, retry_after: int) -> None:
        self.workers = workers
        self.waiting = waiting
        self.retry_after = retry_after
        self._turns = asyncio.Semaphore(workers)
        self._queued = 0  # tasks waiting for a turn or running
        # The fork server imports the readers once, when it starts (no effect once it runs)
        multiprocessing.get_context("forkserver").set_forkserver_preload([__name__])

    async def read(self, data: bytes, name: str, limits: Limits, max_chars: int, sample_chars: int,
                   target: str | None) -> ReadFile:
        return await self._run(read_file, data, name, limits, max_chars, sample_chars, target)

    async def rebuild(self, data: bytes, name: str, limits: Limits, target: str | None,
                      translated: list[str]) -> bytes:
        return await self._run(rebuild_file, data, name, limits, target, translated)

    async def _run(self, task: Callable[..., T], *args: Any) -> T:
        if self._queued >= self.workers + self.waiting:
            raise Overloaded("too many files are being read; retry later", self.retry_after)
        self._queued += 1
        try:
            async with self._turns:
                return await run_in_threadpool(in_a_process, task, *args)
        finally:
            self._queued -= 1
