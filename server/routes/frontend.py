"""GET /frontend/settings and POST /suggest, in LibreTranslate's shapes, for its web page and clients."""

from __future__ import annotations

from fastapi import APIRouter

from server.deps import RegistryDep, SettingsDep
from server.documents import extensions
from server.errors import Forbidden
from server.routes.info import NAMES
from server.schemas import FrontendLanguages, FrontendSettings, LanguageChoice, error_responses

router = APIRouter(tags=["misc"])

# LibreTranslate's default wait after typing; this server's own page waits on its own (server/static/app.js).
FRONTEND_TIMEOUT_MS = 500


@router.get("/frontend/settings", response_model=FrontendSettings, responses=error_responses(503))
async def frontend_settings(registry: RegistryDep, settings: SettingsDep) -> FrontendSettings:
    """Limits and switches a LibreTranslate page reads at start: the text limit, whether keys are needed, the
    languages to start with (detection, and the first model's target), the file formats POST /translate_file
    takes. Suggestions are not collected."""
    target = registry.models[0].targets[0] if registry.models else "en"
    return FrontendSettings(
        charLimit=settings.max_text_chars,
        frontendTimeout=FRONTEND_TIMEOUT_MS,
        apiKeys=bool(settings.api_keys),
        keyRequired=bool(settings.api_keys),
        suggestions=False,
        filesTranslation=settings.files,
        supportedFilesFormat=extensions() if settings.files else [],
        language=FrontendLanguages(source=LanguageChoice(code="auto", name="Auto Detect"),
                                   target=LanguageChoice(code=target, name=NAMES.get(target, target))),
    )


@router.post("/suggest", responses=error_responses(403))
async def suggest() -> None:
    """Suggestions for better translations are not collected here; LibreTranslate answers the same when they are
    off."""
    raise Forbidden("Suggestions are disabled on this server.")
