"""POST /documents, /documents/{id} and /documents/{id}/result: DeepL's asynchronous document translation.

An upload is read and checked as /translate_file reads it (`server/routes/files.py:prepare_file`: every refusal of a
file happens before the answer), then translated by a background task along the same path (`start_translation`,
`store_translation`). The client polls the status with the document's key and downloads the file once it is done;
as DeepL does, a result is handed out once and then removed. A bounded number of documents may be queued or
translating at once (429 beyond, before the upload is read or parsed: an upload being checked holds its room);
finished documents are forgotten when their file's time in the store is up, and the tasks still running are
cancelled when the server stops.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from server.deps import (
    DetectorDep,
    RegistryDep,
    SettingsDep,
    admit_client,
    check_api_key,
    get_settings,
    parse_request,
    started,
    usage_of,
)
from server.documents.store import FileStore
from server.documents.workers import FileWorkers
from server.errors import (
    EngineFailure,
    Forbidden,
    NotFound,
    NotReady,
    Overloaded,
    ShuttingDown,
    TolkError,
)
from server.glossaries import owner_of
from server.plan import TextDone
from server.routes.files import (
    PreparedFile,
    file_workers,
    prepare_file,
    read_upload,
    start_translation,
    store_translation,
    upload_glossary,
)
from server.routing import RoutedTranslation, Unchanged
from server.schemas import error_responses

log = logging.getLogger(__name__)
router = APIRouter(tags=["documents"])

Status = Literal["queued", "translating", "done", "error"]


class DocumentNotReady(NotReady):
    """The result of a document still translating: 503, as DeepL answers it."""

    error_type = "document_not_ready"


class DocumentHandle(BaseModel):
    document_id: str
    document_key: str = Field(description="needed, with the id, to see the status and to download the result")


class DocumentKey(BaseModel):
    document_key: str
    api_key: str | None = None


class DocumentStatus(BaseModel):
    """DeepL's status, and `progress`: the share of the document's sentences translated so far."""

    document_id: str
    status: Status
    progress: float = Field(ge=0.0, le=1.0)
    seconds_remaining: int | None = Field(default=None, description="an estimate, while translating")
    billed_characters: int | None = Field(default=None, description="characters translated, once done")
    error_message: str | None = None


@dataclass
class DocumentJob:
    id: str
    key: str
    owner: str | None  # the API key that uploaded it, when the server has keys
    characters: int
    status: Status = "queued"
    progress: float = 0.0
    started: float | None = None  # time.monotonic() when its sentences were queued
    expires: float | None = None  # set when it ends
    error: str | None = None
    file_id: str | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def describe(self, now: float) -> DocumentStatus:
        remaining = None
        if self.status == "translating" and self.started is not None and self.progress > 0:
            elapsed = now - self.started
            remaining = max(0, round(elapsed * (1 - self.progress) / self.progress))
        return DocumentStatus(document_id=self.id, status=self.status, progress=round(self.progress, 4),
                              seconds_remaining=remaining,
                              billed_characters=self.characters if self.status == "done" else None,
                              error_message=self.error)


class DocumentJobs:
    """The documents of POST /documents and their background tasks; lives on the event loop."""

    def __init__(self, files: FileStore, limit: int, ttl: float, retry_after: int) -> None:
        self.files = files
        self.limit = limit
        self.ttl = ttl
        self.retry_after = retry_after
        self._jobs: dict[str, DocumentJob] = {}
        self._reserved = 0  # uploads being read and checked, each holding room for its document

    def running(self) -> int:
        """Documents queued or translating, and uploads that hold room for one."""
        return self._reserved + sum(job.status in ("queued", "translating") for job in self._jobs.values())

    @contextmanager
    def reserve(self) -> Iterator[None]:
        """Room for one more document while its upload is read and checked; 429 when there is none, before any
        byte of it is read or parsed. `submit` inside it makes the room the document's."""
        self._expire(time.monotonic())
        if self.running() >= self.limit:
            raise Overloaded(f"{self.limit} documents are being translated; retry later", self.retry_after)
        self._reserved += 1
        try:
            yield
        finally:
            self._reserved -= 1

    def submit(self, prepared: PreparedFile, owner: str | None, workers: FileWorkers) -> DocumentJob:
        """Start translating a checked document in the background (within `reserve`, which checked for room)."""
        job = DocumentJob(str(uuid.uuid4()), secrets.token_urlsafe(24), owner, prepared.characters)
        job.task = asyncio.create_task(self._run(job, prepared, workers), name=f"document {job.id}")
        self._jobs[job.id] = job
        return job

    def find(self, document_id: str, key: str, owner: str | None) -> DocumentJob:
        """The document with this id, for its key (403 for another) and its API key (another key's is not found)."""
        self._expire(time.monotonic())
        job = self._jobs.get(document_id)
        if job is None or job.owner != owner:
            raise NotFound("no such document: it has expired, was downloaded already, or never existed")
        if not hmac.compare_digest(job.key.encode(), key.encode()):
            raise Forbidden("wrong document_key for this document")
        return job

    def take(self, job: DocumentJob) -> str:
        """The finished document's file id; the document is forgotten (a result is downloaded once)."""
        if job.status == "error":
            raise NotFound(f"the document was not translated: {job.error}")
        if job.status != "done" or job.file_id is None:
            raise DocumentNotReady("the document is still being translated; ask for its status")
        del self._jobs[job.id]
        return job.file_id

    async def close(self) -> None:
        """Cancel the documents still translating (the server is stopping)."""
        tasks = [job.task for job in self._jobs.values() if job.task is not None and not job.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._jobs.clear()

    def _expire(self, now: float) -> None:
        for job_id in [j.id for j in self._jobs.values() if j.expires is not None and j.expires <= now]:
            del self._jobs[job_id]

    async def _run(self, job: DocumentJob, prepared: PreparedFile, workers: FileWorkers) -> None:
        try:
            translation = await self._queue(prepared)
            job.status, job.started = "translating", time.monotonic()
            try:
                texts = await collect(translation, job)
            finally:
                translation.cancel()
            job.file_id = await store_translation(prepared, workers, self.files, texts)
            job.status, job.progress = "done", 1.0
        except TolkError as exc:
            job.status, job.error = "error", exc.message
        except Exception:
            log.exception("document %s failed", job.id)
            job.status, job.error = "error", EngineFailure("internal server error").message
        finally:
            job.expires = time.monotonic() + self.ttl

    async def _queue(self, prepared: PreparedFile) -> RoutedTranslation:
        """Queue the document's sentences, waiting while the scheduler's queue is full (a document is patient)."""
        while True:
            try:
                return await start_translation(prepared)
            except Overloaded as exc:
                await asyncio.sleep(exc.retry_after)


async def collect(translation: RoutedTranslation, job: DocumentJob) -> list[str]:
    """Every text's translation; the job's progress moves as texts complete, by their share of the sentences."""
    weights: dict[int, int] = {}
    for indices, part in translation.parts:
        for j, i in enumerate(indices):
            weights[i] = 1 if isinstance(part, Unchanged) else len(part.plan.texts[j].sentences)
    total = sum(weights.values()) or 1
    texts = [""] * len(weights)
    done = 0
    async for event in translation.stream():
        if isinstance(event, TextDone):
            if event.result.finish_reason == "cancelled":
                raise ShuttingDown("the server stopped before the document was translated")
            texts[event.index] = event.result.text
            done += weights[event.index]
            job.progress = done / total
    return texts


async def get_documents(request: Request) -> DocumentJobs:
    jobs: DocumentJobs = started(request, "documents")
    return jobs


def _language(fields: dict[str, str], deepl: str, libre: str) -> str | None:
    """DeepL's `source_lang` / `target_lang` (upper case: "PT"), or LibreTranslate's `source` / `target`."""
    value = fields.get(deepl) or fields.get(libre)
    return value.lower() if value else None


async def _document(request: Request, document_id: str) -> tuple[DocumentJobs, DocumentJob]:
    """The document a status or result request names, checked against its key (and the client's API key)."""
    settings = await get_settings(request)
    body = await parse_request(request, DocumentKey, settings)
    owner = check_api_key(request, settings, body.api_key)
    jobs = await get_documents(request)
    return jobs, jobs.find(document_id, body.document_key, owner)


KEY_BODY: dict[str, Any] = {
    "content": {
        "application/json": {"schema": DocumentKey.model_json_schema()},
        "application/x-www-form-urlencoded": {"schema": DocumentKey.model_json_schema()},
    },
    "required": True,
}
UPLOAD_BODY: dict[str, Any] = {"content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "the document; its extension says its format"},
        "target_lang": {"type": "string", "description": "language code (DeepL's upper case is taken); `target` "
                        "too; may be omitted when one model serves the source"},
        "source_lang": {"type": "string", "description": "language code; `source` too; omitted or 'auto': "
                        "detected on the document's text"},
        "filename": {"type": "string", "description": "the file's name, when its part has none"},
        "api_key": {"type": "string"},
    },
}}}, "required": True}
RESULT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "the translated file, as an attachment", "content": {"application/octet-stream": {}}},
    **error_responses(400, 401, 403, 404, 422, 503),
}


@router.post("/documents", response_model=DocumentHandle, openapi_extra={"requestBody": UPLOAD_BODY},
             responses=error_responses(400, 401, 403, 404, 413, 429, 503))
async def upload_document(request: Request, registry: RegistryDep, detector: DetectorDep,
                          settings: SettingsDep) -> DocumentHandle:
    """Upload a document to translate in the background; the answer's id and key ask for its status and result."""
    if not settings.files:
        raise Forbidden("Files translation are disabled on this server.")
    jobs = await get_documents(request)
    with jobs.reserve():
        upload = await read_upload(request, settings)
        owner = check_api_key(request, settings, upload.api_key)
        admit_client(request, settings, upload.api_key)
        usage = usage_of(request)
        usage.check(owner_of(owner))
        upload.source = _language(upload.fields, "source_lang", "source") or "auto"
        upload.target = _language(upload.fields, "target_lang", "target")
        glossary = await upload_glossary(request, settings, upload)
        workers = file_workers(request)
        prepared = await prepare_file(upload, registry, detector, settings, workers, glossary)
        job = jobs.submit(prepared, owner, workers)
    usage.add(owner_of(owner), prepared.characters)  # counted once accepted, as DeepL counts a document
    return DocumentHandle(document_id=job.id, document_key=job.key)


@router.post("/documents/{document_id}", response_model=DocumentStatus, response_model_exclude_none=True,
             openapi_extra={"requestBody": KEY_BODY}, responses=error_responses(400, 401, 403, 404, 422, 503))
async def document_status(request: Request, document_id: str) -> DocumentStatus:
    """Where the document's translation stands: queued, translating (with progress), done or error."""
    _, job = await _document(request, document_id)
    return job.describe(time.monotonic())


@router.post("/documents/{document_id}/result", response_class=Response, openapi_extra={"requestBody": KEY_BODY},
             responses=RESULT_RESPONSES)
async def document_result(request: Request, document_id: str) -> Response:
    """The translated file, once done; it is then removed (503 while it is still translating)."""
    jobs, job = await _document(request, document_id)
    stored, data = await run_in_threadpool(jobs.files.pop, jobs.take(job))
    return Response(data, media_type=stored.media_type,
                    headers={"Content-Disposition": f'attachment; filename="{stored.filename}"'})
