"""DeepL's multilingual glossaries (API v3): a name and dictionaries, one per language pair.

Each dictionary is a glossary of `server/glossaries.py:GlossaryStore` (its entries, checks, limits and matching are
that store's), owned by `v3:` and the owner's hash, so that the /v2 and /glossaries lists do not show it; this
store keeps, in SQLite beside it, which dictionaries make which multilingual glossary. A translation that names a
multilingual glossary uses its dictionary for the request's pair (regional variants aside).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from server.errors import InvalidRequest, NotFound, NotReady
from server.glossaries import GlossaryStore, entries_tsv, parse_entries
from server.languages import standard

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS multilingual (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, name TEXT NOT NULL, creation_time TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS dictionaries (
    glossary TEXT NOT NULL REFERENCES multilingual(id) ON DELETE CASCADE, source_lang TEXT NOT NULL,
    target_lang TEXT NOT NULL, part TEXT NOT NULL);
"""


@dataclass(frozen=True)
class Dictionary:
    """A dictionary as a request gives it."""

    source_lang: str
    target_lang: str
    entries: str
    entries_format: str = "tsv"


@dataclass(frozen=True)
class DictionaryInfo:
    source_lang: str
    target_lang: str
    entry_count: int
    part: str  # the glossary of GlossaryStore that holds its entries


@dataclass(frozen=True)
class MultilingualInfo:
    glossary_id: str
    name: str
    creation_time: str  # ISO 8601 with milliseconds, UTC
    dictionaries: list[DictionaryInfo]


def part_owner(owner: str) -> str:
    """Who owns a dictionary's glossary in GlossaryStore: nobody that /v2 or /glossaries lists for."""
    return f"v3:{owner}"


def base(code: str) -> str:
    return standard(code).split("-")[0].lower()


class MultilingualStore:
    """Multilingual glossaries of each owner; their dictionaries' entries live in `glossaries`."""

    def __init__(self, directory: Path, glossaries: GlossaryStore) -> None:
        self.path = directory / "multilingual.sqlite3"
        self.glossaries = glossaries
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.RLock()

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """The connection (opened at the first use), in one transaction, with the lock held."""
        with self._lock:
            if self._conn is None:
                try:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    conn = sqlite3.connect(self.path, check_same_thread=False)
                    conn.execute("PRAGMA foreign_keys = ON")
                    conn.executescript(SCHEMA)
                except (OSError, sqlite3.Error) as exc:
                    log.error("multilingual glossaries cannot be kept in %s: %s", self.path, exc)
                    raise NotReady(f"glossaries are unavailable: the server cannot keep them in {self.path}") from exc
                self._conn = conn
            with self._conn:
                yield self._conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def create(self, owner: str, name: str, dictionaries: list[Dictionary]) -> MultilingualInfo:
        """Check and keep a new glossary; each dictionary's entries are checked as a glossary's."""
        if not name.strip():
            raise InvalidRequest("a glossary needs a name")
        if not dictionaries:
            raise InvalidRequest("a glossary needs at least one dictionary")
        pairs = [(base(d.source_lang), base(d.target_lang)) for d in dictionaries]
        if len(set(pairs)) != len(pairs):
            raise InvalidRequest("a glossary has one dictionary per language pair")
        glossary_id = str(uuid.uuid4())
        created = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        parts: list[tuple[str, str, str]] = []
        try:
            for d in dictionaries:
                parts.append((standard(d.source_lang), standard(d.target_lang), self._part(owner, name, d)))
            with self._db() as db:
                db.execute("INSERT INTO multilingual VALUES (?, ?, ?, ?)", (glossary_id, owner, name, created))
                db.executemany("INSERT INTO dictionaries VALUES (?, ?, ?, ?)",
                               [(glossary_id, s, t, part) for s, t, part in parts])
        except BaseException:
            for _, _, part in parts:
                self.glossaries.delete(part, part_owner(owner))
            raise
        return self.info(glossary_id, owner)

    def _part(self, owner: str, name: str, d: Dictionary) -> str:
        return self.glossaries.create(part_owner(owner), name, standard(d.source_lang), standard(d.target_lang),
                                      d.entries, d.entries_format.lower()).glossary_id

    def owned(self, owner: str) -> list[MultilingualInfo]:
        with self._db() as db:
            ids = [row[0] for row in db.execute("SELECT id FROM multilingual WHERE owner = ? "
                                                "ORDER BY creation_time, id", (owner,))]
        return [self.info(i, owner) for i in ids]

    def info(self, glossary_id: str, owner: str) -> MultilingualInfo:
        """A glossary and its dictionaries; NotFound when there is none of this owner's by that id."""
        with self._db() as db:
            row = db.execute("SELECT id, name, creation_time FROM multilingual WHERE id = ? AND owner = ?",
                             (glossary_id, owner)).fetchone()
            rows = db.execute("SELECT source_lang, target_lang, part FROM dictionaries WHERE glossary = ? "
                              "ORDER BY rowid", (glossary_id,)).fetchall()
        if row is None:
            raise NotFound(f"no glossary {glossary_id!r}")
        dictionaries = [DictionaryInfo(s, t, self.glossaries.info(part, part_owner(owner)).entry_count, part)
                        for s, t, part in rows]
        return MultilingualInfo(row[0], row[1], row[2], dictionaries)

    def find(self, glossary_id: str, owner: str) -> MultilingualInfo | None:
        """`info`, or None when there is no such glossary (the id may be a /v2 glossary's)."""
        try:
            return self.info(glossary_id, owner)
        except NotFound:
            return None

    def dictionary(self, info: MultilingualInfo, source: str, target: str) -> DictionaryInfo:
        """The glossary's dictionary for a language pair (regional variants aside); NotFound without one."""
        for d in info.dictionaries:
            if (base(d.source_lang), base(d.target_lang)) == (base(source), base(target)):
                return d
        raise NotFound(f"glossary {info.glossary_id} has no dictionary for {source} -> {target}")

    def rename(self, glossary_id: str, owner: str, name: str) -> None:
        self.info(glossary_id, owner)
        if not name.strip():
            raise InvalidRequest("a glossary needs a name")
        with self._db() as db:
            db.execute("UPDATE multilingual SET name = ? WHERE id = ?", (name, glossary_id))

    def put(self, glossary_id: str, owner: str, d: Dictionary, merge: bool) -> DictionaryInfo:
        """Add a dictionary, or replace one's entries (`merge`: update and add entries, keep the others)."""
        info = self.info(glossary_id, owner)
        try:
            old: DictionaryInfo | None = self.dictionary(info, d.source_lang, d.target_lang)
        except NotFound:
            old = None
        if merge and old is not None:
            store = self.glossaries
            new = parse_entries(d.entries, d.entries_format.lower(), store.max_entries, store.max_chars)
            given = {s.casefold() for s, _ in new}
            kept = [(s, t) for s, t in store.get(old.part, part_owner(owner)).entries if s.casefold() not in given]
            d = Dictionary(d.source_lang, d.target_lang, entries_tsv(kept + new))
        part = self._part(owner, info.name, d)
        try:
            with self._db() as db:
                if old is not None:
                    db.execute("DELETE FROM dictionaries WHERE glossary = ? AND part = ?", (glossary_id, old.part))
                db.execute("INSERT INTO dictionaries VALUES (?, ?, ?, ?)",
                           (glossary_id, standard(d.source_lang), standard(d.target_lang), part))
        except BaseException:
            self.glossaries.delete(part, part_owner(owner))
            raise
        if old is not None:
            self.glossaries.delete(old.part, part_owner(owner))
        return self.dictionary(self.info(glossary_id, owner), d.source_lang, d.target_lang)

    def remove(self, glossary_id: str, owner: str, source: str, target: str) -> None:
        """Delete one dictionary of a glossary."""
        d = self.dictionary(self.info(glossary_id, owner), source, target)
        with self._db() as db:
            db.execute("DELETE FROM dictionaries WHERE glossary = ? AND part = ?", (glossary_id, d.part))
        self.glossaries.delete(d.part, part_owner(owner))

    def delete(self, glossary_id: str, owner: str) -> None:
        info = self.info(glossary_id, owner)
        with self._db() as db:
            db.execute("DELETE FROM multilingual WHERE id = ?", (glossary_id,))
        for d in info.dictionaries:
            self.glossaries.delete(d.part, part_owner(owner))
