"""The small protocols of browser-translation plugins: Immersive Translate, Kiss Translator, DeepLX, Google v2 basic.

Each is a plugin's "custom API" as the plugin sends it, on /translate's path (`server/routes/shapes.py`): the same
keys (as each plugin sends one: `?token=`, `Authorization: Bearer`, DeepLX's path segment, Google's `?key=`),
rate limits, usage and translations. Placeholders the plugins put in place of markup (`{0}`, `<b0></b0>`) are
carried through like any placeholder (`server/placeholders.py`: each comes back exactly once). docs/integrations.md
has each plugin's settings.
"""

from __future__ import annotations

import secrets
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from server.deepl import TagOptions, deepl_body, json_body, validated
from server.deps import KEY_SCHEMES, DetectorDep, RegistryDep, SettingsDep, bearer
from server.errors import TolkError, ValidationFailed
from server.multilingual import base
from server.routes.shapes import translate_texts
from server.schemas import error_responses

router = APIRouter(tags=["plugins"])
STATUSES = (400, 401, 403, 413, 422, 429, 456, 500, 503, 504)
ERRORS = error_responses(*STATUSES)


class DeepLXError(BaseModel):
    code: int = Field(description="the HTTP status")
    message: str


class GoogleErrorDetail(BaseModel):
    message: str
    domain: str
    reason: str = Field(description="Tolk's error_type")


class GoogleErrorBody(BaseModel):
    code: int
    message: str
    errors: list[GoogleErrorDetail]


class GoogleError(BaseModel):
    error: GoogleErrorBody


class ImmersiveRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    source_lang: str | None = None
    target_lang: str
    text_list: list[str] = Field(min_length=1)


@router.post("/immersive/translate", openapi_extra={"requestBody": json_body(ImmersiveRequest)}, responses=ERRORS)
async def immersive(request: Request, registry: RegistryDep, detector: DetectorDep,
                    settings: SettingsDep) -> dict[str, Any]:
    """Immersive Translate's custom API: `{source_lang, target_lang, text_list}`, the key as `?token=`."""
    body: ImmersiveRequest = validated(ImmersiveRequest, await deepl_body(request, settings, frozenset({"text_list"})))
    done = await translate_texts(request, registry, detector, settings, texts=body.text_list, source=body.source_lang,
                                 target=body.target_lang, key=request.query_params.get("token"))
    return {"translations": [{"detected_source_lang": src, "text": text}
                             for src, text in zip(done.sources, done.texts, strict=True)]}


class KissRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    texts: list[str] | None = None
    text: str | None = None
    source: str | None = Field(default=None, alias="from")
    target: str = Field(alias="to")


@router.post("/kiss/translate", openapi_extra={"requestBody": json_body(KissRequest)}, responses=ERRORS)
async def kiss(request: Request, registry: RegistryDep, detector: DetectorDep, settings: SettingsDep) -> dict[str, Any]:
    """Kiss Translator's custom API: `{texts, from, to}` (or its older `{text, from, to}`), the key as a Bearer
    token; the answer's `translations` list, and `text` and `src` too for one `text`."""
    body: KissRequest = validated(KissRequest, await deepl_body(request, settings, frozenset({"texts"})))
    texts = body.texts if body.texts is not None else [body.text] if body.text is not None else None
    if not texts:
        raise ValidationFailed("texts: Field required")
    done = await translate_texts(request, registry, detector, settings, texts=texts, source=body.source,
                                 target=body.target, key=request.query_params.get("token"))
    translations = [{"text": text, "src": src} for src, text in zip(done.sources, done.texts, strict=True)]
    one = {"text": done.texts[0], "src": done.sources[0]} if body.texts is None else {}
    return {**one, "translations": translations}


class DeepLXRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    text: str
    source_lang: str | None = None
    target_lang: str
    tag_handling: Literal["html", "xml", ""] | None = None


async def _deeplx(request: Request, registry: RegistryDep, detector: DetectorDep, settings: SettingsDep,
                  token: str | None) -> dict[str, Any]:
    body: DeepLXRequest = validated(DeepLXRequest, await deepl_body(request, settings, frozenset()))
    tags = TagOptions([], [], []) if body.tag_handling else None
    done = await translate_texts(request, registry, detector, settings, texts=[body.text], source=body.source_lang,
                                 target=body.target_lang, html=tags is not None,
                                 key=bearer(request, KEY_SCHEMES) or token or request.query_params.get("token"))
    return {"code": 200, "id": secrets.randbelow(10**10), "data": done.texts[0], "alternatives": [],
            "source_lang": base(done.sources[0]).upper(), "target_lang": body.target_lang.upper(), "method": "Free"}


@router.post("/deeplx/translate", openapi_extra={"requestBody": json_body(DeepLXRequest)},
             responses=error_responses(*STATUSES, body=DeepLXError))
async def deeplx(request: Request, registry: RegistryDep, detector: DetectorDep,
                 settings: SettingsDep) -> dict[str, Any]:
    """DeepLX's `{text, source_lang, target_lang}`; the key as `?token=` or a Bearer token."""
    return await _deeplx(request, registry, detector, settings, None)


@router.post("/deeplx/{token}/translate", openapi_extra={"requestBody": json_body(DeepLXRequest)},
             responses=error_responses(*STATUSES, body=DeepLXError))
async def deeplx_token(token: str, request: Request, registry: RegistryDep, detector: DetectorDep,
                       settings: SettingsDep) -> dict[str, Any]:
    """DeepLX with the key as a path segment, as hosted DeepLX services take it."""
    return await _deeplx(request, registry, detector, settings, token)


def deeplx_error(error: TolkError, status: int) -> dict[str, Any]:
    return DeepLXError(code=status, message=error.message).model_dump()


class GoogleRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    q: list[str] = Field(min_length=1)
    source: str | None = None
    target: str
    format: Literal["html", "text"] = "html"  # Google's default
    key: str | None = None


@router.post("/language/translate/v2", openapi_extra={"requestBody": json_body(GoogleRequest)},
             responses=error_responses(*STATUSES, body=GoogleError))
@router.get("/language/translate/v2", responses=error_responses(*STATUSES, body=GoogleError))
async def google(request: Request, registry: RegistryDep, detector: DetectorDep,
                 settings: SettingsDep) -> dict[str, Any]:
    """Google Cloud Translation's basic v2: `q` (one or repeated), `source`, `target`, `format`, `key`."""
    fields = await deepl_body(request, settings, frozenset({"q"}))
    if isinstance(fields.get("q"), str):
        fields["q"] = [fields["q"]]
    body: GoogleRequest = validated(GoogleRequest, fields)
    done = await translate_texts(request, registry, detector, settings, texts=body.q, source=body.source,
                                 target=body.target, html=body.format == "html", key=body.key)
    detected = not body.source
    return {"data": {"translations": [{"translatedText": text, **({"detectedSourceLanguage": src} if detected else {})}
                                      for src, text in zip(done.sources, done.texts, strict=True)]}}


@router.get("/language/translate/v2/languages", responses=error_responses(503, body=GoogleError))
async def google_languages(registry: RegistryDep) -> dict[str, Any]:
    """Google v2's language list: every language Tolk translates from or into."""
    codes = sorted(set(registry.targets()) | {t for ts in registry.targets().values() for t in ts})
    return {"data": {"languages": [{"language": code} for code in codes]}}


def google_error(error: TolkError, status: int) -> dict[str, Any]:
    detail = GoogleErrorDetail(message=error.message, domain="global", reason=error.error_type)
    return GoogleError(error=GoogleErrorBody(code=status, message=error.message, errors=[detail])).model_dump()


ERROR_SHAPES = (("/deeplx/", deeplx_error), ("/language/translate/", google_error))

BODIES = (ImmersiveRequest, KissRequest, DeepLXRequest, GoogleRequest)  # request bodies in the API schema
