"""GET /health (the process is alive), GET /ready (models loaded, schedulers running), GET /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from server.deps import MetricsDep
from server.errors import NotReady
from server.schemas import error_responses

router = APIRouter(tags=["health"])


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready", responses=error_responses(503))
async def ready(request: Request) -> dict[str, object]:
    """200 once every model is loaded and its scheduler runs; 503 before, after, or if one stopped."""
    registry = getattr(request.app.state, "registry", None)
    if registry is None or not registry.ready:
        raise NotReady("models are not loaded or a scheduler is not running")
    return {"status": "ready", "models": [m.name for m in registry.models]}


@router.get("/metrics", response_class=Response, responses={
    200: {"description": "Prometheus text exposition format", "content": {CONTENT_TYPE_LATEST.split(";")[0]: {}}}})
async def metrics(m: MetricsDep) -> Response:
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
