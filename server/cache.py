"""Finished sentences of one model, kept by (source token ids, generation settings) and answered again at once.

Software strings and documents repeat sentences constantly; a sentence decoded once with the same settings comes
out the same every time (decoding is deterministic outside sampling), so the scheduler answers a repeat from here
without decoding it. Sampled sentences are never kept. An entry remembers the log-probability of each token when
the sentence was streamed, so a streamed repeat replays exactly the events a decoded one sends; a sentence first
decoded without streaming serves later streamed requests only once a streamed decode has filled those in.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace
from typing import Protocol

from cachetools import LRUCache

from model.events import Event, FinishEvent, Hypothesis, TokenEvent
from model.generation import GenerationConfig

CacheKey = tuple[tuple[int, ...], GenerationConfig]


# The cache is bounded by tokens, not entries alone: a beam's n-best of long sentences is far bigger than a UI string.
TOKENS_PER_ENTRY = 64


@dataclass(frozen=True)
class Entry:
    hypotheses: list[Hypothesis]  # best first
    finish_reason: str
    logprobs: tuple[float, ...] | None  # per token of the best hypothesis, when it was decoded streaming
    size: int  # tokens held: the source, every hypothesis and the log-probs

    @property
    def scored(self) -> bool:
        """Whether the hypotheses carry scores (a decode with `scores=False` leaves them NaN)."""
        return not math.isnan(self.hypotheses[0].score)

    @property
    def rank(self) -> int:
        """What it can answer: 0 requests without scores, 1 with scores too, 2 streams as well."""
        return 2 if self.logprobs is not None else int(self.scored)

    def events(self, request: int, sentence: int, stream: bool) -> list[Event]:
        """The events a decode of this sentence sends: its tokens (streamed, without beams), then its finish."""
        out: list[Event] = []
        if stream and self.logprobs is not None:
            best = self.hypotheses[0]
            sources = best.alignment if best.alignment is not None else [None] * len(best.tokens)
            out = [TokenEvent(request, sentence, t, lp, s)
                   for t, lp, s in zip(best.tokens, self.logprobs, sources, strict=True)]
        out.append(FinishEvent(request, sentence, self.hypotheses, self.finish_reason))
        return out


def cache_key(source: list[int], config: GenerationConfig) -> CacheKey | None:
    """The key of a sentence, or None when its translation must not be reused (sampling).

    `scores` only says whether log-probs are computed, not which tokens come out, so it is not part of the key: the
    entry says what it holds (`Entry.rank`).
    """
    return cache_keys([source], [config])[0]


def cache_keys(sources: list[list[int]], configs: list[GenerationConfig]) -> list[CacheKey | None]:
    """`cache_key` of each sentence of a request; its settings (usually one object for all) are normalised once."""
    normal: dict[int, GenerationConfig] = {}
    keys: list[CacheKey | None] = []
    for source, config in zip(sources, configs, strict=True):
        if config.do_sample:
            keys.append(None)
            continue
        if id(config) not in normal:
            normal[id(config)] = config if config.scores else replace(config, scores=True)
        keys.append((tuple(source), normal[id(config)]))
    return keys


def streams_tokens(config: GenerationConfig) -> bool:
    """Whether a decode of this sentence streams its tokens (beam search sends only its finish)."""
    return config.beam_size == 1


def needed_rank(key: CacheKey, stream: bool, scores: bool) -> int:
    """The least `Entry.rank` that answers this sentence: token log-probs to stream tokens, else scores if asked."""
    return 2 if stream and streams_tokens(key[1]) else int(scores)


def make_entry(key: CacheKey, event: FinishEvent, logprobs: list[float] | None) -> Entry:
    """The entry of a finished sentence (log-probs only when they cover every token of the best hypothesis)."""
    if logprobs is not None and len(logprobs) != len(event.hypotheses[0].tokens):
        logprobs = None  # tokens that never streamed (cannot happen for a whole decode; be safe)
    size = len(key[0]) + sum(len(h.tokens) for h in event.hypotheses) + len(logprobs or ()) + 1
    return Entry(event.hypotheses, event.finish_reason, tuple(logprobs) if logprobs is not None else None, size)


Finished = tuple[CacheKey, FinishEvent, list[float] | None]  # a sentence to keep, with its streamed log-probs


class Cache(Protocol):
    """What the scheduler asks of a translation cache: in memory (`TranslationCache`) or in Redis
    (server.shared_cache)."""

    enabled: bool
    errors: int  # lookups and writes that failed
    local: bool  # writes cost no round trip: made before the response goes out (`Scheduler`)

    def lookup(self, keys: list[CacheKey | None], stream: bool, scores: list[bool]) -> dict[int, Entry]: ...
    def put_many(self, finished: list[Finished]) -> None: ...


class TranslationCache:
    """An LRU map from sentences to their finished translations, safe to use from several threads, bounded by
    `entries` x TOKENS_PER_ENTRY tokens (sources and translations together)."""

    def __init__(self, entries: int) -> None:
        self._lru: LRUCache[CacheKey, Entry] = LRUCache(maxsize=max(entries, 1) * TOKENS_PER_ENTRY,
                                                        getsizeof=lambda e: e.size)
        self.enabled = entries > 0
        self.errors = 0  # nothing fails in memory
        self.local = True
        self._lock = threading.Lock()

    def get(self, key: CacheKey | None, stream: bool, scores: bool = True) -> Entry | None:
        """The entry that can answer this sentence: with scores when they are asked for, with token log-probs when
        it must stream tokens."""
        if key is None or not self.enabled:
            return None
        with self._lock:
            entry = self._lru.get(key)
        return entry if entry is not None and entry.rank >= needed_rank(key, stream, scores) else None

    def lookup(self, keys: list[CacheKey | None], stream: bool, scores: list[bool]) -> dict[int, Entry]:
        """The entries that answer a request's sentences, by index (`get` of each)."""
        return {i: e for i, key in enumerate(keys) if (e := self.get(key, stream, scores[i])) is not None}

    def put(self, key: CacheKey, event: FinishEvent, logprobs: list[float] | None) -> None:
        """Keep a finished sentence; an entry is never replaced by one that can answer less (`Entry.rank`)."""
        if not self.enabled:
            return
        entry = make_entry(key, event, logprobs)
        if entry.size > self._lru.maxsize:
            return  # larger than the whole cache
        with self._lock:
            old = self._lru.get(key)
            if old is None or old.rank <= entry.rank:
                self._lru[key] = entry

    def put_many(self, finished: list[Finished]) -> None:
        for key, event, logprobs in finished:
            self.put(key, event, logprobs)

    def __len__(self) -> int:
        return len(self._lru)
