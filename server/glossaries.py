"""Glossaries: term pairs a translation must use, kept in SQLite, and the terms of a sentence found by matching.

A glossary is DeepL's: a name, a source and a target language, and entries (source term -> target term) sent as TSV
or CSV. It belongs to the API key that made it when the server has keys (a hash of the key is kept, never the key).
A sentence's glossary terms are found by longest match at word boundaries, case aside (`Glossary.match`); each
found term's target form becomes a constraint of the sentence's row (model/constraints.py).
"""

from __future__ import annotations

import csv
import hashlib
import io
import logging
import re
import sqlite3
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path

from model.tokenizer import Tokenizer, source_positions
from server.errors import InvalidRequest, NotFound, NotReady, PayloadTooLarge
from server.placeholders import find

log = logging.getLogger(__name__)

FORMATS = ("tsv", "csv")
WORD = re.compile(r"\w+|[^\w\s]")  # words, and each other visible character on its own
SCHEMA = """
CREATE TABLE IF NOT EXISTS glossaries (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, name TEXT NOT NULL, source_lang TEXT NOT NULL,
    target_lang TEXT NOT NULL, creation_time TEXT NOT NULL, entry_count INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    glossary TEXT NOT NULL REFERENCES glossaries(id) ON DELETE CASCADE, source TEXT NOT NULL, target TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS entries_glossary ON entries(glossary);
"""


class GlossaryLimit(PayloadTooLarge):
    """A glossary (or all of them) beyond what this server keeps."""

    error_type = "glossary_limit"


@dataclass(frozen=True)
class GlossaryInfo:
    glossary_id: str
    name: str
    source_lang: str
    target_lang: str
    creation_time: str  # ISO 8601, UTC
    entry_count: int
    ready: bool = True  # DeepL's field: a glossary here is usable as soon as it is made


def owner_of(api_key: str | None) -> str:
    """Who owns what a request makes: a hash of its verified API key, or '' on a server without keys."""
    return hashlib.sha256(api_key.encode()).hexdigest() if api_key else ""


def _words(text: str) -> tuple[str, ...]:
    return tuple(w.casefold() for w in WORD.findall(text))


def parse_entries(text: str, entries_format: str, max_entries: int, max_chars: int) -> list[tuple[str, str]]:
    """Entries from TSV (source TAB target per line) or CSV (two columns); raises InvalidRequest naming the line."""
    if entries_format not in FORMATS:
        raise InvalidRequest(f"entries_format must be one of {', '.join(FORMATS)}, got {entries_format!r}")
    lines = text.splitlines()
    if entries_format == "tsv":
        rows = [line.split("\t") for line in lines]
    else:
        try:
            rows = list(csv.reader(io.StringIO(text)))
        except csv.Error as exc:
            raise InvalidRequest(f"entries are not valid CSV: {exc}") from exc
    entries: list[tuple[str, str]] = []
    seen: dict[tuple[str, ...], int] = {}
    for n, row in enumerate(rows, 1):
        if not row or (len(row) == 1 and not row[0].strip()):
            continue  # blank lines are allowed, as DeepL allows them
        if len(row) != 2:
            raise InvalidRequest(f"entry on line {n} must have 2 fields (source and target), has {len(row)}")
        source, target = (field.strip() for field in row)
        if not source or not target:
            raise InvalidRequest(f"entry on line {n} has an empty term")
        if len(source) > max_chars or len(target) > max_chars:
            raise GlossaryLimit(f"entry on line {n} has a term over {max_chars} characters")
        if any(ord(c) < 32 for c in source + target):
            raise InvalidRequest(f"entry on line {n} holds a control character")
        key = _words(source)
        if not key:
            raise InvalidRequest(f"entry on line {n}: the source term has no word to match")
        if key in seen:
            raise InvalidRequest(f"entry on line {n} repeats the source term of line {seen[key]} (case aside)")
        seen[key] = n
        entries.append((source, target))
    if not entries:
        raise InvalidRequest("a glossary needs at least one entry")
    if len(entries) > max_entries:
        raise GlossaryLimit(f"{len(entries)} entries; a glossary holds at most {max_entries}")
    return entries


def entries_tsv(entries: list[tuple[str, str]]) -> str:
    return "".join(f"{s}\t{t}\n" for s, t in entries)


class Glossary:
    """A glossary's entries, ready to match sentences."""

    def __init__(self, info: GlossaryInfo, entries: list[tuple[str, str]]) -> None:
        self.info = info
        self.entries = entries
        self._terms: dict[str, list[tuple[tuple[str, ...], str]]] = {}  # first word -> (words, target), longest first
        for source, target in entries:
            words = _words(source)
            self._terms.setdefault(words[0], []).append((words, target))
        for options in self._terms.values():
            options.sort(key=lambda x: -len(x[0]))

    def match(self, sentence: str) -> list[str]:
        """The target terms of the source terms found in a sentence, in order, each once: at each word, the longest
        term that starts there (whole words, case aside), then on after it."""
        return [target for target, _ in self._found(sentence)]

    def _found(self, sentence: str) -> list[tuple[str, tuple[int, int]]]:
        """`match`'s terms, each with the characters of the sentence where it was found first."""
        spans = [(m.start(), m.end()) for m in WORD.finditer(sentence)]
        words = list(_words(sentence))
        for p in find(sentence):  # nothing inside a placeholder is a term ("{ $index }" stays as it is)
            for i, (a, b) in enumerate(spans):
                if a < p.start + len(p.text) and p.start < b:
                    words[i] = ""
        found: dict[str, tuple[int, int]] = {}
        i = 0
        while i < len(words):
            for term, target in self._terms.get(words[i], ()):
                if tuple(words[i:i + len(term)]) == term:
                    found.setdefault(target, (spans[i][0], spans[i + len(term) - 1][1]))
                    i += len(term)
                    break
            else:
                i += 1
        return list(found.items())

    def constraints(self, sentence: str, tokenizer: Tokenizer) -> list[list[list[int]]]:
        """What a sentence's translation must contain: per term found, its target form as target tokens, or the same
        with a capital first letter (where the term begins the translation's sentence)."""
        return self.placed(sentence, tokenizer, [])[0]

    def placed(self, sentence: str, tokenizer: Tokenizer, source_ids: list[int]
               ) -> tuple[list[list[list[int]]], list[list[int]] | None]:
        """`constraints`, and the positions in `source_ids` (the sentence as the model reads it) of each term's
        source words; None when the ids' words do not match the sentence's up."""
        out, where = [], []
        for term, span in self._found(sentence):
            forms = [term] + ([term[0].upper() + term[1:]] if term[0].islower() else [])
            alternatives = [ids for ids in (target_ids(tokenizer, f) for f in forms) if ids]
            if alternatives:
                out.append(alternatives)
                where.append(span)
        return out, source_positions(tokenizer, sentence, source_ids, where) if out and source_ids else None


@lru_cache(maxsize=16)
def _target_table(tokenizer: Tokenizer) -> dict[str, int]:
    return {p: i for i, p in enumerate(tokenizer.vocab or [])}


def target_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """A target term as the model's target ids (no end-of-sentence); empty when a piece is not in its vocabulary."""
    if tokenizer.vocab is None:
        return list(tokenizer.target.encode(text))
    table = _target_table(tokenizer)
    ids = [table.get(p, -1) for p in tokenizer.target.encode(text, out_type=str)]
    return [] if -1 in ids else ids


class GlossaryStore:
    """Glossaries in one SQLite file under the data directory; a few recently used ones kept ready to match.

    The file is opened at the first use, so a server whose clients never use glossaries never writes there; one that
    cannot write there still translates, and its glossary requests answer 503 saying why.
    """

    def __init__(self, directory: Path, max_glossaries: int, max_entries: int, max_chars: int,
                 keep: int = 64) -> None:
        self.directory = directory
        self.max_glossaries, self.max_entries, self.max_chars = max_glossaries, max_entries, max_chars
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()  # one connection, used from worker threads
        self._ready: OrderedDict[str, Glossary] = OrderedDict()
        self._keep = keep

    @property
    def _db(self) -> sqlite3.Connection:
        """The connection, opened (and the tables made) at the first use; called with the lock held."""
        if self._conn is None:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(self.directory / "glossaries.sqlite3", check_same_thread=False,
                                       isolation_level=None)
                conn.execute("PRAGMA foreign_keys = ON")
                conn.execute("PRAGMA journal_mode = WAL")
                conn.executescript(SCHEMA)
            except (OSError, sqlite3.Error) as exc:
                log.error("glossaries cannot be kept in %s: %s", self.directory, exc)
                raise NotReady(f"glossaries are unavailable: the server cannot keep them in {self.directory}") from exc
            self._conn = conn
        return self._conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def create(self, owner: str, name: str, source_lang: str, target_lang: str, entries_text: str,
               entries_format: str) -> GlossaryInfo:
        """Check and keep a new glossary; raises InvalidRequest or GlossaryLimit."""
        if not name.strip():
            raise InvalidRequest("a glossary needs a name")
        if len(name) > self.max_chars:
            raise GlossaryLimit(f"a glossary's name has at most {self.max_chars} characters")
        entries = parse_entries(entries_text, entries_format, self.max_entries, self.max_chars)
        info = GlossaryInfo(uuid.uuid4().hex, name, source_lang, target_lang,
                            datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"), len(entries))
        with self._lock:
            (count,) = self._db.execute("SELECT COUNT(*) FROM glossaries").fetchone()
            if count >= self.max_glossaries:
                raise GlossaryLimit(f"this server keeps at most {self.max_glossaries} glossaries; delete one first")
            with self._db:
                self._db.execute("BEGIN")
                self._db.execute("INSERT INTO glossaries VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 (info.glossary_id, owner, name, source_lang, target_lang, info.creation_time,
                                  info.entry_count))
                self._db.executemany("INSERT INTO entries VALUES (?, ?, ?)",
                                     [(info.glossary_id, s, t) for s, t in entries])
        return info

    def owned(self, owner: str) -> list[GlossaryInfo]:
        with self._lock:
            rows = self._db.execute("SELECT id, name, source_lang, target_lang, creation_time, entry_count "
                                    "FROM glossaries WHERE owner = ? ORDER BY creation_time, id", (owner,)).fetchall()
        return [GlossaryInfo(*row) for row in rows]

    def info(self, glossary_id: str, owner: str) -> GlossaryInfo:
        """A glossary's metadata; NotFound when there is none of this owner's by that id."""
        with self._lock:
            row = self._db.execute("SELECT id, name, source_lang, target_lang, creation_time, entry_count "
                                   "FROM glossaries WHERE id = ? AND owner = ?", (glossary_id, owner)).fetchone()
        if row is None:
            raise NotFound(f"no glossary {glossary_id!r}")
        return GlossaryInfo(*row)

    def get(self, glossary_id: str, owner: str) -> Glossary:
        """A glossary with its entries, ready to match; NotFound as `info`."""
        info = self.info(glossary_id, owner)
        with self._lock:
            ready = self._ready.get(glossary_id)
            if ready is not None:
                self._ready.move_to_end(glossary_id)
                return ready
            rows = self._db.execute("SELECT source, target FROM entries WHERE glossary = ? ORDER BY rowid",
                                    (glossary_id,)).fetchall()
        glossary = Glossary(info, [(s, t) for s, t in rows])
        with self._lock:
            self._ready[glossary_id] = glossary
            while len(self._ready) > self._keep:
                self._ready.popitem(last=False)
        return glossary

    def delete(self, glossary_id: str, owner: str) -> None:
        with self._lock, self._db:
            self._db.execute("BEGIN")
            gone = self._db.execute("DELETE FROM glossaries WHERE id = ? AND owner = ?", (glossary_id, owner))
            self._ready.pop(glossary_id, None)
        if gone.rowcount == 0:
            raise NotFound(f"no glossary {glossary_id!r}")
