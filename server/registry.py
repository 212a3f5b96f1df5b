"""The registry of served models: which directories, one scheduler each, finding a model by language pair.

The server process reads only what it needs of a model directory (configuration, tokenizer, generation
defaults: `model.checkpoint.read_meta`); the weights are loaded where the model's batcher runs.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool

from model.checkpoint import ModelMeta, int8_arithmetic, read_meta, resolve_device
from model.generation import GenerationConfig
from server import limits
from server.errors import NotFound, NotReady, UnsupportedLanguage
from server.glossaries import Glossary
from server.languages import match, standard
from server.messages import Target
from server.metrics import Metrics
from server.pivot import PIVOT
from server.plan import Translation, make_plan
from server.scheduler import Scheduler
from server.settings import Settings
from server.transport import ProcessTransport, ThreadTransport, Transport

log = logging.getLogger(__name__)

# Planning up to this many characters (splitting, masking, tokenizing: about 0.6 us a character here) stays on the
# event loop; a worker thread's round trip cost more than planning one sentence. Longer texts go to a thread.
PLAN_INLINE_CHARS = 1000


class NoModels(RuntimeError):
    """The server was given nothing it can serve."""


def model_dirs(settings: Settings) -> list[Path]:
    """The directories to serve: the configured ones, or every model directory under weights_dir."""
    if settings.models:
        missing = [str(p) for p in settings.models if not (p / "config.json").is_file()]
        if missing:
            raise NoModels(f"not a model directory (no config.json): {', '.join(missing)}")
        return list(settings.models)
    found = sorted(p.parent for p in settings.weights_dir.glob("*/config.json"))
    if not found:
        raise NoModels(
            f"no model to serve: {settings.weights_dir}/ holds no model directory. Pass --model DIR, set "
            "TOLK_MODELS, or put a model directory (config.json, model.safetensors, ...) under weights/."
        )
    return found


# A multilingual Marian model picks its output language by a token at the start of the source: >>por<<, >>pt_br<<
LANGUAGE_TOKEN = re.compile(r">>([A-Za-z]{2,3}(?:_[A-Za-z]{2,4})?)<<")


def language_tokens(meta: ModelMeta) -> dict[str, int]:
    """The target languages a multilingual model's vocabulary names (standard tags, `por` -> `pt`) and their token
    ids; empty for a model of one target language."""
    vocab = meta.tokenizer.vocab or []
    found: dict[str, int] = {}
    for i, piece in enumerate(vocab):
        m = LANGUAGE_TOKEN.fullmatch(piece)
        if m:
            found.setdefault(standard(m.group(1)), i)
    return found


def serving_dtype(settings: Settings) -> str:
    """The precision to serve in: as configured, or for 'auto' int8 on the CPU and float32 on a GPU."""
    if settings.dtype != "auto":
        return settings.dtype
    return "int8" if resolve_device(settings.device).type == "cpu" else "float32"


@dataclass
class ServedModel:
    name: str
    meta: ModelMeta  # what the server process needs: configuration, tokenizer, languages
    dtype: str
    scheduler: Scheduler
    defaults: GenerationConfig  # replaced as a whole when an admin changes them
    tokens: dict[str, int] = field(default_factory=dict)  # a multilingual model's target languages and tokens
    load: Callable[[ServedModel], Awaitable[None]] | None = None  # loads it on demand (TOLK_MAX_LOADED_MODELS)
    last_used: float = 0.0  # time.monotonic() of its last request
    active: int = 0  # requests between asking for it and handing their job to its scheduler

    @property
    def source(self) -> str:
        return self.meta.info.source_language

    @property
    def target(self) -> str:
        return self.meta.info.target_language

    @property
    def targets(self) -> list[str]:
        """The languages it translates into: its target, or a multilingual model's token languages."""
        return sorted(self.tokens) if self.tokens else [self.target]

    @property
    def int8(self) -> str | None:
        """How int8 products quantize their input (`model.checkpoint.INT8_ARITHMETIC`), as `load` picks it."""
        return int8_arithmetic(self.meta.path, self.scheduler.target.int8) if self.dtype == "int8" else None

    def describe(self) -> dict[str, Any]:
        ready = self.scheduler.ready
        return {
            "name": self.name, "source": self.source, "target": self.target, "targets": self.targets,
            "device": ready.device if ready else self.scheduler.target.device, "dtype": self.dtype,
            "int8": self.int8, "loaded": self.scheduler.running,
            "parameters": ready.parameters if ready else None, "config": self.meta.cfg.to_dict(),
            "running": self.scheduler.running, "rows": self.scheduler.settings.max_batch_rows,
        }

    async def translate(self, texts: list[str], html: bool, options: dict[str, Any], alternatives: int,
                        stream: bool, timeout: float | None = None, target: str | None = None,
                        glossary: Glossary | None = None) -> Translation:
        """Plan the texts (in a worker thread: long documents), then queue all their sentences as one job.

        `target`: the served language to translate into; a multilingual model starts every source with its token.
        `glossary`: its terms found in a sentence must appear in the sentence's translation.
        """
        config = limits.request_config(self.defaults, options, alternatives, self.scheduler.settings)
        tokenizer = self.meta.tokenizer
        prefix: list[int] = []
        if self.tokens:
            if target not in self.tokens:
                raise UnsupportedLanguage(f"{self.name} translates into {', '.join(self.targets)}; name one")
            prefix = [self.tokens[target]]
        self.active += 1  # not unloaded from here until its job is queued
        waited = 0.0
        try:
            if self.load is not None and not self.scheduler.running:
                start = time.monotonic()
                await self.load(self)
                waited = time.monotonic() - start
            plan_args = (texts, tokenizer, html, self.scheduler.max_source_tokens)
            if sum(map(len, texts)) <= PLAN_INLINE_CHARS:  # a worker thread's round trip costs more than the plan
                plan = make_plan(*plan_args, prefix=prefix, glossary=glossary, unknowns=config.replace_unknowns)
            else:
                plan = await run_in_threadpool(make_plan, *plan_args, prefix=prefix, glossary=glossary,
                                               unknowns=config.replace_unknowns)
            job = None
            if plan.sources:
                aligned = config.update(alignment=True) if plan.markup else config  # placing inline markup
                configs = [aligned if s in plan.markup else config for s in range(len(plan.sources))]
                job = self.scheduler.submit(plan.sources, configs, stream=stream,
                                            timeout=timeout, constraints=plan.sentence_constraints(),
                                            constraint_sources=plan.constraint_sources())
        finally:
            self.active -= 1
            self.last_used = time.monotonic()
        translation = Translation(plan, job, tokenizer, alternatives, self.name)
        translation.load_s = waited
        return translation

    @property
    def idle(self) -> bool:
        return self.active == 0 and not self.scheduler.busy


def new_transport(settings: Settings) -> Transport:
    """A child process per model by default; a thread of the server process when scheduler_process is off."""
    return ProcessTransport() if settings.scheduler_process else ThreadTransport()


class Registry:
    """Every served model, found by name or by language pair."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.models: list[ServedModel] = []
        self._loading = asyncio.Lock()  # one load (and its unloads to make room) at a time

    @property
    def on_demand(self) -> bool:
        return self.settings.max_loaded_models > 0

    def _scheduler(self, target: Target, meta: ModelMeta) -> Scheduler:
        s = self.settings
        return Scheduler(target, s, self.metrics, limits.source_limit(s, meta.cfg.max_positions), new_transport(s))

    def start(self) -> None:
        """Load every model and start its scheduler (blocking: called from the lifespan in a worker thread)."""
        s = self.settings
        for directory in model_dirs(s):
            meta, dtype = read_meta(directory), serving_dtype(s)
            name = meta.info.name
            if any(m.name == name for m in self.models):
                raise NoModels(f"two model directories are named {name!r}")
            scheduler = self._scheduler(Target(name, directory, s.device, dtype, s.int8), meta)
            if not self.on_demand:
                scheduler.start()
            served = ServedModel(name, meta, dtype, scheduler, limits.clamp(meta.generation, s), language_tokens(meta),
                                 load=self._load if self.on_demand else None)
            self.models.append(served)
            self.metrics.model_loads.labels(model=name)  # at 0 from the start, so that a panel shows 0, not nothing
            self.metrics.model_unloads.labels(model=name)
            device = scheduler.ready.device if scheduler.ready else "?"
            where = "loads on first use" if self.on_demand else f"on {device}"
            log.info("serving %s (%s -> %s) from %s, %s", name, served.source, ", ".join(served.targets), directory,
                     where)

    def stop(self) -> None:
        for served in self.models:
            served.scheduler.stop()

    async def _load(self, served: ServedModel) -> None:
        """Load a model on demand (its request waits, and the wait is measured), unloading the least recently used
        idle models beyond the budget first."""
        if served.scheduler.running:
            return
        async with self._loading:
            if served.scheduler.running:
                return
            start = time.monotonic()
            loaded = sorted((m for m in self.models if m is not served and m.scheduler.running),
                            key=lambda m: m.last_used)
            excess = len(loaded) + 1 - self.settings.max_loaded_models
            for victim in [m for m in loaded if m.idle][: max(0, excess)]:
                await self._unload(victim, f"to make room for {served.name}")
            if served.scheduler.ready is not None:  # it died: a stopped scheduler does not start again
                served.scheduler = self._scheduler(served.scheduler.target, served.meta)
            await run_in_threadpool(served.scheduler.start)
            waited = time.monotonic() - start
            self.metrics.model_loads.labels(model=served.name).observe(waited)
            log.info("loaded %s on demand in %.2f s", served.name, waited)

    async def _unload(self, served: ServedModel, why: str) -> None:
        """Stop an idle model's scheduler. The swap to a fresh, unstarted one happens first, on the event loop: a
        request that comes meanwhile finds it not running and waits for its load."""
        old = served.scheduler
        served.scheduler = self._scheduler(old.target, served.meta)
        await run_in_threadpool(old.stop)
        self.metrics.model_unloads.labels(model=served.name).inc()
        log.info("unloaded %s (%s)", served.name, why)

    async def unload_idle(self) -> None:
        """Unload the models idle for longer than unload_after (on demand only)."""
        after = self.settings.unload_after
        if not self.on_demand or not after:
            return
        async with self._loading:
            now = time.monotonic()
            for m in self.models:
                if m.scheduler.running and m.idle and now - m.last_used > after:
                    await self._unload(m, f"idle for {now - m.last_used:.1f} s")

    def revive(self) -> list[str]:
        """Restart every scheduler whose thread died (blocking: it allocates a new batch); their names."""
        revived = []
        for served in self.models:
            if served.scheduler.dead:
                log.error("scheduler of %s died (%r); restarting it", served.name, served.scheduler.failure)
                served.scheduler.restart()
                revived.append(served.name)
        return revived

    async def supervise(self, interval: float) -> None:
        """Every `interval` seconds, restart dead schedulers (a failed restart is tried again next time)."""
        while True:
            await asyncio.sleep(interval)
            try:
                await run_in_threadpool(self.revive)
                await self.unload_idle()
            except Exception:
                log.exception("restarting a scheduler failed; trying again in %g s", interval)

    @property
    def ready(self) -> bool:
        """Every model runs; on demand, the models are known (each loads when it is first asked for)."""
        return bool(self.models) and (self.on_demand or all(m.scheduler.running for m in self.models))

    def by_name(self, name: str) -> ServedModel:
        for served in self.models:
            if served.name == name:
                return served
        raise NotFound(f"no model named {name!r}")

    def targets(self) -> dict[str, list[str]]:
        """Each source language with the targets it can be translated into, directly or through English."""
        direct: dict[str, set[str]] = {}
        for m in self.models:
            direct.setdefault(m.source, set()).update(m.targets)
        through = direct.get(PIVOT, set())
        return {source: sorted(targets | (through - {source} if PIVOT in targets else set()))
                for source, targets in direct.items()}

    def sources(self, target: str | None = None) -> list[str]:
        """The languages that some model translates into `target` (into anything when None), directly or through
        English, sorted."""
        if not self.models:
            raise NotReady("no model is loaded yet")
        if target is not None:
            target = match(target, self._served_targets()) or target
        found = sorted(s for s, targets in self.targets().items() if target is None or target in targets)
        if not found:
            pairs = self._pairs()
            raise UnsupportedLanguage(f"no model translates into {target}; this server has {pairs}")
        return found

    def languages(self) -> list[str]:
        """Every language a model translates from or into."""
        return sorted({m.source for m in self.models} | self._served_targets())

    def knows(self, language: str) -> bool:
        """Whether some model translates from or into the language a client's code means."""
        return match(language, self.languages()) is not None

    def target_language(self, target: str | None) -> str | None:
        """The served language a client's target means (the only one when it names none), or None."""
        served = self._served_targets()
        if target is None:
            return next(iter(served)) if len(served) == 1 else None
        return match(target, served)

    def pivot(self, source: str, target: str | None) -> tuple[ServedModel, ServedModel] | None:
        """Two models through English for a pair that no model translates (source to English, English to target),
        or None."""
        if source == "auto" or target is None:
            return None
        source = match(source, (m.source for m in self.models)) or source
        target = match(target, self._served_targets()) or target
        first = [m for m in self.models if m.source == source and PIVOT in m.targets]
        second = [m for m in self.models if m.source == PIVOT and target in m.targets]
        return (first[0], second[0]) if first and second and PIVOT not in (source, target) else None

    def find(self, source: str, target: str | None) -> ServedModel:
        """The model for a language pair; source 'auto' and a missing target pick the only candidate."""
        if not self.models:
            raise NotReady("no model is loaded yet")
        if source != "auto":
            source = match(source, (m.source for m in self.models)) or source
        if target is not None:
            target = match(target, self._served_targets()) or target
        found = [m for m in self.models if (source == "auto" or m.source == source)
                 and (target is None or target in m.targets)]
        if len(found) == 1:
            return found[0]
        pair = f"{source} -> {target or '?'}"
        if not found:
            pairs = self._pairs()
            raise UnsupportedLanguage(f"no model translates {pair}; this server has {pairs}")
        raise UnsupportedLanguage(f"{pair} is ambiguous; name the source and target languages")

    def _served_targets(self) -> set[str]:
        return {t for m in self.models for t in m.targets}

    def _pairs(self) -> str:
        return ", ".join(f"{m.source} -> {'/'.join(m.targets)}" for m in self.models)
