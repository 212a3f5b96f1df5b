"""POST /translate (LibreTranslate-compatible JSON or form) and /translate/stream (server-sent events)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Awaitable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import StreamingResponse
from fastapi.sse import KEEPALIVE_COMMENT, ServerSentEvent, format_sse_event

from server.deps import (
    DetectorDep,
    MetricsDep,
    RegistryDep,
    SettingsDep,
    TranslateRequestDep,
    admit_client,
    usage_of,
)
from server.detect import Detection, LazyDetector
from server.errors import ClientClosed, TolkError, error_body
from server.glossaries import Glossary, owner_of
from server.languages import match, standard
from server.metrics import Metrics
from server.plan import PieceEvent, TextResult
from server.registry import Registry
from server.routes.glossaries import glossary_for
from server.routing import RoutedTranslation, route
from server.schemas import (
    RETRY_AFTER,
    DetectedLanguage,
    GenerationOptions,
    TextDetails,
    TranslateRequest,
    TranslateResponse,
    error_responses,
)
from server.settings import Settings
from server.text import check_texts

router = APIRouter(tags=["translate"])
T = TypeVar("T")


def _non_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A field's schema without its `null` alternative: a form or query field that is absent is None."""
    alternatives = [s for s in schema.get("anyOf", []) if s.get("type") != "null"]
    if len(alternatives) != 1:
        return schema
    rest = {k: v for k, v in schema.items() if k not in ("anyOf", "default")}
    return {**alternatives[0], **rest}


def _flat_fields() -> dict[str, dict[str, Any]]:
    """Form and query fields: the request's fields, with the generation options as fields of their own.

    (An `options` field holding the options as a JSON object is taken too, but only the flat form is documented.)
    """
    fields = {**TranslateRequest.model_json_schema()["properties"],
              **GenerationOptions.model_json_schema()["properties"]}
    del fields["options"]
    fields["q"] = {"type": "array", "items": {"type": "string"}, "description": "a text; repeated for several texts",
                   "examples": [["Open the file."]]}
    return {name: _non_null(schema) for name, schema in fields.items()}


FLAT_FIELDS = _flat_fields()
FORM_SCHEMA = {"type": "object", "properties": FLAT_FIELDS, "required": ["q"], "additionalProperties": False}
REQUEST_BODY = {
    "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/TranslateRequest"}},
        "application/x-www-form-urlencoded": {"schema": FORM_SCHEMA},
    },
    "required": True,
}
QUERY_PARAMETERS = [
    {"name": name, "in": "query", "required": name == "q", "schema": schema, "style": "form", "explode": True}
    for name, schema in FLAT_FIELDS.items()
]
ERROR_STATUSES = (400, 401, 403, 404, 413, 422, 429, 500, 503, 504)  # 404: an unknown glossary_id
ERRORS = error_responses(*ERROR_STATUSES)
# Refusals of a stream come before it starts, as JSON; `model` would file them under text/event-stream.
# (ErrorBody is among the components through /translate's ERRORS.)
STREAM_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
           **({"headers": RETRY_AFTER} if code == 429 else {})}
    for code in ERROR_STATUSES
}


async def start(request: Request, req: TranslateRequest, registry: Registry, detector: LazyDetector,
                settings: Settings, stream: bool, glossary: Glossary | None = None) -> RoutedTranslation:
    """Check the request and queue its sentences; every refusal happens here, before any answer starts.

    `glossary`: one the caller found already (DeepL's multilingual glossaries), instead of `req.glossary_id`'s.
    The characters of the texts count towards the key's usage (server/usage.py) once they are queued.
    """
    key = admit_client(request, settings, req.api_key)
    usage, owner = usage_of(request), owner_of(key)
    usage.check(owner)
    texts = req.texts
    check_texts(texts, settings.max_texts, settings.max_text_chars)
    html = req.format == "html"
    source = req.source
    if req.glossary_id and glossary is None:  # (a form's empty field is none)
        glossary = await glossary_for(request, settings, req.glossary_id, req.api_key)
    if glossary is not None and source == "auto":  # as DeepL, a glossary names the source language
        source = glossary.info.source_lang
    routing = await route(registry, detector, source, req.target, texts, html)
    # Token log-probs are read only by a stream (each token's logprob) and by return_scores; greedy rows skip them.
    options = {**req.options.generation(), "scores": stream or req.options.return_scores}
    translation = await RoutedTranslation.start(routing, texts, html, options, req.alternatives, stream,
                                                glossary=glossary)
    usage.add(owner, sum(map(len, texts)))
    return translation


async def _disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await work, or raise ClientClosed as soon as the client goes away."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise ClientClosed("the client closed the connection")
    finally:
        task.cancel()
        watch.cancel()


def _detected(d: Detection) -> DetectedLanguage:
    return DetectedLanguage(confidence=d.confidence, language=d.language)


def _response(req: TranslateRequest, detected: list[Detection] | None, results: list[TextResult],
              named: str) -> TranslateResponse:
    one = isinstance(req.q, str)
    response = TranslateResponse(translatedText=results[0].text if one else [r.text for r in results])
    if req.alternatives:
        response.alternatives = results[0].alternatives if one else [r.alternatives for r in results]
    # A named source is reported too, as certain: some clients (Traduzir Paginas Web) read it whatever they sent.
    found = detected or [Detection(named, 100.0)] * len(results)
    response.detectedLanguage = _detected(found[0]) if one else [_detected(d) for d in found]
    if req.options.return_scores:
        details = [TextDetails(finish_reason=r.finish_reason, input_tokens=r.input_tokens,
                               generated_tokens=r.generated_tokens, scores=r.scores, models=r.models)
                   for r in results]
        response.details = details[0] if one else details
    return response


@router.post("/translate", response_model=TranslateResponse, response_model_exclude_none=True,
             openapi_extra={"requestBody": REQUEST_BODY}, responses=ERRORS)
async def translate(request: Request, response: Response, req: TranslateRequestDep, registry: RegistryDep,
                    detector: DetectorDep, settings: SettingsDep) -> TranslateResponse:
    """Translate a text or a list of texts; long texts are split into sentences that are batched together. A `q`
    that is a JSON-encoded list of texts is answered with a JSON-encoded list (as Nextcloud's client sends it)."""
    encoded = encoded_list(req.q)
    if encoded is not None:
        req = req.model_copy(update={"q": encoded})
    translation = await start(request, req, registry, detector, settings, stream=False)
    try:
        results = await unless_disconnected(request, translation.results())
    finally:
        translation.cancel()
    response.headers.update(translation.server_timing())
    named = match(req.source, registry.languages()) or standard(req.source)  # "en-US" is the served "en"
    answer = _response(req, translation.detected, results, named)
    if encoded is not None and isinstance(answer.detectedLanguage, list):
        answer.translatedText = json.dumps(answer.translatedText, ensure_ascii=False)
        answer.detectedLanguage = answer.detectedLanguage[0]
    return answer


def encoded_list(q: str | list[str]) -> list[str] | None:
    """The texts of a `q` that is one string holding a JSON list of strings, else None."""
    if not isinstance(q, str) or not (q.startswith("[") and q.rstrip().endswith("]")):
        return None
    try:
        texts = json.loads(q)
    except ValueError:
        return None
    if isinstance(texts, list) and texts and all(isinstance(t, str) for t in texts):
        return texts
    return None


async def stream_translation(request: Request, req: TranslateRequestDep, registry: RegistryDep,
                             detector: DetectorDep, settings: SettingsDep) -> AsyncIterator[RoutedTranslation]:
    """Start a streamed translation before the response begins (so refusals keep their status); cancel after."""
    translation = await start(request, req, registry, detector, settings, stream=True)
    try:
        yield translation
    finally:
        translation.cancel()


StreamDep = Annotated[RoutedTranslation, Depends(stream_translation)]
SSE_PING = 15.0  # seconds without an event before a keep-alive comment, as FastAPI's SSE sends


async def sse_events(translation: RoutedTranslation, metrics: Metrics) -> AsyncIterator[ServerSentEvent]:
    """`token` events with text pieces, a `done` event per text (with its detected language when the source was
    auto), or an `error` event."""
    detected = translation.detected
    # Data goes out pre-serialized (raw_data): FastAPI's generic encoder costs more per token than the rest of
    # the event's way to the socket. Every value here is a str, an int, or a finite float or None.
    try:
        async for event in translation.stream():
            if isinstance(event, PieceEvent):
                p = event.piece
                logprob = p.logprob if p.logprob is not None and math.isfinite(p.logprob) else None
                token = {"id": p.token, "text": p.text, "logprob": logprob}
                yield ServerSentEvent(event="token", raw_data=json.dumps({"index": event.index, "token": token}))
                continue
            r = event.result
            yield ServerSentEvent(event="done", raw_data=json.dumps({
                "index": event.index, "translatedText": r.text, "finish_reason": r.finish_reason,
                "generated_tokens": r.generated_tokens, "input_tokens": r.input_tokens,
                **({"alternatives": r.alternatives} if translation.alternatives else {}),
                **({"detectedLanguage": _detected(detected[event.index]).model_dump()} if detected else {}),
            }))
    except TolkError as exc:
        metrics.failures.labels(error_type=exc.error_type).inc()
        yield ServerSentEvent(event="error", raw_data=json.dumps(error_body(exc)))
    finally:
        translation.cancel()


# The 200 answer as FastAPI describes an EventSourceResponse: a stream of SSE items
STREAM_OK: dict[int | str, dict[str, Any]] = {200: {"description": "Successful Response", "content": {
    "text/event-stream": {"itemSchema": {"type": "object", "properties": {
        "data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"},
        "retry": {"type": "integer", "minimum": 0}}}}}}}


class EventStream(StreamingResponse):
    """A text/event-stream response written by `coalesced` (FastAPI's EventSourceResponse would iterate the route).
    Its class names no media type, so that the API schema has STREAM_OK's description of the events alone."""

    def __init__(self, content: AsyncIterator[bytes], headers: dict[str, str], status_code: int = 200) -> None:
        super().__init__(content, status_code, headers, media_type="text/event-stream")


@router.post("/translate/stream", response_class=EventStream, openapi_extra={"requestBody": REQUEST_BODY},
             responses={**STREAM_OK, **STREAM_ERRORS})
@router.get("/translate/stream", response_class=EventStream, openapi_extra={"parameters": QUERY_PARAMETERS},
            responses={**STREAM_OK, **STREAM_ERRORS})
async def translate_stream(translation: StreamDep, metrics: MetricsDep) -> EventStream:
    """Stream translations as server-sent events (GET takes the same fields as query parameters)."""
    return EventStream(coalesced(sse_events(translation, metrics)),
                       headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **translation.server_timing()})


async def coalesced(events: AsyncIterator[ServerSentEvent]) -> AsyncIterator[bytes]:
    """The events in SSE's wire format, every event that is ready by the time one is sent going in the same write,
    and a keep-alive comment after SSE_PING idle seconds.

    Under load the event loop falls behind the decoder, and a client's tokens queue up; one write for all of them
    costs what one costs. (FastAPI's own SSE path sends each event on its own, through two memory streams.)
    """
    ready: asyncio.Queue[bytes | Exception | None] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for e in events:
                ready.put_nowait(format_sse_event(data_str=e.raw_data, event=e.event))
        except Exception as exc:  # raised where the response reads it
            ready.put_nowait(exc)
        else:
            ready.put_nowait(None)

    task = asyncio.create_task(pump())
    try:
        while True:
            try:
                async with asyncio.timeout(SSE_PING):
                    items = [await ready.get()]
            except TimeoutError:
                yield KEEPALIVE_COMMENT
                continue
            while not ready.empty():
                items.append(ready.get_nowait())
            chunk = b"".join(i for i in items if isinstance(i, bytes))
            if chunk:
                yield chunk
            for item in items:
                if isinstance(item, Exception):
                    raise item
                if item is None:
                    return
    finally:
        task.cancel()
