"""Which model translates each text of a request, and the translations put back in the request's order.

A named source language sends every text to the one model for the pair. `auto` detects each text's language
(`server/detect.py`), so one request may go to several models: each model gets one job with its texts, and the
answers, whole or streamed, come back by the request's indices. A pair that no model translates goes through English
when two models make the way (`server/pivot.py`). A text already in the target language (named so, or detected) comes
back as it is, as LibreTranslate answers it; one detected in a language no model (or pivot) translates is refused
with the language named, never translated from another.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool

from server.detect import MAX_CHARS, Detection, LazyDetector
from server.errors import UnsupportedLanguage
from server.glossaries import Glossary
from server.languages import match, standard
from server.pivot import PivotTranslation
from server.plan import PieceEvent, TextDone, TextResult, Translation
from server.registry import Registry, ServedModel
from server.stream import Piece
from server.text import split_html

# Detecting up to this many characters in all stays on the event loop (well under a millisecond); more goes to a
# worker thread.
INLINE_CHARS = 4000

Event = PieceEvent | TextDone


@dataclass
class Route:
    served: ServedModel | None  # the model that answers (into the request's target); None: the texts are in it
    indices: list[int]  # the positions of its texts in the request
    via: ServedModel | None = None  # through English: the model of the first leg (server/pivot.py)
    target: str | None = None  # the served language asked for (a multilingual model's token picks it)


def direct_or_pivot(registry: Registry, source: str, target: str | None, indices: list[int]) -> Route:
    """The pair's model, else two models through English; UnsupportedLanguage when neither exists."""
    language = registry.target_language(target)
    try:
        return Route(registry.find(source, target), indices, target=language)
    except UnsupportedLanguage:
        legs = registry.pivot(source, target)
        if legs is None:
            raise
        return Route(legs[1], indices, via=legs[0], target=language)


@dataclass
class Routing:
    routes: list[Route]
    detected: list[Detection] | None  # each text's language, when the request's source was auto


def visible_text(text: str, html: bool) -> str:
    """What detection reads: the text, or for HTML its text nodes (tag names would all look English)."""
    return " ".join(part for is_text, part in split_html(text) if is_text) if html else text


async def route(registry: Registry, detector: LazyDetector, source: str, target: str | None, texts: list[str],
                html: bool) -> Routing:
    """The model of each text: the pair's model, or with source `auto` the model of each text's detected language."""
    everything = list(range(len(texts)))
    if source != "auto":
        if _same(source, target) and registry.knows(source):
            return Routing([Route(None, everything, target=target)], None)
        return Routing([direct_or_pivot(registry, source, target, everything)], None)
    found = await detector.get()
    samples = [visible_text(text, html)[:MAX_CHARS] for text in texts]

    def detect() -> list[Detection]:
        return [found.best(sample) for sample in samples]

    detected = detect() if sum(map(len, samples)) <= INLINE_CHARS else await run_in_threadpool(detect)
    groups: dict[str, list[int]] = {}
    for i, d in enumerate(detected):
        groups.setdefault(d.language, []).append(i)
    return Routing([detected_route(registry, detected[indices[0]], target, indices)
                    for indices in groups.values()], detected)


def detected_route(registry: Registry, found: Detection, target: str | None, indices: list[int]) -> Route:
    """The route of texts detected in one language: none when they are in the target already; 400 naming the
    language when no model (or pivot) translates it into the target."""
    into = target if target is not None else registry.target_language(None)
    if into is not None and _same(found.language, into):
        return Route(None, indices, target=into)
    try:
        return direct_or_pivot(registry, found.language, target, indices)
    except UnsupportedLanguage as exc:
        where = f"q[{indices[0]}]" if len(indices) == 1 else f"q[{indices[0]}] and {len(indices) - 1} more"
        raise UnsupportedLanguage(
            f"{where}: detected language {found.language} (confidence {found.confidence}), which this server does "
            f"not translate into {into or 'the target'}; it translates from {', '.join(_sources(registry, into))}"
        ) from exc


def _sources(registry: Registry, target: str | None) -> list[str]:
    try:
        return registry.sources(target)
    except UnsupportedLanguage:
        return registry.sources()


def _same(language: str, other: str | None) -> bool:
    """Whether two codes name one language (`pt-BR` and `pt` do, `en` and `pt` do not)."""
    return other is not None and match(language, [other]) is not None


def _language(tag: str) -> str:
    return standard(tag).split("-")[0].lower()


def check_glossary(r: Route, glossary: Glossary) -> None:
    """A glossary is used by a model of its own language pair (regional variants aside), never through English."""
    info = glossary.info
    if r.served is None:  # texts already in the target language: nothing to apply it to
        return
    target = r.target or r.served.target
    if r.via is not None:
        raise UnsupportedLanguage(f"glossary {info.glossary_id} needs a model for {info.source_lang} -> "
                                  f"{info.target_lang}; this pair goes through English")
    if (_language(info.source_lang), _language(info.target_lang)) != (_language(r.served.source), _language(target)):
        raise UnsupportedLanguage(f"glossary {info.glossary_id} is for {info.source_lang} -> {info.target_lang}, "
                                  f"not {r.served.source} -> {target}")


class Unchanged:
    """Texts already in the target language, answered as they are."""

    load_s = 0.0

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def cancel(self) -> None:
        pass

    async def results(self) -> list[TextResult]:
        return [TextResult(text, [], "eos", 0, 0, []) for text in self.texts]

    async def stream(self) -> AsyncIterator[Event]:
        for i, text in enumerate(self.texts):
            yield PieceEvent(i, Piece(text, None, None))
            yield TextDone(i, TextResult(text, [], "eos", 0, 0, []))


Translating = Translation | PivotTranslation | Unchanged  # what a route's texts are answered by


class RoutedTranslation:
    """The translations of a request's routes, answered in the request's order (whole, or as one stream)."""

    def __init__(self, parts: list[tuple[list[int], Translating]], detected: list[Detection] | None,
                 alternatives: int) -> None:
        self.parts = parts  # (the request's indices of its texts, their translation) per route
        self.detected = detected
        self.alternatives = alternatives

    @classmethod
    async def start(cls, routing: Routing, texts: list[str], html: bool, options: dict[str, Any],
                    alternatives: int, stream: bool, timeout: float | None = None,
                    glossary: Glossary | None = None) -> RoutedTranslation:
        """Queue each route's texts with its model; if one refuses (429, bad settings), the others are cancelled.

        `glossary`: its terms are forced into the translations; every route must be its language pair's own model.
        """
        if glossary is not None:
            for r in routing.routes:
                check_glossary(r, glossary)
        parts: list[tuple[list[int], Translating]] = []
        try:
            for r in routing.routes:
                mine = [texts[i] for i in r.indices]
                translation: Translating
                if r.served is None:
                    translation = Unchanged(mine)
                elif r.via is None:
                    translation = await r.served.translate(mine, html, options, alternatives, stream, timeout,
                                                           target=r.target, glossary=glossary)
                else:
                    translation = await PivotTranslation.start(r.via, r.served, mine, html, options, alternatives,
                                                               stream, timeout, target=r.target)
                parts.append((r.indices, translation))
        except BaseException:
            for _, translation in parts:
                translation.cancel()
            raise
        return cls(parts, routing.detected, alternatives)

    def cancel(self) -> None:
        for _, translation in self.parts:
            translation.cancel()

    @property
    def load_s(self) -> float:
        """How long the request waited for its models to load (one at a time: the waits add up)."""
        return sum(translation.load_s for _, translation in self.parts)

    def server_timing(self) -> dict[str, str]:
        """A Server-Timing header naming the wait for a model loaded on demand; none when nothing loaded."""
        if not self.load_s:
            return {}
        return {"Server-Timing": f'load;dur={self.load_s * 1000:.0f};desc="model loaded on demand"'}

    async def results(self) -> list[TextResult]:
        if len(self.parts) == 1:
            return await self.parts[0][1].results()
        tasks = [asyncio.ensure_future(translation.results()) for _, translation in self.parts]
        try:
            answers = await asyncio.gather(*tasks)
        finally:  # one route failed (or the client left): the others need not be waited for
            for task in tasks:
                task.cancel()
        by_index = {i: r for (indices, _), results in zip(self.parts, answers, strict=True)
                    for i, r in zip(indices, results, strict=True)}
        return [by_index[i] for i in range(len(by_index))]

    def stream(self) -> AsyncIterator[Event]:
        """Each text's pieces in reading order and its TextDone, with the request's indices."""
        if len(self.parts) == 1:  # one route holds every text, in the request's order
            return self.parts[0][1].stream()
        return self._merged()

    async def _merged(self) -> AsyncIterator[Event]:
        queue: asyncio.Queue[tuple[int, Event | Exception | None]] = asyncio.Queue()
        tasks = [asyncio.create_task(_pump(k, translation, queue)) for k, (_, translation) in enumerate(self.parts)]
        try:
            running = len(tasks)
            while running:
                k, item = await queue.get()
                if item is None:
                    running -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield dataclasses.replace(item, index=self.parts[k][0][item.index])
        finally:
            for task in tasks:
                task.cancel()


async def _pump(k: int, translation: Translating, queue: asyncio.Queue[tuple[int, Event | Exception | None]]) -> None:
    """Route k's events into the merged queue, then None (or the error that ended it)."""
    try:
        async for event in translation.stream():
            queue.put_nowait((k, event))
    except Exception as exc:  # handed to the reader, which raises it where a single stream would have
        queue.put_nowait((k, exc))
    else:
        queue.put_nowait((k, None))
