"""POST /translate_file and GET /download_file/{name}: LibreTranslate's file translation.

The upload is read within `max_file_bytes`, read into texts in a process of its own (`server/documents/workers.py`),
and its texts
go through the path /translate uses (`route`, `RoutedTranslation`): one request's worth of texts to one model, so the
scheduler batches the document with itself. The translated file is kept in the app's `FileStore` until it expires;
the answer is LibreTranslate's `{"translatedFileUrl": ".../download_file/<uuid>.<name>_<target>.<ext>"}`.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from server.deps import (
    KEY_SCHEMES,
    DetectorDep,
    FilesDep,
    RegistryDep,
    SettingsDep,
    admit_client,
    bearer,
    check_api_key,
    started,
    usage_of,
)
from server.detect import MAX_CHARS, Detection, LazyDetector
from server.documents import Format, Limits, find_format
from server.documents.store import FileStore
from server.documents.workers import FileWorkers
from server.errors import EmptyText, Forbidden, InvalidRequest, NotFound, PayloadTooLarge, Unauthorized
from server.glossaries import Glossary, owner_of
from server.registry import Registry
from server.routes.glossaries import glossary_for
from server.routes.translate import unless_disconnected
from server.routing import RoutedTranslation, Routing, check_glossary, detected_route, route
from server.schemas import DetectedLanguage, FileTranslation, error_responses
from server.settings import Settings

router = APIRouter(tags=["translate"])

FORM_OVERHEAD = 64 * 1024  # multipart framing and the other fields, on top of the file itself
REQUEST_BODY = {
    "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": ["file"],
        "properties": {
            "file": {"type": "string", "format": "binary",
                     "description": "the document; its extension says its format (GET /frontend/settings lists them)"},
            "source": {"type": "string", "default": "auto", "description": "language code, or 'auto': detected "
                       "on the document's text"},
            "target": {"type": "string", "description": "language code; may be omitted when one model serves the "
                       "source"},
            "api_key": {"type": "string"},
            "glossary_id": {"type": "string", "description": "a glossary (POST /glossaries) whose terms the "
                            "translation must use; its languages must be the request's"},
        },
    }}},
    "required": True,
}
DOWNLOAD_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "the translated file, as an attachment", "content": {"application/octet-stream": {}}},
    **error_responses(404),
}


@dataclass
class Upload:
    filename: str
    data: bytes
    source: str
    target: str | None
    api_key: str | None
    fields: dict[str, str]  # every text field of the form (POST /documents reads DeepL's names from it)


KEY_FIELDS = ("api_key", "auth_key")  # LibreTranslate's form field, DeepL's


async def read_form(request: Request, settings: Settings) -> FormData:
    """The multipart body, parsed as it arrives, within the upload's limit (413).

    With API keys on, a key in the Authorization header or the query string is checked before the body is read,
    and a key field is checked as soon as its part has arrived (LibreTranslate's page sends it after the file). A
    body that has shown no key by `max_body_bytes` gets its 401 there: without a key, nobody makes the server read
    10 MB."""
    limit = settings.max_file_bytes + FORM_OVERHEAD
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes; the limit is {limit}")
    shown = bool(bearer(request, KEY_SCHEMES) or request.query_params.get("api_key"))
    if shown:
        check_api_key(request, settings, request.query_params.get("api_key"))

    async def chunks() -> AsyncGenerator[bytes, None]:
        nonlocal shown
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body over the limit of {limit} bytes")
            if settings.api_keys and not shown:
                key = next((v for k, v in parser.items if k in KEY_FIELDS and isinstance(v, str) and v), None)
                if key is not None:
                    shown = bool(check_api_key(request, settings, key))
                elif size > settings.max_body_bytes:
                    raise Unauthorized("an API key is required: in the Authorization header, or in an api_key "
                                       "field before the file")
            yield chunk

    parser = MultiPartParser(request.headers, chunks())
    try:
        form: FormData = await parser.parse()
    except MultiPartException as exc:
        raise InvalidRequest(f"malformed multipart body: {exc.message}") from exc
    return form


async def read_upload(request: Request, settings: Settings) -> Upload:
    """The multipart form as LibreTranslate's page sends it: `file`, `source`, `target`, `api_key` (and `filename`,
    DeepL's name for the file when its part has none)."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise InvalidRequest("send the file as multipart/form-data, in a field named file")
    form = await read_form(request, settings)
    try:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InvalidRequest("Invalid request: missing file parameter")
        data = await upload.read()
        fields = {key: value for key, value in reversed(form.multi_items()) if isinstance(value, str)}
    finally:
        await form.close()
    filename = upload.filename or fields.get("filename")
    if not filename:
        raise InvalidRequest("Invalid request: empty file name")
    if len(data) > settings.max_file_bytes:
        raise PayloadTooLarge(f"file of {len(data)} bytes; the limit is {settings.max_file_bytes}")
    if not data:
        raise EmptyText(f"{filename} is empty; there is nothing to translate")
    return Upload(filename, data, fields.get("source") or "auto", fields.get("target") or None,
                  fields.get("api_key") or request.query_params.get("api_key") or None, fields)


async def detect_source(detector: LazyDetector, sample: str) -> Detection:
    """The document's language, from the start of its text (a document is one language: its short paragraphs are
    not each detected on their own)."""
    found = await detector.get()
    return found.best(sample)


def download_name(filename: str, target: str, ext: str) -> str:
    """LibreTranslate's name for the translated file, `<name>_<target><ext>`, in safe ASCII."""
    base = filename.replace("\\", "/").rsplit("/", 1)[-1]
    stem = base[: -len(ext)] if base.lower().endswith(ext) else base

    def safe(text: str) -> str:
        plain = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", plain).strip("._")[:100]

    return f"{safe(stem) or 'document'}_{safe(target) or 'translated'}{ext}"


@dataclass
class PreparedFile:
    """An upload read into texts and routed to its model: everything checked, nothing queued yet."""

    upload: Upload
    fmt: Format
    ext: str
    limits: Limits  # the file's, to read it again when it is rebuilt
    language: str | None  # the served language it is translated into, when known (a catalog's plural forms)
    texts: list[str]  # markup for the HTML path, one per paragraph, cue or page
    characters: int  # to translate (text, not markup)
    routing: Routing
    detected: Detection | None  # when the source was auto
    timeout: float  # seconds its translation may take (the settings' file_timeout)
    glossary: Glossary | None = None  # whose terms the translation must use

    @property
    def name(self) -> str:
        """What the translated file is downloaded as."""
        first = self.routing.routes[0]
        target = first.target or (first.served.target if first.served is not None else self.upload.target)
        return download_name(self.upload.filename, target or "translated", self.ext)


async def upload_glossary(request: Request, settings: Settings, upload: Upload) -> Glossary | None:
    """The glossary the form's `glossary_id` names (404 if it is not the caller's), or None."""
    glossary_id = upload.fields.get("glossary_id")
    return await glossary_for(request, settings, glossary_id, upload.api_key) if glossary_id else None


def file_workers(request: Request) -> FileWorkers:
    workers: FileWorkers = started(request, "file_workers")
    return workers


async def prepare_file(upload: Upload, registry: Registry, detector: LazyDetector, settings: Settings,
                       workers: FileWorkers, glossary: Glossary | None = None) -> PreparedFile:
    """Read the file into texts (in a worker process) and find its model; every refusal of a file happens here."""
    fmt, ext = find_format(upload.filename)
    limits = Limits(settings.max_file_expanded_bytes, settings.max_file_entries, settings.max_file_nodes)
    language = registry.target_language(upload.target)
    read = await workers.read(upload.data, upload.filename, limits, settings.max_file_chars, MAX_CHARS, language)
    detected = None
    source = upload.source
    if source == "auto" and glossary is not None:  # as DeepL, a glossary names the source language
        source = glossary.info.source_lang
    if source == "auto":
        detected = await detect_source(detector, read.sample)
        everything = list(range(len(read.texts)))
        routing = Routing([detected_route(registry, detected, upload.target, everything)], [detected] * len(everything))
    else:
        routing = await route(registry, detector, source, upload.target, read.texts, html=True)
    if glossary is not None:
        for r in routing.routes:
            check_glossary(r, glossary)  # refused here, before a background translation starts
    return PreparedFile(upload, fmt, ext, limits, language, read.texts, read.characters, routing, detected,
                        settings.file_timeout, glossary)


async def start_translation(prepared: PreparedFile) -> RoutedTranslation:
    """Queue the document's texts as one request of /translate's HTML path (429 when the queue is full); nobody
    reads a document's scores, and it may take `file_timeout` rather than a request's timeout."""
    return await RoutedTranslation.start(prepared.routing, prepared.texts, True, {"scores": False}, 0,
                                         stream=False, timeout=prepared.timeout, glossary=prepared.glossary)


async def store_translation(prepared: PreparedFile, workers: FileWorkers, files: FileStore, texts: list[str]) -> str:
    """Put the translations back into the file (in a worker process) and keep it; its id in the store."""
    upload = prepared.upload
    data = await workers.rebuild(upload.data, upload.filename, prepared.limits, prepared.language, texts)
    return await run_in_threadpool(files.put, prepared.name, prepared.fmt.media_type, data)


@router.post("/translate_file", response_model=FileTranslation, response_model_exclude_none=True,
             openapi_extra={"requestBody": REQUEST_BODY},
             responses=error_responses(400, 401, 403, 404, 413, 429, 500, 503, 504))
async def translate_file(request: Request, registry: RegistryDep, detector: DetectorDep, settings: SettingsDep,
                         files: FilesDep) -> FileTranslation:
    """Translate a document, keeping its formatting; the answer says where to download it (until it expires)."""
    if not settings.files:
        raise Forbidden("Files translation are disabled on this server.")
    upload = await read_upload(request, settings)
    usage, owner = usage_of(request), owner_of(admit_client(request, settings, upload.api_key))
    usage.check(owner)
    glossary = await upload_glossary(request, settings, upload)
    workers = file_workers(request)
    prepared = await prepare_file(upload, registry, detector, settings, workers, glossary)
    translation = await start_translation(prepared)
    usage.add(owner, prepared.characters)  # a document counts as its texts would through /translate
    try:
        results = await unless_disconnected(request, translation.results())
    finally:
        translation.cancel()
    file_id = await store_translation(prepared, workers, files, [r.text for r in results])
    detected = prepared.detected
    return FileTranslation(
        translatedFileUrl=str(request.url_for("download_file", name=f"{file_id}.{prepared.name}")),
        detectedLanguage=DetectedLanguage(confidence=detected.confidence, language=detected.language)
        if detected else None,
    )


@router.get("/download_file/{name}", response_class=Response, responses=DOWNLOAD_RESPONSES)
async def download_file(name: str, files: FilesDep) -> Response:
    """A translated file, by the name /translate_file answered (`<uuid>.<name>`), until it expires."""
    file_id, _, filename = name.partition(".")
    stored = files.get(file_id, filename)
    try:
        data = await run_in_threadpool(stored.path.read_bytes)
    except FileNotFoundError as exc:  # dropped for room between the look-up and the read
        raise NotFound("no such file: it has expired, or it never existed") from exc
    return Response(data, media_type=stored.media_type,
                    headers={"Content-Disposition": f'attachment; filename="{stored.filename}"'})
