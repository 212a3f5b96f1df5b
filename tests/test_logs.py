"""The server's log carries no API key, no text to translate and no download link, whatever the request put in its
query string; the access log of a real uvicorn server is read. Probed as an operator would: `GET
/translate/stream?q=...&api_key=...` (the only form a browser's EventSource can send) wrote both to the log.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from server.app import create_app
from server.logs import scrub
from tests.helpers import server_settings
from tests.live import live_server

KEY = "k3y-Zanzibarquux"
TEXT = "Quuxfrobnicated payroll"


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def logged(tiny_model_dir: Path, caplog: pytest.LogCaptureFixture) -> Iterator[tuple[str, list[str]]]:
    """A live server with keys on and its access log at info; every line it logged while it ran."""
    caplog.set_level(logging.DEBUG)
    access = logging.getLogger("uvicorn.access")
    kept = Kept()
    settings = server_settings(tiny_model_dir, api_keys=[KEY], scheduler_process=False)
    with live_server(create_app(settings), log_level="info") as url:
        access.addHandler(kept)  # (uvicorn's configuration, made at start, would have dropped it)
        try:
            yield url, kept.lines
        finally:
            access.removeHandler(kept)
    # the server's records; the test's own HTTP client logs the URLs it sends
    kept.lines.extend(r.getMessage() for r in caplog.records if not r.name.startswith(("httpx", "httpcore")))


def test_no_key_or_text_in_the_log(logged: tuple[str, list[str]]) -> None:
    url, lines = logged
    with httpx.Client(base_url=url, timeout=30) as client:
        params = {"q": TEXT, "source": "en", "target": "pt", "api_key": KEY}
        with client.stream("GET", "/translate/stream", params=params) as r:
            assert r.status_code == 200
            r.read()
        assert client.get("/glossaries", params={"api_key": KEY, "token": KEY}).status_code == 200
        r = client.post("/translate", params={"api_key": "wrong", "q": TEXT}, json={"q": TEXT})
        assert r.status_code in (401, 403)
        r = client.post("/translate_file", files={"file": ("a.txt", b"Open the file.")},
                        data={"target": "pt", "api_key": KEY})
        download = r.json()["translatedFileUrl"]
        assert client.get(download).status_code == 200
    access = [line for line in lines if '"GET /translate/stream' in line]
    assert access and "target=pt" in access[0]  # the access log ran, and still says what was asked
    log = "\n".join(lines)
    assert KEY not in log and "Zanzibarquux" not in log
    assert "Quuxfrobnicated" not in log
    assert download.rsplit("/", 1)[1] not in log


@pytest.mark.parametrize(("path", "shown"), [
    ("/translate/stream?q=Hello%20there&api_key=abc&target=pt", "/translate/stream?q=...&api_key=...&target=pt"),
    ("/glossaries?auth_key=abc&token=t", "/glossaries?auth_key=...&token=..."),
    ("/translate?Open%20the%20file", "/translate?...=..."),
    ("/download_file/5f0c-4a1e.report_pt.docx", "/download_file/..."),
    ("/health", "/health"),
])
def test_what_the_access_log_shows_of_a_path(path: str, shown: str) -> None:
    assert scrub(path) == shown
