"""Through English: with es -> en and en -> pt served, es -> pt is the second model translating the first one's
English, whole and streamed, for a named source and for auto; /languages lists it; a pair with no way is refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.helpers import parse_sse, relabelled, server_settings


@pytest.fixture(scope="module")
def client(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    directory = tmp_path_factory.mktemp("pivot")
    models = [relabelled(tiny_model_dir, directory, "es", "en"), relabelled(tiny_model_dir, directory, "en", "pt")]
    settings = server_settings(tiny_model_dir, scheduler_process=False).model_copy(update={"models": models})
    with TestClient(create_app(settings)) as c:
        yield c


def translate(client: TestClient, q: str | list[str], source: str, target: str, **extra: Any) -> Any:
    r = client.post("/translate", json={"q": q, "source": source, "target": target, **extra})
    assert r.status_code == 200, r.text
    return r.json()


TEXTS = ["Abra el archivo ahora, por favor.", "El disco está lleno."]


def test_a_pair_without_a_model_goes_through_english(client: TestClient) -> None:
    english = translate(client, TEXTS, "es", "en")["translatedText"]
    through = translate(client, english, "en", "pt")["translatedText"]
    assert translate(client, TEXTS, "es", "pt")["translatedText"] == through


def test_details_name_the_models_used(client: TestClient) -> None:
    through = translate(client, TEXTS, "es", "pt", options={"return_scores": True})["details"]
    assert [d["models"] for d in through] == [["tiny-es-en", "tiny-en-pt"]] * 2
    direct = translate(client, TEXTS[0], "es", "en", options={"return_scores": True})["details"]
    assert direct["models"] == ["tiny-es-en"]


def test_streamed_through_english_equals_not_streamed(client: TestClient) -> None:
    whole = translate(client, TEXTS[0], "es", "pt")["translatedText"]
    r = client.post("/translate/stream", json={"q": TEXTS[0], "source": "es", "target": "pt"})
    assert r.status_code == 200, r.text
    events = parse_sse(r.text)
    pieces = "".join(d["token"]["text"] for e, d in events if e == "token")
    assert events[-1][0] == "done" and pieces == whole == events[-1][1]["translatedText"]


def test_auto_detects_and_goes_through_english(client: TestClient) -> None:
    body = translate(client, TEXTS[1], "auto", "pt")
    assert body["detectedLanguage"]["language"] == "es"
    assert body["translatedText"] == translate(client, TEXTS[1], "es", "pt")["translatedText"]


def test_languages_lists_the_way_through_english(client: TestClient) -> None:
    targets = {lang["code"]: lang["targets"] for lang in client.get("/languages").json()}
    assert targets == {"es": ["en", "pt"], "en": ["pt"]}


def test_a_pair_with_no_way_is_refused(client: TestClient) -> None:
    r = client.post("/translate", json={"q": "Hello", "source": "pt", "target": "es"})
    assert r.status_code == 400 and r.json()["error_type"] == "unsupported_language"
