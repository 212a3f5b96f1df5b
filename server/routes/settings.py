"""GET /settings (generation defaults and limits) and POST /settings (new defaults; needs the admin key)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request

from server import limits
from server.deps import AdminDep, RegistryDep, SettingsDep, read_body, validate_json
from server.errors import InvalidSettings
from server.registry import Registry
from server.schemas import SettingsUpdate, error_responses
from server.settings import Settings

router = APIRouter(tags=["settings"])
log = logging.getLogger(__name__)


def _view(registry: Registry, settings: Settings) -> dict[str, Any]:
    return {"defaults": {m.name: m.defaults.to_dict() for m in registry.models}, "limits": settings.public()}


@router.get("/settings", responses=error_responses(503))
async def get_settings(registry: RegistryDep, settings: SettingsDep) -> dict[str, Any]:
    """Each model's generation defaults, and the limits every request must stay within."""
    return _view(registry, settings)


@router.post("/settings", responses=error_responses(400, 401, 403, 404, 413, 422, 503), openapi_extra={
    "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/SettingsUpdate"}}},
                    "required": True}})
async def update_settings(request: Request, _: AdminDep, registry: RegistryDep,
                          settings: SettingsDep) -> dict[str, Any]:
    """Change the generation defaults of one model (or all); every model is checked before any changes."""
    update: SettingsUpdate = validate_json(SettingsUpdate, await read_body(request, settings.max_body_bytes))
    targets = [registry.by_name(update.model)] if update.model else registry.models
    changes = update.defaults.generation()
    try:
        new = [limits.check(m.defaults.update(**changes), settings) for m in targets]
    except ValueError as exc:
        raise InvalidSettings(str(exc)) from exc
    for served, defaults in zip(targets, new, strict=True):
        served.defaults = defaults
        log.info("generation defaults of %s changed: %s", served.name, changes)
    return _view(registry, settings)
