"""Domain errors and the one table that maps them to HTTP statuses.

Every error a client sees has the body `{"error": str, "error_type": str}`, whether it travels as a JSON
response or as an SSE `error` event. Stack traces never leave the server.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.routing import Match

log = logging.getLogger(__name__)
# A run of characters without a space this long is a client's value (a 10,000-character "language"), not words
_RUN = re.compile(r"\S{81,}")


class TolkError(Exception):
    """Base of the errors a client may see; `error_type` is a stable machine-readable name. A message never echoes
    a value at length: a run of more than 80 characters without a space is cut to its first 40."""

    error_type = "error"

    def __init__(self, message: str) -> None:
        message = _RUN.sub(lambda m: f"{m.group()[:40]}... ({len(m.group())} characters)", message)
        super().__init__(message)
        self.message = message


class InvalidRequest(TolkError):
    error_type = "invalid_request"


class InvalidJSON(InvalidRequest):
    error_type = "invalid_json"


class InvalidEncoding(InvalidRequest):
    error_type = "invalid_encoding"


class EmptyText(InvalidRequest):
    error_type = "empty_text"


class InvalidText(InvalidRequest):
    error_type = "invalid_text"


class UnsupportedLanguage(InvalidRequest):
    error_type = "unsupported_language"


class UnsupportedFormat(InvalidRequest):
    """A file whose name ends with an extension /translate_file does not take."""

    error_type = "unsupported_format"


class InvalidDocument(InvalidRequest):
    """A file that is not what its extension says, is damaged, or is built to harm the reader."""

    error_type = "invalid_document"


class NotFound(TolkError):
    error_type = "not_found"


class MethodNotAllowed(TolkError):
    error_type = "method_not_allowed"


class PayloadTooLarge(TolkError):
    error_type = "payload_too_large"


class ValidationFailed(TolkError):
    error_type = "validation_error"


class InvalidSettings(ValidationFailed):
    error_type = "invalid_settings"


class Unauthorized(TolkError):
    error_type = "unauthorized"


class Forbidden(TolkError):
    error_type = "forbidden"


class Overloaded(TolkError):
    error_type = "overloaded"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RateLimited(Overloaded):
    """This client sent more requests than its rate limit allows."""

    error_type = "rate_limited"


class QuotaExceeded(TolkError):
    """An API key has used up its characters for this month (TOLK_CHARACTER_LIMIT): DeepL's 456."""

    error_type = "quota_exceeded"


class NotReady(TolkError):
    error_type = "not_ready"


class ShuttingDown(NotReady):
    error_type = "shutting_down"


class ClientClosed(TolkError):
    """The client went away before its answer; nobody reads this one, but logs and metrics count it."""

    error_type = "client_closed_request"


class TimedOut(TolkError):
    error_type = "timeout"


class EngineFailure(TolkError):
    error_type = "engine_failure"


STATUS: dict[type[TolkError], int] = {
    InvalidRequest: 400,
    Unauthorized: 401,
    Forbidden: 403,
    NotFound: 404,
    MethodNotAllowed: 405,
    PayloadTooLarge: 413,
    ValidationFailed: 422,
    Overloaded: 429,
    QuotaExceeded: 456,  # DeepL's status for a used-up character allowance; its SDKs raise their own error for it
    ClientClosed: 499,  # nginx's convention for a request the client abandoned
    EngineFailure: 500,
    NotReady: 503,
    TimedOut: 504,
}


def status_of(error: TolkError) -> int:
    """The status of the nearest class in the table (subclasses inherit their parent's)."""
    for cls in type(error).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def error_body(error: TolkError) -> dict[str, str]:
    return {"error": error.message, "error_type": error.error_type}


ErrorShape = Callable[[TolkError, int], dict[str, Any]]  # an API's error body, from the error and its status


def shaped_body(request: Request, error: TolkError, status: int) -> dict[str, Any]:
    """The error body in the shape of the API the path belongs to (`app.state.error_shapes`: path prefix -> shape;
    DeepL's clients read `message`), else Tolk's own."""
    for prefix, shape in getattr(request.app.state, "error_shapes", ()):
        if request.url.path.startswith(prefix):
            body: dict[str, Any] = shape(error, status)
            return body
    return error_body(error)


def describe_validation(errors: Sequence[Any], limit: int = 3) -> str:
    """A short human message from pydantic errors: `options.beam_size: Input should be a valid integer`."""
    parts: list[str] = []
    for err in errors:
        loc = [str(x) for x in err.get("loc", ()) if x not in ("body", "query")]
        # union members show up as location parts (`str`, `list[str]`); they say nothing to the client
        loc = [x for x in loc if not (x in {"str", "int", "float", "bool"} or x.startswith(("list[", "function")))]
        text = f"{'.'.join(loc)}: {err.get('msg', 'invalid')}" if loc else str(err.get("msg", "invalid"))
        if text not in parts:
            parts.append(text)
    return "; ".join(parts[:limit]) or "invalid request"


def from_validation(exc: ValidationError) -> TolkError:
    """Map a pydantic ValidationError to invalid JSON (400) or a field error (422)."""
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return InvalidJSON("request body is not valid JSON")
    return ValidationFailed(describe_validation(errors))


def error_response(request: Request, error: TolkError) -> JSONResponse:
    """The JSON response for an error; counts it in the app's metrics."""
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:
        metrics.failures.labels(error_type=error.error_type).inc()
    headers = {"Retry-After": str(error.retry_after)} if isinstance(error, Overloaded) else None
    status = status_of(error)
    return JSONResponse(shaped_body(request, error, status), status_code=status, headers=headers)


_HTTP_TYPES: dict[int, type[TolkError]] = {
    401: Unauthorized, 403: Forbidden, 404: NotFound, 405: MethodNotAllowed, 413: PayloadTooLarge
}


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request: Request) -> str:
    """The methods the request's path answers to, for the `Allow` of a 405.

    Starlette names only the methods of the first route with that path; GET and POST /settings are two routes.
    """
    routes = request.app.router.routes
    return ", ".join(m for m in METHODS
                     if any(r.matches({**request.scope, "method": m})[0] == Match.FULL for r in routes))


def install_handlers(app: FastAPI) -> None:
    """Route every exception through the one table, so no error leaves with another shape."""

    @app.exception_handler(TolkError)
    async def on_tolk(request: Request, exc: TolkError) -> JSONResponse:
        return error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(request, ValidationFailed(describe_validation(exc.errors())))

    @app.exception_handler(HTTPException)
    async def on_http(request: Request, exc: HTTPException) -> JSONResponse:
        error = _HTTP_TYPES.get(exc.status_code, TolkError)(str(exc.detail))
        response = error_response(request, error)
        response.status_code = exc.status_code
        if exc.headers:
            response.headers.update(exc.headers)
        if exc.status_code == 405:
            response.headers["Allow"] = allowed_methods(request) or response.headers.get("Allow", "")
        return response

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        # the route's template, not the path: a download's path is its link, which is all it takes to fetch the file
        route = request.scope.get("route")
        log.exception("unhandled error on %s %s", request.method, getattr(route, "path", "(no route)"))
        return error_response(request, EngineFailure("internal server error"))


class DisconnectGuard:
    """ASGI middleware: a stream whose client has gone is not a server error.

    fastapi.sse's keep-alive task may be handing over an event at the moment the response ends on a disconnect;
    it then raises BrokenResourceError out of the request (a known FastAPI race). Once the answer has started, an
    error made only of closed in-memory streams means the peer is gone: it is logged at debug and dropped, so it is
    neither logged as a crash nor counted as an engine failure.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except BaseException as exc:
            if not (started and _closed_streams_only(exc)):
                raise
            log.debug("%s %s: the client left mid-stream", scope.get("method"), scope.get("path"))


def _closed_streams_only(exc: BaseException) -> bool:
    closed = (anyio.BrokenResourceError, anyio.ClosedResourceError)
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(closed)[1] is None
    return isinstance(exc, closed)
