"""What the server's access log may carry: paths and the names of query parameters, never their values.

uvicorn logs each request's path with its query string at info level. Query strings carry API keys (`?api_key=`,
`auth_key`, `key`, `token`: the only way a browser's EventSource can send one) and text to translate
(`GET /translate/stream?q=...`), and a download's path is all it takes to fetch a translated file. So every value
is replaced by `...`, but for a few that say which languages and format were asked (short, and no secret), and the
name part of a download path goes too.
"""

from __future__ import annotations

import logging
import re

ACCESS_LOGGER = "uvicorn.access"
REDACTED = "..."
KEPT = frozenset({"source", "target", "format", "source_lang", "target_lang"})  # values worth keeping
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\[\]-]{0,39}")
_DOWNLOAD = re.compile(r"^(/download_file/)[^?]*")


def scrub(path: str) -> str:
    """A request's path and query string as the access log may show them."""
    path, mark, query = path.partition("?")
    path = _DOWNLOAD.sub(r"\1" + REDACTED, path)
    if not mark:
        return path
    fields = []
    for field in query.split("&"):
        name, _, value = field.partition("=")
        if not _NAME.fullmatch(name):
            name = REDACTED  # a name can be text too (a form sent as a query string without its `=`)
        fields.append(f"{name}={value[:16] if name in KEPT else REDACTED}")
    return f"{path}?{'&'.join(fields)}"


class AccessLogScrubber(logging.Filter):
    """Rewrites uvicorn's access records (`client - "METHOD path HTTP/x" status`) through `scrub`."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], scrub(args[2]), *args[3:])
        return True


def scrub_access_log() -> None:
    """Put the scrubber on uvicorn's access logger, once per process, however uvicorn was started (`tolk serve`,
    or `uvicorn --factory` behind a proxy); it stays, since the logger outlives any one app."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, AccessLogScrubber) for f in logger.filters):
        logger.addFilter(AccessLogScrubber())
