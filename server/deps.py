"""Typed dependencies: the app's model registry, settings and metrics; request bodies; API keys."""

from __future__ import annotations

import hmac
import json
import re
from typing import Annotated, Any, TypeVar
from urllib.parse import parse_qsl

from fastapi import Depends, Request
from pydantic import BaseModel, SecretStr, ValidationError
from starlette.datastructures import FormData
from starlette.formparsers import MultiPartException, MultiPartParser

from server.detect import LazyDetector
from server.documents.store import FileStore
from server.errors import (
    Forbidden,
    InvalidEncoding,
    InvalidJSON,
    InvalidRequest,
    InvalidText,
    NotReady,
    PayloadTooLarge,
    Unauthorized,
    ValidationFailed,
    from_validation,
)
from server.metrics import Metrics
from server.ratelimit import RateLimiter, client_identity
from server.registry import Registry
from server.schemas import DetectRequest, GenerationOptions, TranslateRequest
from server.settings import Settings
from server.usage import Usage

M = TypeVar("M", bound=BaseModel)


async def get_settings(request: Request) -> Settings:
    # These dependencies are `async def` on purpose: FastAPI runs a plain `def` dependency in its thread pool, and
    # three thread hops per request cost more than everything they do.
    settings: Settings = request.app.state.settings
    return settings


async def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


def started(request: Request, name: str) -> Any:
    """What the lifespan put on the app's state under `name`; 503 while the server is still starting."""
    value = getattr(request.app.state, name, None)
    if value is None:
        raise NotReady("the server is starting")
    return value


async def get_registry(request: Request) -> Registry:
    registry: Registry = started(request, "registry")
    return registry


async def get_detector(request: Request) -> LazyDetector:
    detector: LazyDetector = started(request, "detector")
    return detector


async def get_files(request: Request) -> FileStore:
    files: FileStore = started(request, "files")
    return files


SettingsDep = Annotated[Settings, Depends(get_settings)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
RegistryDep = Annotated[Registry, Depends(get_registry)]
DetectorDep = Annotated[LazyDetector, Depends(get_detector)]
FilesDep = Annotated[FileStore, Depends(get_files)]


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it passes the limit (whatever Content-Length claimed)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _decode(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidEncoding(f"request body is not valid UTF-8 (byte {exc.start})") from exc


def validate_json(model: type[BaseModel], body: bytes) -> Any:
    """Parse a JSON body into a model: 400 for bytes that are not UTF-8 JSON, 422 for wrong fields."""
    text = _decode(body)
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            _refuse_lone_surrogates(text)
        raise from_validation(exc) from exc


def _refuse_lone_surrogates(text: str) -> None:
    """400 invalid_text for JSON whose strings hold a lone surrogate escape ("\\ud800"): valid JSON that pydantic's
    parser refuses as a whole, whose text no translation can carry."""
    try:
        found = re.search("[\ud800-\udfff]", json.dumps(json.loads(text), ensure_ascii=False))
    except (ValueError, RecursionError):
        return
    if found:
        raise InvalidText(f"a string of the body holds the lone surrogate U+{ord(found.group()):04X}, which is no "
                          "character")


def _from_pairs(pairs: list[tuple[str, str]], nested_options: bool = True) -> dict[str, Any]:
    """Form or query fields as a request: repeated `q` makes a list; options as JSON or as flat fields (for a
    request with `options`)."""
    data: dict[str, Any] = {}
    options: dict[str, Any] = {}
    qs = [v for k, v in pairs if k == "q"]
    if qs:
        data["q"] = qs[0] if len(qs) == 1 else qs
    for key, value in pairs:
        if key == "options" and nested_options:
            try:
                options.update(json.loads(value))
            except (ValueError, TypeError) as exc:
                raise InvalidJSON("options must be a JSON object") from exc
        elif key in GenerationOptions.model_fields and nested_options:
            options[key] = value
        elif key != "q":
            data[key] = value
    if options:
        data["options"] = options
    return data


async def parse_multipart(request: Request, body: bytes) -> FormData:
    """A multipart/form-data body already read (and so bounded); 400 when it is malformed. Close it after use."""
    async def stream() -> Any:
        yield body

    try:
        form: FormData = await MultiPartParser(request.headers, stream()).parse()
    except MultiPartException as exc:
        raise InvalidRequest(f"malformed multipart body: {exc.message}") from exc
    return form


async def _form_pairs(request: Request, body: bytes) -> list[tuple[str, str]]:
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        form = await parse_multipart(request, body)
        return [(k, v) for k, v in form.multi_items() if isinstance(v, str)]
    try:
        return parse_qsl(_decode(body), keep_blank_values=True, errors="strict")
    except UnicodeDecodeError as exc:
        raise InvalidEncoding("form field is not valid UTF-8") from exc


def _json_object(body: bytes) -> dict[str, Any]:
    """A JSON body that must be an object (to merge query-string fields into); empty counts as {}."""
    text = _decode(body)
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidJSON("request body is not valid JSON") from exc
    if not isinstance(data, dict):
        raise ValidationFailed("request body must be a JSON object")
    return data


def _with_query(body: dict[str, Any], query: dict[str, Any]) -> dict[str, Any]:
    """Fields of the body, and those only the query string has (a field in both is the body's)."""
    merged = {**query, **body}
    if "options" in query and "options" in body and isinstance(body["options"], dict):
        merged["options"] = {**query["options"], **body["options"]}
    return merged


async def parse_request(request: Request, model: type[M], settings: Settings) -> M:
    """A request body from JSON, a form (urlencoded or multipart), or the query string. A POST may carry fields in
    its query string too (LibreTranslate's form clients send every field, `api_key` included, that way)."""
    nested = "options" in model.model_fields
    query = parse_qsl(request.url.query, keep_blank_values=True)
    if request.method == "GET":
        data = _from_pairs(query, nested)
    else:
        body = await read_body(request, settings.max_body_bytes)
        content_type = request.headers.get("content-type", "application/json")
        if content_type.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
            data = _from_pairs(await _form_pairs(request, body), nested)
        elif not query:
            parsed: M = validate_json(model, body)
            return parsed
        else:
            data = _json_object(body)
        if query:
            data = _with_query(data, _from_pairs(query, nested))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation(exc) from exc


async def translate_request(request: Request, settings: SettingsDep) -> TranslateRequest:
    """A TranslateRequest from a JSON body, a form body (urlencoded or multipart), or the query string (GET)."""
    return await parse_request(request, TranslateRequest, settings)


async def detect_request(request: Request, settings: SettingsDep) -> DetectRequest:
    """A DetectRequest from a JSON or form body."""
    return await parse_request(request, DetectRequest, settings)


def bearer(request: Request, schemes: tuple[str, ...] = ("bearer",)) -> str | None:
    """The token of the Authorization header when its scheme is one of `schemes` (lower case)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() in schemes and token.strip() else None


KEY_SCHEMES = ("bearer", "deepl-auth-key")  # DeepL's SDKs send `Authorization: DeepL-Auth-Key KEY`


def key_matches(given: str, keys: list[SecretStr]) -> bool:
    """Constant-time comparison against every key (no early exit that would leak which one matched)."""
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(given.encode(), key.get_secret_value().encode())
    return matched


def check_api_key(request: Request, settings: Settings, body_key: str | None) -> str | None:
    """When the server has API keys, a request needs one: Authorization: Bearer (or DeepL-Auth-Key), or the key the
    route found in the request (LibreTranslate's api_key, a plugin's token). Returns the verified key (None when
    the server has no keys: then a key the client sends means nothing, and is accepted)."""
    if not settings.api_keys:
        return None
    given = bearer(request, KEY_SCHEMES) or body_key
    if not given:
        raise Unauthorized("an API key is required (Authorization: Bearer KEY, or api_key)")
    if not key_matches(given, settings.api_keys):
        raise Forbidden("invalid API key")
    return given


def admit_client(request: Request, settings: Settings, body_key: str | None) -> str | None:
    """What every translation and detection request passes first: its API key, then its client's rate limit.
    Returns the verified key (None on a server without keys)."""
    key = check_api_key(request, settings, body_key)
    limiter: RateLimiter | None = request.app.state.rate_limiter
    if limiter is not None:
        limiter.hit(client_identity(request, key))
    return key


def usage_of(request: Request) -> Usage:
    """The app's count of characters translated per key (server/usage.py); 503 while the server starts."""
    usage: Usage = started(request, "usage")
    return usage


async def require_admin(request: Request, settings: SettingsDep) -> None:
    """Changing the server at run time needs the admin key as a bearer token."""
    if settings.admin_key is None:
        raise Forbidden("changing settings at run time is disabled (set TOLK_ADMIN_KEY)")
    given = bearer(request)
    if given is None:
        raise Unauthorized("the admin key is required (Authorization: Bearer KEY)")
    if not key_matches(given, [settings.admin_key]):
        raise Forbidden("invalid admin key")


TranslateRequestDep = Annotated[TranslateRequest, Depends(translate_request)]
DetectRequestDep = Annotated[DetectRequest, Depends(detect_request)]
AdminDep = Annotated[None, Depends(require_admin)]
