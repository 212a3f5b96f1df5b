"""GET / (the translation page) and GET /static/{name} (its stylesheet and script): plain files, no build step."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from server.errors import NotFound

router = APIRouter(tags=["page"], include_in_schema=False)

STATIC = Path(__file__).resolve().parent.parent / "static"
TYPES = {"app.css": "text/css; charset=utf-8", "app.js": "text/javascript; charset=utf-8"}
# The page loads nothing from another origin, so it works offline, and a script injected from elsewhere cannot run.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",  # revalidated (ETag) each time, so an upgraded server never serves a stale page
}


@router.get("/")
async def page() -> FileResponse:
    """The translation page."""
    return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/static/{name}")
async def static(name: str) -> FileResponse:
    """One of the page's files; only the files listed here, so no path ever reaches the file system."""
    if name not in TYPES:
        raise NotFound(f"no static file {name!r}")
    return FileResponse(STATIC / name, media_type=TYPES[name], headers=HEADERS)
