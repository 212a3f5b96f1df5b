"""Translated files, kept in a temporary directory until they expire, within a bound on their total size.

A file is stored under a random id (a UUID, as LibreTranslate names them); the name a client downloads it as is kept
beside it, and only a request that names both finds it. Expired files are removed whenever the store is used, and
the oldest files make room when a new one would pass the size bound. The directory is the store's own and is
removed when the server stops.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from server.errors import NotFound, PayloadTooLarge

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredFile:
    path: Path
    filename: str  # what the client downloads it as
    media_type: str
    size: int
    expires: float  # time.monotonic()


class FileStore:
    """Translated files by id; safe to use from worker threads."""

    def __init__(self, ttl: float, max_bytes: int, parent: Path | None = None) -> None:
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        self.directory = Path(tempfile.mkdtemp(prefix="tolk-files-", dir=parent))
        self.ttl = ttl
        self.max_bytes = max_bytes
        self._files: dict[str, StoredFile] = {}  # insertion order = age
        self._size = 0
        self._lock = threading.Lock()

    def put(self, filename: str, media_type: str, data: bytes) -> str:
        """Keep a file; its id. 413 when it alone is larger than the store."""
        if len(data) > self.max_bytes:
            raise PayloadTooLarge(f"the translated file has {len(data)} bytes; this server keeps at most "
                                  f"{self.max_bytes}")
        file_id = str(uuid.uuid4())
        path = self.directory / file_id
        path.write_bytes(data)
        with self._lock:
            self._expire(time.monotonic())
            while self._files and self._size + len(data) > self.max_bytes:
                self._drop(next(iter(self._files)))
            self._files[file_id] = StoredFile(path, filename, media_type, len(data), time.monotonic() + self.ttl)
            self._size += len(data)
        return file_id

    def get(self, file_id: str, filename: str) -> StoredFile:
        """The file with this id and name, if it has not expired; 404 otherwise."""
        with self._lock:
            self._expire(time.monotonic())
            found = self._files.get(file_id)
        if found is None or found.filename != filename:
            raise NotFound("no such file: it has expired, or it never existed")
        return found

    def pop(self, file_id: str) -> tuple[StoredFile, bytes]:
        """The file with this id and its bytes, removed from the store (a result handed out once); 404 when gone."""
        with self._lock:
            self._expire(time.monotonic())
            found = self._files.get(file_id)
            if found is None:
                raise NotFound("no such file: it has expired, or it never existed")
            data = found.path.read_bytes()
            self._drop(file_id)
        return found, data

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def _expire(self, now: float) -> None:
        while self._files:
            oldest = next(iter(self._files))
            if self._files[oldest].expires > now:
                break
            self._drop(oldest)

    def _drop(self, file_id: str) -> None:
        found = self._files.pop(file_id)
        self._size -= found.size
        found.path.unlink(missing_ok=True)
