"""Small things a hostile or careless client found: streams it reset were counted as answered (200), and an unknown
target of 10,000 characters came back whole in the 400's message."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.helpers import server_settings
from tests.live import live_server

LONG = {"q": "Open the file.", "source": "en", "target": "pt", "min_new_tokens": 100, "max_new_tokens": 100}


def requests_total(base: str, route: str, status: str) -> float:
    text = httpx.get(f"{base}/metrics").text
    found = re.search(rf'^tolk_requests_total\{{route="{re.escape(route)}",status="{status}"\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_stream_the_client_resets_counts_as_499(tiny_model_dir: Path) -> None:
    """Before: counted as 200, the status its headers carried."""
    with live_server(create_app(server_settings(tiny_model_dir, scheduler_process=True))) as base:
        with httpx.Client(base_url=base, timeout=30) as client:
            for _ in range(3):
                with client.stream("GET", "/translate/stream", params=LONG) as r:
                    assert r.status_code == 200
                    next(r.iter_lines())  # one line of the stream, then the connection goes
            with client.stream("GET", "/translate/stream", params={**LONG, "min_new_tokens": 1}) as r:
                r.read()  # a stream read to its end
        deadline = time.monotonic() + 10
        while requests_total(base, "/translate/stream", "499") < 3:
            assert time.monotonic() < deadline, "the resets were not counted"
            time.sleep(0.05)
        assert requests_total(base, "/translate/stream", "200") == 1


@pytest.fixture
def client(served: TestClient) -> TestClient:
    return served  # the session's shared app (conftest.py): these tests only read


@pytest.mark.parametrize("body", [
    {"q": "Open the file.", "source": "en", "target": "q" * 10_000},
    {"q": "Open the file.", "source": "q" * 10_000, "target": "pt"},
    {"q": "Open the file.", "source": "auto", "target": "q" * 10_000},
])
def test_an_unknown_language_is_not_echoed_whole(client: TestClient, body: dict[str, str]) -> None:
    r = client.post("/translate", json=body)
    assert (r.status_code, r.json()["error_type"]) == (400, "unsupported_language")
    assert len(r.text) < 500
