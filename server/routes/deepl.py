"""DeepL's API v2 at DeepL's paths: POST /v2/translate, GET /v2/languages, /v2/glossary-language-pairs, /v2/usage.

What DeepL's SDKs, Weblate's DeepL backend and other DeepL clients send, on Tolk's engine: a translation goes
through /translate's path (`server/routes/shapes.py`), languages come from the served models, usage from
`server/usage.py`. Glossaries are in `deepl_glossaries.py`, documents in `deepl_documents.py`; errors have DeepL's
body (`server/deepl.py:deepl_error`, chosen by path in `server/errors.py`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from server.deepl import (
    DeepLTranslate,
    TagOptions,
    deepl_body,
    deepl_code,
    deepl_errors,
    json_body,
    language_name,
    target_codes,
    validated,
)
from server.deps import DetectorDep, RegistryDep, SettingsDep, check_api_key, started, usage_of
from server.errors import InvalidRequest, ValidationFailed
from server.glossaries import Glossary, owner_of
from server.multilingual import MultilingualStore, base, part_owner
from server.routes.glossaries import glossary_for, store_of
from server.routes.shapes import translate_texts
from server.settings import Settings
from server.usage import UNLIMITED, Period

router = APIRouter(tags=["DeepL"])


def multilingual_of(request: Request) -> MultilingualStore:
    store: MultilingualStore = started(request, "multilingual")
    return store


async def deepl_glossary(request: Request, settings: Settings, body: DeepLTranslate) -> Glossary | None:
    """The glossary a request names: a /v3 glossary's dictionary for the request's pair, or a /v2 glossary."""
    ids = [body.glossary_id] if body.glossary_id else body.glossary_ids
    if not ids:
        return None
    if len(ids) > 1:
        raise InvalidRequest("Tolk uses one glossary per translation; send one glossary_id")
    if not body.source_lang:
        raise InvalidRequest("source_lang is required with a glossary")
    owner = owner_of(check_api_key(request, settings, body.auth_key))
    store = multilingual_of(request)
    info = await run_in_threadpool(store.find, ids[0], owner)
    if info is None:
        return await glossary_for(request, settings, ids[0], body.auth_key)
    part = store.dictionary(info, body.source_lang, body.target_lang).part
    return await run_in_threadpool(store_of(request).get, part, part_owner(owner))


def model_type_used(asked: str) -> str:
    """One model serves a language pair, whatever type is asked for; the answer names the type asked for."""
    return "quality_optimized" if asked == "prefer_quality_optimized" else asked


@router.post("/v2/translate", openapi_extra={"requestBody": json_body(DeepLTranslate)},
             responses=deepl_errors(400, 401, 403, 404, 413, 422, 429, 456, 500, 503, 504))
async def translate(request: Request, registry: RegistryDep, detector: DetectorDep,
                    settings: SettingsDep) -> dict[str, Any]:
    """DeepL's text translation: JSON or form fields, `text` repeated; `tag_handling` through Tolk's HTML path."""
    body: DeepLTranslate = validated(DeepLTranslate, await deepl_body(request, settings))
    glossary = await deepl_glossary(request, settings, body)
    tags = TagOptions(body.ignore_tags, body.non_splitting_tags, body.splitting_tags) if body.tag_handling else None
    texts = [tags.prepare(t) for t in body.text] if tags else body.text
    done = await translate_texts(request, registry, detector, settings, texts=texts, source=body.source_lang,
                                 target=body.target_lang, html=tags is not None, key=body.auth_key,
                                 glossary=glossary)
    translations = []
    for i, text in enumerate(done.texts):
        item: dict[str, Any] = {"detected_source_language": base(done.sources[i]).upper(),
                                "text": tags.restore(text) if tags else text}
        if body.show_billed_characters:
            item["billed_characters"] = len(body.text[i])
        if body.model_type:
            item["model_type_used"] = model_type_used(body.model_type)
        if body.tag_handling:
            item["tag_handling_version"] = body.tag_handling_version or "v2"
        translations.append(item)
    return {"translations": translations}


@router.get("/v2/languages", responses=deepl_errors(400, 413, 422, 503))
@router.post("/v2/languages", responses=deepl_errors(400, 413, 422, 503))
async def languages(request: Request, registry: RegistryDep, settings: SettingsDep) -> list[dict[str, Any]]:
    """The languages Tolk translates from (`type=source`, the default) or into (`type=target`: English and
    Portuguese with DeepL's regions), from the query string or a form body (DeepL's SDKs send a form on a GET)."""
    kind = (await deepl_body(request, settings)).get("type", "source")
    if kind == "source":
        return [{"language": deepl_code(code), "name": language_name(code)} for code in registry.sources()]
    if kind != "target":
        raise ValidationFailed(f"type must be source or target, got {kind!r}")
    served = sorted({t for targets in registry.targets().values() for t in targets})
    return [{"language": code, "name": name, "supports_formality": False}
            for served_code in served for code, name in target_codes(served_code)]


@router.get("/v2/glossary-language-pairs", responses=deepl_errors(503))
async def glossary_language_pairs(registry: RegistryDep) -> dict[str, Any]:
    """The language pairs a glossary can have: those a model translates directly."""
    pairs = sorted({(base(m.source), base(t)) for m in registry.models for t in m.targets})
    return {"supported_languages": [{"source_lang": s, "target_lang": t} for s, t in pairs]}


def timestamp(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@router.get("/v2/usage", responses=deepl_errors(401, 403, 503))
async def usage(request: Request, settings: SettingsDep) -> dict[str, Any]:
    """Characters the key (without keys: everyone) translated this month, and its monthly limit."""
    key = check_api_key(request, settings, request.query_params.get("auth_key"))
    period = Period.of(datetime.now(UTC))
    count = usage_of(request).used(owner_of(key), period)
    limit = settings.character_limit or UNLIMITED
    return {"character_count": count, "character_limit": limit, "api_key_character_count": count,
            "api_key_character_limit": limit, "start_time": timestamp(period.start),
            "end_time": timestamp(period.end)}
