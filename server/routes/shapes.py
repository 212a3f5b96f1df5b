"""One translation for every API shape: DeepL's and the browser plugins' requests go through /translate's path.

Each shape's route reads its own fields and builds a `TranslateRequest`, which `server/routes/translate.py:start`
checks and queues as it does for /translate: the same keys, rate limits, usage counts, routing (`route()`, its
errors mapped by the one table), translation cache and engine. So the same texts, languages and format give the
same translations whichever shape asked for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from pydantic import ValidationError

from server.deps import check_api_key, usage_of
from server.detect import LazyDetector
from server.errors import from_validation
from server.glossaries import Glossary, owner_of
from server.languages import standard
from server.registry import Registry
from server.routes.translate import start, unless_disconnected
from server.schemas import TranslateRequest
from server.settings import Settings

AUTO = ("", "auto")  # how the shapes say "detect the source"


@dataclass
class Translated:
    texts: list[str]  # the translations, in the request's order
    sources: list[str]  # each text's source language as served: detected, or the one the request named


async def translate_texts(request: Request, registry: Registry, detector: LazyDetector, settings: Settings, *,
                          texts: list[str], source: str | None, target: str | None, html: bool = False,
                          key: str | None = None, glossary: Glossary | None = None) -> Translated:
    """Translate texts as /translate does. `key`: the API key the shape found in its fields (a header's is read by
    `start`); `glossary`: one the shape found already."""
    source = "auto" if source is None or source.lower() in AUTO else source
    try:
        req = TranslateRequest(q=texts, source=source, target=target or None, format="html" if html else "text",
                               api_key=key or None)
    except ValidationError as exc:
        raise from_validation(exc) from exc
    translation = await start(request, req, registry, detector, settings, stream=False, glossary=glossary)
    try:
        results = await unless_disconnected(request, translation.results())
    finally:
        translation.cancel()
    if translation.detected is not None:
        sources = [d.language for d in translation.detected]
    else:  # named by the request, or by its glossary
        sources = [standard(glossary.info.source_lang if glossary and source == "auto" else source)] * len(texts)
    return Translated([r.text for r in results], sources)


def charge(request: Request, settings: Settings, key: str | None, characters: int) -> None:
    """Count characters translated outside `start` (a document's) towards the key's usage."""
    usage_of(request).add(owner_of(check_api_key(request, settings, key)), characters)
