"""Characters translated per API key and calendar month, kept in SQLite, and the monthly limit (DeepL's usage).

DeepL bills the characters of the texts it is sent, and its clients ask `GET /v2/usage` what is left. Tolk counts
the same: the characters of every translation's source texts (and of every document's), by the hash of the key
that asked (`server/glossaries.py:owner_of`; one count for everyone on a server without keys), per month (UTC).
Counting is a dict update on the event loop; a task writes what was added to the file every few seconds and when
the server stops, so the hot path never waits for the disk. Replicas that share the data directory add their
counts up in the file (each one's own limit check sees what it read at start and what it counted since).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from starlette.concurrency import run_in_threadpool

from server.errors import QuotaExceeded

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    owner TEXT NOT NULL, period TEXT NOT NULL, characters INTEGER NOT NULL, PRIMARY KEY (owner, period));
"""
UNLIMITED = 10**12  # reported as the limit when there is none, as DeepL reports an uncapped Pro plan's


@dataclass(frozen=True)
class Period:
    """A calendar month in UTC: its key in the file, and its bounds."""

    key: str  # "2026-05"
    start: datetime
    end: datetime

    @classmethod
    def of(cls, now: datetime) -> Period:
        start = datetime(now.year, now.month, 1, tzinfo=UTC)
        end = datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=UTC)
        return cls(f"{now.year:04d}-{now.month:02d}", start, end)


class Usage:
    """Characters per owner this month, and the limit each may use (None: no limit)."""

    def __init__(self, directory: Path, limit: int | None, flush_every: float = 5.0) -> None:
        self.path = directory / "usage.sqlite3"
        self.limit = limit
        self.flush_every = flush_every
        self._counts: dict[tuple[str, str], int] = {}  # (owner, period) -> characters, read and counted
        self._pending: dict[tuple[str, str], int] = {}  # counted since the last write
        self._lock = threading.Lock()  # the writer thread takes what is pending

    def load(self) -> None:
        """Read the counts of this month (a worker thread, at start); a file that cannot be read counts from 0."""
        period = Period.of(datetime.now(UTC)).key
        if not self.path.exists():  # nothing counted yet: the file is made at the first write
            return
        try:
            with self._connect() as conn:
                rows = conn.execute("SELECT owner, characters FROM usage WHERE period = ?", (period,)).fetchall()
        except (OSError, sqlite3.Error) as exc:
            log.error("usage counts cannot be read from %s: %s", self.path, exc)
            return
        with self._lock:
            for owner, characters in rows:
                self._counts[(owner, period)] = characters

    def used(self, owner: str, period: Period | None = None) -> int:
        key = (period or Period.of(datetime.now(UTC))).key
        return self._counts.get((owner, key), 0)

    def check(self, owner: str) -> None:
        """Raise QuotaExceeded (456) when the owner has used this month's characters."""
        if self.limit is not None and self.used(owner) >= self.limit:
            raise QuotaExceeded(f"the limit of {self.limit} characters this month is reached")

    def add(self, owner: str, characters: int) -> None:
        """Count characters translated for an owner (written to the file within `flush_every` seconds)."""
        key = (owner, Period.of(datetime.now(UTC)).key)
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + characters
            self._pending[key] = self._pending.get(key, 0) + characters

    def flush(self) -> None:
        """Write what was counted since the last write (a worker thread); kept for the next try if it fails."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return
        try:
            with self._connect() as conn:
                conn.executemany("INSERT INTO usage VALUES (?, ?, ?) ON CONFLICT (owner, period) "
                                 "DO UPDATE SET characters = characters + excluded.characters",
                                 [(owner, period, n) for (owner, period), n in pending.items()])
        except (OSError, sqlite3.Error) as exc:
            log.error("usage counts cannot be written to %s: %s", self.path, exc)
            with self._lock:
                for key, n in pending.items():
                    self._pending[key] = self._pending.get(key, 0) + n

    async def keep_writing(self) -> None:
        """Write the counts every `flush_every` seconds until cancelled (the lifespan writes the last ones)."""
        while True:
            await asyncio.sleep(self.flush_every)
            await run_in_threadpool(self.flush)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection to the file (made with its table when missing) in one transaction, closed after."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=10)
        try:
            conn.executescript(SCHEMA)
            with conn:
                yield conn
        finally:
            conn.close()
