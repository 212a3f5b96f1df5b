"""Language codes as clients send them find the served model: pt-BR, pt_BR, por, PT and LibreTranslate's pb all
mean the model's pt; a regional variant finds its language; another language never does."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from server.languages import match, standard


@pytest.mark.parametrize(("code", "served", "expected"), [
    ("pt", ["en", "pt"], "pt"), ("pt-BR", ["pt"], "pt"), ("pt_BR", ["pt"], "pt"), ("por", ["pt"], "pt"),
    ("PT", ["pt"], "pt"), ("pb", ["pt"], "pt"), ("pt-PT", ["pt"], "pt"), ("en-GB", ["en", "pt"], "en"),
    ("eng", ["en"], "en"), ("pt-BR", ["pt", "pt-BR"], "pt-BR"), ("es", ["en", "pt"], None), ("gl", ["pt"], None),
    ("not a code", ["pt"], None), ("", ["pt"], None),
])
def test_codes_match_the_served_language(code: str, served: list[str], expected: str | None) -> None:
    assert match(code, served) == expected


def test_standard_tags() -> None:
    assert [standard(c) for c in ("pt_BR", "por", "pb", "EN", "zh-hans")] == ["pt-BR", "pt", "pt-BR", "en", "zh-Hans"]


@pytest.fixture
def client(served: TestClient) -> TestClient:
    return served  # the session's shared app (conftest.py): these tests only read


def translate(client: TestClient, source: str, target: str) -> tuple[int, dict[str, object]]:
    r = client.post("/translate", json={"q": "Open the file.", "source": source, "target": target})
    return r.status_code, r.json()


@pytest.mark.parametrize(("source", "target"), [("en-US", "pt-BR"), ("eng", "pb"), ("EN", "pt_BR"), ("en", "por")])
def test_the_api_takes_the_codes_clients_send(client: TestClient, source: str, target: str) -> None:
    assert translate(client, source, target) == translate(client, "en", "pt")


def test_another_language_is_refused_by_its_code(client: TestClient) -> None:
    status, body = translate(client, "en", "es")
    assert status == 400 and "es" in str(body)
