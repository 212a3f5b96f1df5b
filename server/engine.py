"""The models a server serves: loading, one scheduler each, language pairs, and starting a translation."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool

from model.checkpoint import LoadedModel, load, resolve_device
from model.generation import GenerationConfig
from server.errors import InvalidSettings, NotFound, NotReady, UnsupportedLanguage
from server.metrics import Metrics
from server.scheduler import Scheduler, source_limit
from server.settings import Settings
from server.translator import Translation, make_plan
from server.worker import ProcessScheduler, Target

log = logging.getLogger(__name__)


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


def serving_dtype(settings: Settings) -> str:
    """The precision to serve in: as configured, or for 'auto' int8 on the CPU and float32 on a GPU."""
    if settings.dtype != "auto":
        return settings.dtype
    return "int8" if resolve_device(settings.device).type == "cpu" else "float32"


def check_limits(config: GenerationConfig, settings: Settings) -> GenerationConfig:
    """Refuse settings beyond what this server allows (on top of GenerationConfig's own checks)."""
    if config.beam_size > min(settings.max_beam_size, settings.max_batch_rows):
        raise InvalidSettings(f"beam_size must be at most {min(settings.max_beam_size, settings.max_batch_rows)}")
    if config.max_new_tokens > settings.max_new_tokens:
        raise InvalidSettings(f"max_new_tokens must be at most {settings.max_new_tokens}")
    return config


def generation_config(defaults: GenerationConfig, options: dict[str, Any], alternatives: int,
                      settings: Settings) -> GenerationConfig:
    """A request's settings: the model's defaults updated by its options; n-best when alternatives are asked."""
    try:
        config = defaults.update(**options)
        if alternatives:
            config = config.update(beam_size=max(config.beam_size, alternatives + 1),
                                   num_hypotheses=alternatives + 1)
    except ValueError as exc:
        raise InvalidSettings(str(exc)) from exc
    return check_limits(config, settings)


@dataclass
class ServedModel:
    name: str
    loaded: LoadedModel  # in the server process: the tokenizer, defaults and description
    scheduler: Scheduler | ProcessScheduler
    defaults: GenerationConfig  # replaced as a whole when an admin changes them

    @property
    def source(self) -> str:
        return self.loaded.info.source_language

    @property
    def target(self) -> str:
        return self.loaded.info.target_language

    def describe(self) -> dict[str, Any]:
        model = self.loaded.model
        return {
            "name": self.name, "source": self.source, "target": self.target, "device": self.scheduler.device,
            "dtype": self.loaded.dtype, "parameters": self.loaded.parameters, "config": model.cfg.to_dict(),
            "running": self.scheduler.running, "rows": self.scheduler.settings.max_batch_rows,
        }

    async def translate(self, texts: list[str], html: bool, options: dict[str, Any], alternatives: int,
                        stream: bool) -> Translation:
        """Plan the texts (in a worker thread: long documents), then queue all their sentences as one job."""
        settings = self.scheduler.settings
        config = generation_config(self.defaults, options, alternatives, settings)
        tokenizer = self.loaded.tokenizer
        plan = await run_in_threadpool(make_plan, texts, tokenizer, html, self.scheduler.max_source_tokens)
        job = None
        if plan.sources:
            job = self.scheduler.submit(plan.sources, [config] * len(plan.sources), stream=stream)
        return Translation(plan, job, tokenizer, alternatives)


class Engine:
    """Every served model, found by name or by language pair."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.models: list[ServedModel] = []

    def start(self) -> None:
        """Load every model and start its scheduler (blocking: called from the lifespan in a worker thread)."""
        s = self.settings
        for directory in model_dirs(s):
            dtype = serving_dtype(s)
            # with a scheduler process, the model that decodes lives there; this copy stays on the CPU
            loaded = load(directory, device="cpu" if s.scheduler_process else s.device, dtype=dtype)
            name = loaded.info.name
            if any(m.name == name for m in self.models):
                raise NoModels(f"two model directories are named {name!r}")
            defaults = self._clamp(loaded.generation)
            scheduler: Scheduler | ProcessScheduler
            if s.scheduler_process:
                scheduler = ProcessScheduler(Target(name, directory, s.device, dtype), s, self.metrics,
                                             source_limit(s, loaded.model.cfg.max_positions))
            else:
                scheduler = Scheduler(name, loaded.model, s, self.metrics)
            scheduler.start()
            self.models.append(ServedModel(name, loaded, scheduler, defaults))
            log.info("serving %s (%s -> %s) from %s on %s", name, loaded.info.source_language,
                     loaded.info.target_language, directory, scheduler.device)

    def stop(self) -> None:
        for served in self.models:
            served.scheduler.stop()

    def _clamp(self, defaults: GenerationConfig) -> GenerationConfig:
        s = self.settings
        beam = min(defaults.beam_size, s.max_beam_size, s.max_batch_rows)
        clamped = defaults.update(
            beam_size=beam, num_hypotheses=min(defaults.num_hypotheses, beam),
            max_new_tokens=min(defaults.max_new_tokens, s.max_new_tokens),
            min_new_tokens=min(defaults.min_new_tokens, s.max_new_tokens),
        )
        if clamped != defaults:
            log.warning("model defaults clamped to the server's limits: %s", clamped)
        return clamped

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
            except Exception:
                log.exception("restarting a scheduler failed; trying again in %g s", interval)

    @property
    def ready(self) -> bool:
        return bool(self.models) and all(m.scheduler.running for m in self.models)

    def by_name(self, name: str) -> ServedModel:
        for served in self.models:
            if served.name == name:
                return served
        raise NotFound(f"no model named {name!r}")

    def find(self, source: str, target: str | None) -> ServedModel:
        """The model for a language pair; source 'auto' and a missing target pick the only candidate."""
        if not self.models:
            raise NotReady("no model is loaded yet")
        found = [m for m in self.models if (source == "auto" or m.source == source)
                 and (target is None or m.target == target)]
        if len(found) == 1:
            return found[0]
        pair = f"{source} -> {target or '?'}"
        if not found:
            pairs = ", ".join(f"{m.source} -> {m.target}" for m in self.models)
            raise UnsupportedLanguage(f"no model translates {pair}; this server has {pairs}")
        raise UnsupportedLanguage(f"{pair} is ambiguous; name the source and target languages")
