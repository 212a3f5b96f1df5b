"""Translation through English when no model translates a pair, as LibreTranslate does: a to English with one
model, then English to b with another. Each leg batches in its own model's scheduler; the second leg starts when
the first has finished every text, and streams when the request streams."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from server.plan import PieceEvent, Plan, TextDone, TextResult, Translation

if TYPE_CHECKING:
    from server.registry import ServedModel

PIVOT = "en"  # the language every pivot goes through


class PivotTranslation:
    """A request's texts through two models; answers and events are the second leg's."""

    def __init__(self, first: Translation, second: ServedModel, html: bool, options: dict[str, Any],
                 alternatives: int, stream: bool, timeout: float | None, target: str | None = None) -> None:
        self.first, self.second = first, second
        self.args = (html, options, alternatives, stream, timeout)
        self.target = target  # the second leg's language (a multilingual model's token)
        self.leg: Translation | None = None
        self.cancelled = False

    @property
    def load_s(self) -> float:
        """The waits for either model to load, as far as the legs have gone."""
        return self.first.load_s + (self.leg.load_s if self.leg is not None else 0.0)

    @property
    def plan(self) -> Plan:
        """The source texts' plan (the first leg's): what progress is measured in."""
        return self.first.plan

    @classmethod
    async def start(cls, first: ServedModel, second: ServedModel, texts: list[str], html: bool,
                    options: dict[str, Any], alternatives: int, stream: bool,
                    timeout: float | None = None, target: str | None = None) -> PivotTranslation:
        """Queue the first leg now (a refusal, 429 or bad settings, comes from here as for one model)."""
        leg = await first.translate(texts, html, options, 0, False, timeout, target=PIVOT)
        return cls(leg, second, html, options, alternatives, stream, timeout, target)

    async def _second_leg(self) -> Translation:
        if self.leg is None:
            english = [r.text for r in await self.first.results()]
            html, options, alternatives, stream, timeout = self.args
            self.leg = await self.second.translate(english, html, options, alternatives, stream, timeout,
                                                   target=self.target)
            if self.cancelled:  # cancelled while the second leg was being queued
                self.leg.cancel()
        return self.leg

    async def results(self) -> list[TextResult]:
        return [self._through(r) for r in await (await self._second_leg()).results()]

    async def stream(self) -> AsyncIterator[PieceEvent | TextDone]:
        async for event in (await self._second_leg()).stream():
            yield TextDone(event.index, self._through(event.result)) if isinstance(event, TextDone) else event

    def _through(self, result: TextResult) -> TextResult:
        """The second leg's result, naming both models."""
        return dataclasses.replace(result, models=[*self.first.models, *result.models])

    def cancel(self) -> None:
        self.cancelled = True
        self.first.cancel()
        if self.leg is not None:
            self.leg.cancel()
