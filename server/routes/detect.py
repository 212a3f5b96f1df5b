"""POST /detect: the language of a text among those this server translates from (LibreTranslate's shape)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from server.deps import DetectorDep, DetectRequestDep, SettingsDep, admit_client
from server.detect import MAX_CHARS
from server.routing import INLINE_CHARS
from server.schemas import DetectedLanguage, error_responses
from server.text import check_texts

router = APIRouter(tags=["translate"])

FORM_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["q"], "additionalProperties": False,
    "properties": {
        "q": {"type": "array", "items": {"type": "string"}, "description": "a text; repeated for several texts"},
        "api_key": {"type": "string"},
    },
}
REQUEST_BODY = {
    "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/DetectRequest"}},
        "application/x-www-form-urlencoded": {"schema": FORM_SCHEMA},
    },
    "required": True,
}


@router.post("/detect", response_model=list[DetectedLanguage], openapi_extra={"requestBody": REQUEST_BODY},
             responses=error_responses(400, 401, 403, 413, 422, 429, 503))
async def detect(request: Request, req: DetectRequestDep, detector: DetectorDep,
                 settings: SettingsDep) -> list[DetectedLanguage]:
    """The likeliest languages of a text, best first, among those this server translates from. A list of texts
    gets one ranking for all of them together, as LibreTranslate answers it."""
    admit_client(request, settings, req.api_key)
    texts = req.texts
    check_texts(texts, settings.max_texts, settings.max_text_chars, verb="detect")
    found = await detector.get()
    size = sum(min(len(text), MAX_CHARS) for text in texts)
    ranked = found.detect_all(texts) if size <= INLINE_CHARS else await run_in_threadpool(found.detect_all, texts)
    return [DetectedLanguage(confidence=d.confidence, language=d.language) for d in ranked]
