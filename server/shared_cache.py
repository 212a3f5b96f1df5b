"""The translation cache in Redis (TOLK_CACHE_URL), shared by every replica that serves the same model.

Same contract as server.cache.TranslationCache: an entry answers a sentence when its rank suffices, and is never
replaced by one that answers less (checked in Redis itself, by a script, so that replicas writing at once agree).
A request's sentences are looked up in one round trip (MGET). Keys name the model and a fingerprint of its files,
so replicas share entries only when they serve the same weights, and a new model version starts empty. Redis being
away never fails a request: a lookup that fails is a miss, a write that fails is dropped, and both are counted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import redis

from model.events import FinishEvent, Hypothesis
from server.cache import Cache, CacheKey, Entry, Finished, TranslationCache, make_entry, needed_rank
from server.settings import Settings

log = logging.getLogger(__name__)

AWAY_S = 5.0  # after a failed call, requests skip Redis this long rather than each wait for its timeout

# Keep the new value unless the stored one answers more (its first character is its rank).
PUT_UNLESS_BETTER = """
local old = redis.call('GET', KEYS[1])
if old and tonumber(string.sub(old, 1, 1)) > tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""


def model_fingerprint(directory: Path) -> str:
    """A digest of a model directory's weights and configuration: replicas agree on it iff they serve the same model."""
    digest = hashlib.sha256()
    for name in ("config.json", "source.spm", "target.spm", "model.safetensors"):
        with (directory / name).open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def encode(entry: Entry) -> str:
    body = {"h": [[h.tokens, h.score, h.finish_reason, h.alignment] for h in entry.hypotheses],
            "f": entry.finish_reason, "l": list(entry.logprobs) if entry.logprobs is not None else None,
            "s": entry.size}
    return f"{entry.rank}{json.dumps(body, separators=(',', ':'))}"  # NaN scores travel as NaN (json allows it)


def decode(raw: bytes) -> Entry:
    body = json.loads(raw[1:])
    logprobs = body["l"]
    return Entry([Hypothesis(*h) for h in body["h"]], body["f"],
                 tuple(logprobs) if logprobs is not None else None, body["s"])


class RedisCache:
    """A model's translation cache in Redis; entries expire after `ttl` seconds."""

    def __init__(self, url: str, model: str, fingerprint: str, ttl: float, timeout: float = 0.25) -> None:
        self.client: Any = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        self.prefix = f"tolk:translation:{model}:{fingerprint}:"
        self.ttl_ms = int(ttl * 1000)
        self.enabled = True
        self.local = False  # a round trip per write: after the response (`Scheduler`)
        self.errors = 0  # lookups and writes that failed (Redis away): the scheduler counts them as metrics
        self._away_until = 0.0  # after a failure Redis is left alone a while: a lookup runs on the event loop
        self._put = self.client.register_script(PUT_UNLESS_BETTER)
        try:
            self.client.ping()
        except redis.RedisError as exc:
            log.warning("translation cache in Redis not reachable (%s): sentences decode until it is", exc)

    def redis_key(self, key: CacheKey) -> str:
        source, config = key
        text = json.dumps([list(source), dataclasses.asdict(config)], sort_keys=True, separators=(",", ":"))
        return self.prefix + hashlib.sha256(text.encode()).hexdigest()[:32]

    def lookup(self, keys: list[CacheKey | None], stream: bool, scores: list[bool]) -> dict[int, Entry]:
        wanted = [(i, key) for i, key in enumerate(keys) if key is not None]
        if not wanted:
            return {}
        if time.monotonic() < self._away_until:
            self.errors += 1
            return {}
        try:
            values = self.client.mget([self.redis_key(key) for _, key in wanted])
        except redis.RedisError as exc:
            self._failed("lookup", exc)
            return {}
        hits = {}
        for (i, key), raw in zip(wanted, values, strict=True):
            if raw is not None and (entry := decode(raw)).rank >= needed_rank(key, stream, scores[i]):
                hits[i] = entry
        return hits

    def put(self, key: CacheKey, event: FinishEvent, logprobs: list[float] | None) -> None:
        self.put_many([(key, event, logprobs)])

    def put_many(self, finished: list[Finished]) -> None:
        """Keep finished sentences, in one round trip."""
        if not finished or time.monotonic() < self._away_until:
            return
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for key, event, logprobs in finished:
                    entry = make_entry(key, event, logprobs)
                    self._put(keys=[self.redis_key(key)], args=[entry.rank, encode(entry), self.ttl_ms], client=pipe)
                pipe.execute()
        except redis.RedisError as exc:
            self._failed("write", exc)

    def _failed(self, what: str, exc: Exception) -> None:
        self.errors += 1
        self._away_until = time.monotonic() + AWAY_S
        if self.errors == 1 or self.errors % 1000 == 0:
            log.warning("translation cache %s failed (%s; %d failures so far): decoding instead", what, exc,
                        self.errors)


def open_cache(settings: Settings, model: str, directory: Path) -> Cache:
    """The translation cache of one model: in Redis when TOLK_CACHE_URL names one, else in memory."""
    if settings.cache_url:
        return RedisCache(settings.cache_url, model, model_fingerprint(directory), settings.cache_ttl)
    return TranslationCache(settings.translation_cache_entries)
