"""The app factory. The lifespan loads the models once, starts one scheduler per model, and stops them in finally."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from server.deepl import DeepLTranslate, deepl_error
from server.detect import LazyDetector
from server.documents.store import FileStore
from server.documents.workers import FileWorkers
from server.errors import DisconnectGuard, install_handlers
from server.glossaries import GlossaryStore
from server.logs import scrub_access_log
from server.metrics import Metrics, MetricsMiddleware
from server.multilingual import MultilingualStore
from server.ratelimit import RateLimiter
from server.registry import Registry
from server.routes import (
    deepl,
    deepl_documents,
    deepl_glossaries,
    detect,
    documents,
    files,
    frontend,
    glossaries,
    health,
    info,
    page,
    plugins,
    translate,
)
from server.routes import settings as settings_routes
from server.schemas import DetectRequest, GlossaryCreate, SettingsUpdate, TranslateRequest
from server.settings import Settings
from server.usage import Usage

log = logging.getLogger(__name__)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    scrub_access_log()  # keys and text travel in query strings
    registry = Registry(settings, app.state.metrics)
    supervisor: asyncio.Task[None] | None = None
    store = FileStore(settings.file_ttl, settings.file_store_bytes, settings.file_dir)
    jobs: documents.DocumentJobs | None = None
    workers = FileWorkers(settings.file_workers, settings.max_files_waiting, settings.retry_after)
    glossary_store = GlossaryStore(settings.data_dir, settings.max_glossaries, settings.max_glossary_entries,
                                   settings.max_glossary_term_chars)  # its file opens at the first glossary request
    multilingual = MultilingualStore(settings.data_dir, glossary_store)  # DeepL's /v3 glossaries, beside them
    usage = Usage(settings.data_dir, settings.character_limit)
    writer: asyncio.Task[None] | None = None
    try:
        await run_in_threadpool(registry.start)  # starting batchers blocks; the event loop stays free
        app.state.detector = LazyDetector(registry.languages())  # its model loads when it is first needed
        app.state.files = store
        app.state.file_workers = workers
        app.state.documents = jobs = documents.DocumentJobs(store, settings.max_document_jobs, settings.file_ttl,
                                                            settings.retry_after)
        app.state.glossaries = glossary_store
        app.state.multilingual = multilingual
        await run_in_threadpool(usage.load)
        app.state.usage = usage
        writer = asyncio.create_task(usage.keep_writing())
        app.state.registry = registry
        supervisor = asyncio.create_task(registry.supervise(app.state.settings.watchdog_interval))
        yield
    finally:
        app.state.registry = app.state.detector = app.state.files = app.state.documents = None
        app.state.file_workers = None
        if jobs is not None:
            await jobs.close()  # documents still translating are cancelled before their schedulers stop
        if supervisor is not None:
            supervisor.cancel()
        registry.stop()
        store.close()
        app.state.glossaries = app.state.usage = app.state.multilingual = None
        multilingual.close()
        glossary_store.close()
        if writer is not None:
            writer.cancel()
        await run_in_threadpool(usage.flush)  # the characters counted since the last write
        log.info("schedulers stopped")


def _openapi(app: FastAPI, bodies: tuple[type[BaseModel], ...]) -> Callable[[], dict[str, Any]]:
    """The schema, with the bodies that routes parse themselves (JSON or form) listed among the components."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes,
                                 description=app.description)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in bodies:
                body = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(body.pop("$defs", {}))
                components[model.__name__] = body
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi


def create_app(config: Settings | None = None) -> FastAPI:
    """A Tolk server for these settings (read from TOLK_ environment variables and .env when omitted)."""
    config = config or Settings()
    app = FastAPI(title="Tolk", version="0.1.0", lifespan=lifespan,
                  description="Self-hosted machine translation, LibreTranslate-compatible, with streaming.")
    app.state.settings = config
    app.state.metrics = metrics = Metrics()
    app.state.registry = app.state.detector = app.state.files = app.state.documents = None
    app.state.glossaries = app.state.usage = app.state.multilingual = None
    app.state.rate_limiter = RateLimiter(config.rate_limit, config.rate_limit_storage) if config.rate_limit else None
    install_handlers(app)
    # DeepL's clients and the plugins read errors in their API's shape (server/errors.py:shaped_body)
    app.state.error_shapes = [("/v2/", deepl_error), ("/v3/", deepl_error), *plugins.ERROR_SHAPES]
    for module in (translate, files, documents, glossaries, detect, info, settings_routes, frontend, health, page,
                   deepl, deepl_glossaries, deepl_documents, plugins):
        app.include_router(module.router)
    app.add_middleware(DisconnectGuard)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    if config.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=config.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    bodies = (TranslateRequest, DetectRequest, SettingsUpdate, GlossaryCreate, DeepLTranslate, *deepl_glossaries.BODIES,
              *plugins.BODIES)
    app.openapi = _openapi(app, bodies)  # type: ignore[method-assign]
    return app
