"""Texts in, translations out, in one process: the engine under `tolk translate-dataset` and its Ray actors.

A call takes a window of texts (a block of rows) and plans them as the server does (`server.plan.make_plan`:
sentences that keep every newline, over-long ones cut to fit, placeholders masked). Each distinct sentence is
decoded once; the translation cache answers those seen before (in this process, and in Redis when a URL is
given, the server's key scheme, so bulk jobs and servers share work); the rest go to `model.search.generate`
longest first, which batches them continuously. A row whose text cannot be translated gets an error; the others
go on.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from model.checkpoint import LoadedModel, ModelMeta, load, read_meta
from model.events import FinishEvent, Hypothesis
from model.generation import GenerationConfig
from model.search import generate
from server.cache import Cache, CacheKey, TranslationCache, cache_keys
from server.errors import EmptyText, TolkError
from server.plan import Plan, join, make_plan
from server.text import check_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineOptions:
    """What an engine loads and how it decodes; the same in every process of a job."""

    model: Path
    source: str
    target: str
    dtype: str = "float32"
    device: str = "cpu"
    rows: int = 64  # sentences decoding together
    generation: dict[str, Any] = field(default_factory=dict)  # changes to the model's generation defaults
    max_source_tokens: int | None = None  # longer sentences are cut (default: the model's positions)
    cache_entries: int = 100_000  # sentences kept in this process: repeats across blocks decode once
    cache_url: str | None = None  # Redis, as the server's TOLK_CACHE_URL
    cache_ttl: float = 7 * 86400


@dataclass
class Translated:
    """A window's results, one per text: a translation (None for a null cell or an error) and an error."""

    translations: list[str | None]
    errors: list[str | None]
    sentences: int = 0  # sentences in the window
    decoded: int = 0  # of them, how many were decoded (the rest were repeats or cached)


def language_prefix(meta: ModelMeta, source: str, target: str) -> list[int]:
    """The ids a source starts with for this pair (a multilingual model's target token), or ValueError naming what
    the model translates instead."""
    from server.languages import match
    from server.registry import language_tokens

    info = meta.info
    if match(source, [info.source_language]) is None:
        raise ValueError(f"{meta.path} translates from {info.source_language!r}, not {source!r}")
    tokens = language_tokens(meta)
    if tokens:
        found = match(target, tokens)
        if found is None:
            raise ValueError(f"{meta.path} translates into {', '.join(sorted(tokens))}, not {target!r}")
        return [tokens[found]]
    if match(target, [info.target_language]) is None:
        raise ValueError(f"{meta.path} translates into {info.target_language!r}, not {target!r}")
    return []


def generation_config(defaults: GenerationConfig, changes: dict[str, Any]) -> GenerationConfig:
    """The model's defaults with the job's changes; without scores, which nothing here reads (greedy is faster)."""
    config = defaults.update(**changes)
    if config.do_sample:
        raise ValueError("sampling has no place in a resumable job: a block decoded again must come out the same")
    return config.update(scores=False)


class Engine:
    """One loaded model translating windows of texts; not thread-safe (one caller, as `generate` wants)."""

    def __init__(self, options: EngineOptions) -> None:
        meta = read_meta(options.model)
        self.prefix = language_prefix(meta, options.source, options.target)
        self.config = generation_config(meta.generation, options.generation)
        self.loaded: LoadedModel = load(options.model, device=options.device, dtype=options.dtype,
                                        keep_modules=False)
        self.tokenizer = self.loaded.tokenizer
        self.rows = options.rows
        positions = self.loaded.model.cfg.max_positions
        self.max_source_tokens = min(options.max_source_tokens or positions, positions)
        self.caches: list[Cache] = [TranslationCache(options.cache_entries)]
        if options.cache_url:
            from server.shared_cache import RedisCache, model_fingerprint

            self.caches.append(RedisCache(options.cache_url, meta.info.name, model_fingerprint(meta.path),
                                          options.cache_ttl))

    def translate(self, texts: Sequence[str | None]) -> Translated:
        """Translate a window of texts (None: a null cell, left null)."""
        out = Translated([None] * len(texts), [None] * len(texts))
        rows = []
        for i, text in enumerate(texts):
            if text is None:
                continue
            try:
                check_text(text, i, sys.maxsize)
            except EmptyText:
                pass  # empty and blank cells come back as they are, as the plan leaves them
            except TolkError as exc:
                out.errors[i] = str(exc).replace(f"q[{i}]", "the text")
                continue
            rows.append(i)
        plans = self._plans([texts[i] or "" for i in rows], out, rows)
        best, failed = self._decode([s for plan, _ in plans for s in plan.sources])
        out.sentences = sum(len(plan.sources) for plan, _ in plans)
        out.decoded = best.decoded
        offset = 0
        for plan, owners in plans:
            for t, row in enumerate(owners):
                sentences = [offset + s for s in plan.texts[t].sentences]
                bad = next((failed[s] for s in sentences if s in failed), None)
                if bad is not None:
                    out.errors[row] = bad
                    continue
                try:
                    out.translations[row] = join(plan, t, {s - offset: best.hypotheses[s] for s in sentences},
                                                 self.tokenizer)
                except Exception as exc:  # a repair that fails costs its row, not the job
                    log.exception("putting row %d's translation together failed", row)
                    out.errors[row] = f"putting the translation together failed: {exc}"
            offset += len(plan.sources)
        return out

    def _plans(self, texts: list[str], out: Translated, rows: list[int]) -> list[tuple[Plan, list[int]]]:
        """The window as one plan, or, if planning it fails, one plan per text, the failing ones as errors."""
        try:
            return [(self._plan(texts), rows)]
        except Exception:
            log.exception("planning a window failed; planning its texts one by one")
        plans = []
        for text, row in zip(texts, rows, strict=True):
            try:
                plans.append((self._plan([text]), [row]))
            except Exception as exc:
                out.errors[row] = f"cannot split the text into sentences: {exc}"
        return plans

    def _plan(self, texts: list[str]) -> Plan:
        return make_plan(texts, self.tokenizer, html=False, max_source_tokens=self.max_source_tokens,
                         prefix=self.prefix)

    def _decode(self, sources: list[list[int]]) -> tuple[_Decoded, dict[int, str]]:
        """The best hypothesis of every sentence, each distinct one decoded at most once; errors by sentence."""
        maybe = cache_keys(sources, [self.config] * len(sources))
        keys = [k for k in maybe if k is not None]
        if len(keys) != len(maybe):  # a sampled sentence has no key; `generation_config` refuses sampling
            raise ValueError("sampled sentences cannot be deduplicated")
        first: dict[CacheKey, int] = {}  # each distinct sentence's first index
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        distinct = list(first)
        found: dict[CacheKey, Hypothesis] = {}
        for cache in self.caches:
            missing = [k for k in distinct if k not in found]
            hits = cache.lookup(list(missing), stream=False, scores=[False] * len(missing))
            found.update({missing[i]: entry.hypotheses[0] for i, entry in hits.items()})
            for earlier in self.caches[:self.caches.index(cache)]:  # the nearer caches learn what the farther knew
                earlier.put_many([(missing[i], FinishEvent(0, i, entry.hypotheses, entry.finish_reason), None)
                                  for i, entry in hits.items()])
        todo = sorted((k for k in distinct if k not in found), key=lambda k: -len(k[0]))  # longest first
        decoded, errors = self._generate(todo)
        for cache in self.caches:
            cache.put_many([(k, FinishEvent(0, i, [h], h.finish_reason), None) for i, (k, h) in enumerate(decoded)])
        found.update(decoded)
        failed = {i: errors[key] for i, key in enumerate(keys) if key in errors}
        hypotheses = {i: found[key] for i, key in enumerate(keys) if key in found}
        return _Decoded(hypotheses, len(decoded)), failed

    def _generate(self, keys: list[CacheKey]) -> tuple[list[tuple[CacheKey, Hypothesis]], dict[CacheKey, str]]:
        """Decode sentences together; if that fails, each half apart, down to the sentence that fails alone."""
        if not keys:
            return [], {}
        try:
            hyps = generate(self.loaded.net, [list(k[0]) for k in keys], self.config, max_rows=self.rows)
            return [(k, h[0]) for k, h in zip(keys, hyps, strict=True)], {}
        except Exception as exc:
            if len(keys) == 1:
                log.exception("decoding a sentence of %d tokens failed", len(keys[0][0]))
                return [], {keys[0]: f"decoding failed: {exc}"}
        half = len(keys) // 2
        done, errors = self._generate(keys[:half])
        more, more_errors = self._generate(keys[half:])
        return done + more, {**errors, **more_errors}


@dataclass
class _Decoded:
    hypotheses: dict[int, Hypothesis]  # by sentence
    decoded: int
