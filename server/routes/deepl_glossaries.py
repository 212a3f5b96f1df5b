"""DeepL's glossaries at DeepL's paths: /v2/glossaries (Tolk's /glossaries, the same handlers) and the multilingual
glossaries of /v3/glossaries (`server/multilingual.py`), with PATCH and PUT of dictionaries.

A /v3 glossary's dictionaries are glossaries of the same store as /v2's, so their entries are checked, limited and
matched alike; the /v2 and /v3 lists each show their own. A translation names either kind by `glossary_id`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from server.deepl import deepl_body, deepl_errors, json_body, validated
from server.deps import RegistryDep, SettingsDep, admit_client, check_api_key
from server.glossaries import entries_tsv, owner_of
from server.languages import standard
from server.multilingual import Dictionary, MultilingualInfo, part_owner
from server.registry import Registry
from server.routes import glossaries
from server.routes.deepl import multilingual_of
from server.schemas import GlossaryInfo, GlossaryList
from server.settings import Settings

router = APIRouter(tags=["DeepL"])

ERRORS = deepl_errors(400, 401, 403, 404, 413, 422, 429, 503)
ENTRIES = {200: glossaries.ENTRIES_RESPONSES[200], **deepl_errors(401, 403, 404, 503)}
# /v2 is Tolk's own glossary API under DeepL's path (its handlers read DeepL's fields already)
router.add_api_route("/v2/glossaries", glossaries.create_glossary, methods=["POST"], status_code=201,
                     response_model=GlossaryInfo, responses=ERRORS, openapi_extra={"requestBody": glossaries.BODY})
router.add_api_route("/v2/glossaries", glossaries.list_glossaries, methods=["GET"], response_model=GlossaryList,
                     responses=ERRORS)
router.add_api_route("/v2/glossaries/{glossary_id}", glossaries.get_glossary, methods=["GET"],
                     response_model=GlossaryInfo, responses=ERRORS)
router.add_api_route("/v2/glossaries/{glossary_id}", glossaries.delete_glossary, methods=["DELETE"],
                     status_code=204, response_class=Response, responses=ERRORS)
router.add_api_route("/v2/glossaries/{glossary_id}/entries", glossaries.glossary_entries, methods=["GET"],
                     response_class=Response, responses=ENTRIES)


class DictionaryBody(BaseModel):
    """One dictionary of a multilingual glossary: a language pair and its entries (TSV or CSV)."""

    model_config = ConfigDict(extra="ignore")

    source_lang: str
    target_lang: str
    entries: str
    entries_format: str = "tsv"

    def dictionary(self) -> Dictionary:
        return Dictionary(self.source_lang, self.target_lang, self.entries, self.entries_format)


class MultilingualCreate(BaseModel):
    """DeepL's request to make a multilingual glossary."""

    model_config = ConfigDict(extra="ignore")

    name: str
    dictionaries: list[DictionaryBody] = Field(min_length=1)


class MultilingualPatch(BaseModel):
    """A new name, and entries to merge into one dictionary."""

    model_config = ConfigDict(extra="ignore")

    name: str | None = None
    dictionaries: list[DictionaryBody] = Field(default_factory=list, max_length=1)


def _public(info: MultilingualInfo) -> dict[str, Any]:
    return {"glossary_id": info.glossary_id, "name": info.name, "creation_time": info.creation_time,
            "dictionaries": [{"source_lang": d.source_lang, "target_lang": d.target_lang,
                              "entry_count": d.entry_count} for d in info.dictionaries]}


def _owner(request: Request, settings: Settings, fields: dict[str, Any] | None = None) -> str:
    key = (fields or {}).get("auth_key") or request.query_params.get("auth_key")
    return owner_of(check_api_key(request, settings, key))


def _check_pairs(registry: Registry, dictionaries: list[DictionaryBody]) -> None:
    for d in dictionaries:
        registry.find(d.source_lang, d.target_lang)  # 400 for a pair no model translates directly


@router.post("/v3/glossaries", status_code=201, openapi_extra={"requestBody": json_body(MultilingualCreate)},
              responses=ERRORS)
async def create(request: Request, registry: RegistryDep, settings: SettingsDep) -> dict[str, Any]:
    """A multilingual glossary: a name and one dictionary (TSV or CSV entries) per language pair."""
    fields = await deepl_body(request, settings)
    body: MultilingualCreate = validated(MultilingualCreate, fields)
    admit_client(request, settings, fields.get("auth_key"))
    owner = _owner(request, settings, fields)
    _check_pairs(registry, body.dictionaries)
    store = multilingual_of(request)
    info = await run_in_threadpool(store.create, owner, body.name, [d.dictionary() for d in body.dictionaries])
    return _public(info)


@router.get("/v3/glossaries", responses=ERRORS)
async def list_all(request: Request, settings: SettingsDep) -> dict[str, Any]:
    """The caller's multilingual glossaries, oldest first."""
    infos = await run_in_threadpool(multilingual_of(request).owned, _owner(request, settings))
    return {"glossaries": [_public(i) for i in infos]}


@router.get("/v3/glossaries/{glossary_id}", responses=ERRORS)
async def get(glossary_id: str, request: Request, settings: SettingsDep) -> dict[str, Any]:
    return _public(await run_in_threadpool(multilingual_of(request).info, glossary_id, _owner(request, settings)))


@router.patch("/v3/glossaries/{glossary_id}", openapi_extra={"requestBody": json_body(MultilingualPatch)},
               responses=ERRORS)
async def patch(glossary_id: str, request: Request, registry: RegistryDep, settings: SettingsDep) -> dict[str, Any]:
    """A new name, and/or entries added to (or changed in) one dictionary, which is made when it is new."""
    fields = await deepl_body(request, settings)
    body: MultilingualPatch = validated(MultilingualPatch, fields)
    owner, store = _owner(request, settings, fields), multilingual_of(request)
    _check_pairs(registry, body.dictionaries)
    if body.name is not None:
        await run_in_threadpool(store.rename, glossary_id, owner, body.name)
    for d in body.dictionaries:
        await run_in_threadpool(store.put, glossary_id, owner, d.dictionary(), True)
    return _public(await run_in_threadpool(store.info, glossary_id, owner))


@router.put("/v3/glossaries/{glossary_id}/dictionaries", openapi_extra={"requestBody": json_body(DictionaryBody)},
             responses=ERRORS)
async def replace(glossary_id: str, request: Request, registry: RegistryDep,
                  settings: SettingsDep) -> dict[str, Any]:
    """One dictionary's entries replaced (or the dictionary added)."""
    fields = await deepl_body(request, settings)
    body: DictionaryBody = validated(DictionaryBody, fields)
    _check_pairs(registry, [body])
    d = await run_in_threadpool(multilingual_of(request).put, glossary_id, _owner(request, settings, fields),
                                body.dictionary(), False)
    return {"source_lang": d.source_lang, "target_lang": d.target_lang, "entry_count": d.entry_count}


@router.get("/v3/glossaries/{glossary_id}/entries", responses=ERRORS)
async def entries(glossary_id: str, source_lang: str, target_lang: str, request: Request,
                  settings: SettingsDep) -> dict[str, Any]:
    """One dictionary's entries as TSV, in a JSON object as DeepL answers them."""
    owner, store = _owner(request, settings), multilingual_of(request)
    info = await run_in_threadpool(store.info, glossary_id, owner)
    d = store.dictionary(info, source_lang, target_lang)
    glossary = await run_in_threadpool(glossaries.store_of(request).get, d.part, part_owner(owner))
    return {"dictionaries": [{"source_lang": d.source_lang, "target_lang": d.target_lang,
                              "entries": entries_tsv(glossary.entries), "entries_format": "tsv"}]}


@router.delete("/v3/glossaries/{glossary_id}/dictionaries", status_code=204, response_class=Response,
               responses=ERRORS)
async def remove(glossary_id: str, source_lang: str, target_lang: str, request: Request,
                 settings: SettingsDep) -> Response:
    await run_in_threadpool(multilingual_of(request).remove, glossary_id, _owner(request, settings),
                            standard(source_lang), standard(target_lang))
    return Response(status_code=204)


@router.delete("/v3/glossaries/{glossary_id}", status_code=204, response_class=Response, responses=ERRORS)
async def delete(glossary_id: str, request: Request, settings: SettingsDep) -> Response:
    await run_in_threadpool(multilingual_of(request).delete, glossary_id, _owner(request, settings))
    return Response(status_code=204)

BODIES = (MultilingualCreate, MultilingualPatch, DictionaryBody)  # request bodies in the API schema
