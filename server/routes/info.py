"""GET /languages (LibreTranslate's shape) and GET /models (what is loaded, where, how big)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from server.deps import RegistryDep
from server.schemas import Language, error_responses

router = APIRouter(tags=["info"])

NAMES = {
    "ar": "Arabic", "ca": "Catalan", "cs": "Czech", "da": "Danish", "de": "German", "el": "Greek", "en": "English",
    "es": "Spanish", "fi": "Finnish", "fr": "French", "hu": "Hungarian", "it": "Italian", "ja": "Japanese",
    "ko": "Korean", "nl": "Dutch", "no": "Norwegian", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian",
    "ru": "Russian", "sv": "Swedish", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}


@router.get("/languages", response_model=list[Language], responses=error_responses(503))
@router.post("/languages", response_model=list[Language], responses=error_responses(503))  # older clients POST
async def languages(registry: RegistryDep) -> list[Language]:
    """Each source language with the targets it can be translated into (through English too, as LibreTranslate)."""
    targets = sorted(registry.targets().items())
    return [Language(code=code, name=NAMES.get(code, code), targets=t) for code, t in targets]


@router.get("/models", responses=error_responses(503))
async def models(registry: RegistryDep) -> list[dict[str, Any]]:
    """The loaded models: languages, device, dtype, parameters, architecture, scheduler state."""
    return [served.describe() for served in registry.models]
