"""LibreTranslate's clients in the wild, each with the exact request it sends: fields in the query string of a POST
(deep-translator), `q` in the query string of /detect, multipart with `format=html` and a JSON-encoded list as one
`q` (Nextcloud), a key sent to a server without keys, `detectedLanguage` read for a named source (Traduzir Paginas
Web), and a form body on GET /languages (libretranslatepy). Each answer equals the plain JSON request's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.helpers import server_settings

KEY = "libre-key"
TEXTS = ["Open the file.", "Save changes before closing."]
PAGE = "<p>Click <b>here</b> to continue.</p>"


@pytest.fixture(scope="module")
def keyed(tiny_model_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(server_settings(tiny_model_dir, api_keys=[KEY]))) as c:
        yield c


@pytest.fixture
def open_server(served: TestClient) -> TestClient:
    return served  # the session's shared app (conftest.py), without keys: these tests only read


def ok(r: Any) -> Any:
    assert r.status_code == 200, r.text
    return r.json()


def reference(client: TestClient, q: str | list[str], fmt: str = "text") -> Any:
    """The plain JSON request's translation."""
    return ok(client.post("/translate", json={"q": q, "source": "en", "target": "pt", "format": fmt, "api_key": KEY}
                          ))["translatedText"]


def test_deep_translator_sends_every_field_in_the_query_string(keyed: TestClient) -> None:
    params = {"q": TEXTS[0], "source": "en", "target": "pt", "format": "text", "api_key": KEY}
    assert ok(keyed.post("/translate", params=params))["translatedText"] == reference(keyed, TEXTS[0])
    assert keyed.post("/translate", params={**params, "api_key": "wrong"}).status_code == 403


def test_a_key_in_the_query_string_beside_a_json_body(keyed: TestClient) -> None:
    r = keyed.post(f"/translate?api_key={KEY}", json={"q": TEXTS[0], "source": "en", "target": "pt"})
    assert ok(r)["translatedText"] == reference(keyed, TEXTS[0])
    body_wins = keyed.post("/translate?target=xx", json={"q": TEXTS[0], "source": "en", "target": "pt",
                                                         "api_key": KEY})
    assert ok(body_wins)["translatedText"] == reference(keyed, TEXTS[0])


def test_a_key_sent_to_a_server_without_keys_is_taken(open_server: TestClient) -> None:
    """deep-translator refuses to run without a key, so its users make one up."""
    params = {"q": TEXTS[0], "source": "en", "target": "pt", "format": "text", "api_key": "made-up"}
    plain = ok(open_server.post("/translate", json={"q": TEXTS[0], "source": "en", "target": "pt"}))
    assert ok(open_server.post("/translate", params=params))["translatedText"] == plain["translatedText"]


def test_nextcloud_detect_with_q_in_the_query_string(keyed: TestClient) -> None:
    r = keyed.post("/detect", params={"q": TEXTS[0]}, data={"api_key": KEY})
    assert ok(r) == ok(keyed.post("/detect", json={"q": TEXTS[0], "api_key": KEY}))


def test_nextcloud_multipart_with_format_html(keyed: TestClient) -> None:
    fields = {"q": PAGE, "source": "en", "target": "pt", "format": "html", "api_key": KEY}
    r = keyed.post("/translate", files={name: (None, value) for name, value in fields.items()})
    assert ok(r)["translatedText"] == reference(keyed, PAGE, "html")


def test_nextcloud_json_encoded_list_as_one_q(keyed: TestClient) -> None:
    r = ok(keyed.post("/translate", json={"q": json.dumps(TEXTS), "source": "en", "target": "pt", "api_key": KEY}))
    assert isinstance(r["translatedText"], str)
    assert json.loads(r["translatedText"]) == reference(keyed, TEXTS)
    assert r["detectedLanguage"] == {"confidence": 100.0, "language": "en"}
    not_a_list = '["Open the file.", 3]'  # a text that only looks like a list is translated as a text
    assert isinstance(ok(keyed.post("/translate", json={"q": not_a_list, "source": "en", "target": "pt",
                                                         "api_key": KEY}))["translatedText"], str)


def test_traduzir_paginas_web_reads_the_detected_language_of_a_named_source(open_server: TestClient) -> None:
    r = ok(open_server.post("/translate", data={"q": PAGE, "source": "en", "target": "pt", "format": "html",
                                                "api_key": ""}))
    assert r["detectedLanguage"] == {"confidence": 100.0, "language": "en"}
    many = ok(open_server.post("/translate", json={"q": TEXTS, "source": "en", "target": "pt"}))
    assert many["detectedLanguage"] == [{"confidence": 100.0, "language": "en"}] * len(TEXTS)


def test_libretranslatepy_asks_languages_with_a_form_body(open_server: TestClient) -> None:
    plain = ok(open_server.get("/languages"))
    assert plain == [{"code": "en", "name": "English", "targets": ["pt"]}]
    assert ok(open_server.request("GET", "/languages", data={"api_key": KEY})) == plain  # its current versions
    assert ok(open_server.post("/languages", data={"api_key": KEY})) == plain  # its older ones
