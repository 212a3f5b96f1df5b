"""Finished sentences of one model, kept by (source token ids, generation settings) and answered again at once.

Software strings and documents repeat sentences constantly; a sentence decoded once with the same settings comes
out the same every time (decoding is deterministic outside sampling), so the scheduler answers a repeat from here
without decoding it. Sampled sentences are never kept. An entry remembers the log-probability of each token when
the sentence was streamed, so a streamed repeat replays exactly the events a decoded one sends; a sentence first
decoded without streaming serves later streamed requests only once a streamed decode has filled those in.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from cachetools import LRUCache

from model.events import Event, FinishEvent, Hypothesis, TokenEvent
from model.generation import GenerationConfig

CacheKey = tuple[tuple[int, ...], GenerationConfig]


@dataclass(frozen=True)
class Entry:
    hypotheses: list[Hypothesis]  # best first
    finish_reason: str
    logprobs: tuple[float, ...] | None  # per token of the best hypothesis, when it was decoded streaming

    def events(self, request: int, sentence: int, stream: bool) -> list[Event]:
        """The events a decode of this sentence sends: its tokens (streamed, without beams), then its finish."""
        out: list[Event] = []
        if stream and self.logprobs is not None:
            out = [TokenEvent(request, sentence, t, lp)
                   for t, lp in zip(self.hypotheses[0].tokens, self.logprobs, strict=True)]
        out.append(FinishEvent(request, sentence, self.hypotheses, self.finish_reason))
        return out


def cache_key(source: list[int], config: GenerationConfig) -> CacheKey | None:
    """The key of a sentence, or None when its translation must not be reused (sampling)."""
    return None if config.do_sample else (tuple(source), config)


def streams_tokens(config: GenerationConfig) -> bool:
    """Whether a decode of this sentence streams its tokens (beam search sends only its finish)."""
    return config.beam_size == 1


class TranslationCache:
    """A bounded LRU map from sentences to their finished translations; safe to use from several threads."""

    def __init__(self, entries: int) -> None:
        self._lru: LRUCache[CacheKey, Entry] = LRUCache(maxsize=max(entries, 1))
        self.enabled = entries > 0
        self._lock = threading.Lock()

    def get(self, key: CacheKey | None, stream: bool) -> Entry | None:
        """The entry that can answer this sentence: with token log-probs when it must stream tokens."""
        if key is None or not self.enabled:
            return None
        with self._lock:
            entry = self._lru.get(key)
        if entry is None or (stream and streams_tokens(key[1]) and entry.logprobs is None):
            return None
        return entry

    def put(self, key: CacheKey, event: FinishEvent, logprobs: list[float] | None) -> None:
        """Keep a finished sentence; an entry with token log-probs is never replaced by one without."""
        if not self.enabled:
            return
        if logprobs is not None and len(logprobs) != len(event.hypotheses[0].tokens):
            logprobs = None  # tokens that never streamed (cannot happen for a whole decode; be safe)
        with self._lock:
            old = self._lru.get(key)
            if old is not None and old.logprobs is not None and logprobs is None:
                return
            self._lru[key] = Entry(event.hypotheses, event.finish_reason,
                                   tuple(logprobs) if logprobs is not None else None)

    def __len__(self) -> int:
        return len(self._lru)
