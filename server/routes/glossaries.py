"""Glossaries in DeepL's shape: POST/GET /glossaries, GET/DELETE /glossaries/{id}, GET /glossaries/{id}/entries.

They are kept by `server/glossaries.py:GlossaryStore`; `/translate` and `/translate/stream` take a `glossary_id`.
When the server has API keys, each key sees only its own glossaries.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from server.deps import RegistryDep, SettingsDep, admit_client, check_api_key, parse_request, started
from server.glossaries import Glossary, GlossaryStore, entries_tsv, owner_of
from server.glossaries import GlossaryInfo as Info
from server.languages import standard
from server.schemas import GlossaryCreate, GlossaryInfo, GlossaryList, error_responses
from server.settings import Settings

router = APIRouter(tags=["glossaries"])


def store_of(request: Request) -> GlossaryStore:
    """The app's glossary store; 503 while the server starts."""
    store: GlossaryStore = started(request, "glossaries")
    return store


async def get_store(request: Request) -> GlossaryStore:
    return store_of(request)


StoreDep = Annotated[GlossaryStore, Depends(get_store)]


def owner(request: Request, settings: Settings) -> str:
    """The glossaries' owner for this request: its API key (header, or `api_key` in the query), hashed."""
    return owner_of(check_api_key(request, settings, request.query_params.get("api_key")))


async def glossary_for(request: Request, settings: Settings, glossary_id: str, api_key: str | None) -> Glossary:
    """The glossary a translation request names (404 if it is not the caller's), its entries ready to match."""
    store = store_of(request)
    return await run_in_threadpool(store.get, glossary_id, owner_of(check_api_key(request, settings, api_key)))


def _public(info: Info) -> GlossaryInfo:
    return GlossaryInfo(glossary_id=info.glossary_id, name=info.name, ready=info.ready, source_lang=info.source_lang,
                        target_lang=info.target_lang, creation_time=info.creation_time, entry_count=info.entry_count)


BODY = {"content": {media: {"schema": {"$ref": "#/components/schemas/GlossaryCreate"}}
                    for media in ("application/json", "application/x-www-form-urlencoded")}, "required": True}


@router.post("/glossaries", status_code=201, response_model=GlossaryInfo, openapi_extra={"requestBody": BODY},
             responses=error_responses(400, 401, 403, 413, 422, 429, 503))
async def create_glossary(request: Request, settings: SettingsDep, registry: RegistryDep,
                          store: StoreDep) -> GlossaryInfo:
    """Make a glossary from TSV or CSV entries (JSON or form body); its languages must be a pair a model serves."""
    body = await parse_request(request, GlossaryCreate, settings)
    admit_client(request, settings, body.api_key)
    key = check_api_key(request, settings, body.api_key)
    registry.find(body.source_lang, body.target_lang)  # 400 for a pair no model translates directly
    info = await run_in_threadpool(store.create, owner_of(key), body.name, standard(body.source_lang),
                                   standard(body.target_lang), body.entries, body.entries_format.lower())
    return _public(info)


@router.get("/glossaries", response_model=GlossaryList, responses=error_responses(401, 403, 503))
async def list_glossaries(request: Request, settings: SettingsDep, store: StoreDep) -> GlossaryList:
    """The caller's glossaries, oldest first."""
    infos = await run_in_threadpool(store.owned, owner(request, settings))
    return GlossaryList(glossaries=[_public(i) for i in infos])


@router.get("/glossaries/{glossary_id}", response_model=GlossaryInfo, responses=error_responses(401, 403, 404, 503))
async def get_glossary(glossary_id: str, request: Request, settings: SettingsDep, store: StoreDep) -> GlossaryInfo:
    """A glossary's metadata."""
    return _public(await run_in_threadpool(store.info, glossary_id, owner(request, settings)))


ENTRIES_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "the entries, one per line: source term, tab, target term",
          "content": {"text/tab-separated-values": {}}},
    **error_responses(401, 403, 404, 503),
}


@router.get("/glossaries/{glossary_id}/entries", response_class=Response, responses=ENTRIES_RESPONSES)
async def glossary_entries(glossary_id: str, request: Request, settings: SettingsDep, store: StoreDep) -> Response:
    """A glossary's entries as TSV, in the order they were given."""
    glossary = await run_in_threadpool(store.get, glossary_id, owner(request, settings))
    return Response(entries_tsv(glossary.entries), media_type="text/tab-separated-values; charset=utf-8")


@router.delete("/glossaries/{glossary_id}", status_code=204, response_class=Response,
               responses=error_responses(401, 403, 404, 503))
async def delete_glossary(glossary_id: str, request: Request, settings: SettingsDep, store: StoreDep) -> Response:
    """Delete a glossary; requests that already hold it finish with it."""
    await run_in_threadpool(store.delete, glossary_id, owner(request, settings))
    return Response(status_code=204)
