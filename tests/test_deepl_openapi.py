"""Tolk's /v2 and /v3 answers validate against DeepL's published OpenAPI description (tests/data/deepl-openapi/).

Every operation Tolk serves at DeepL's paths is called, its successes and its errors, and each JSON answer is
validated with jsonschema against the schema DeepL publishes for that path, method and status. Timestamps marked
`date-time` must also parse as DeepL's SDKs parse them (fractions of a second and a zone).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from jsonschema import Draft4Validator, FormatChecker, ValidationError

from server.app import create_app
from tests.helpers import server_settings

SPEC = json.loads((Path(__file__).parent / "data" / "deepl-openapi" / "openapi.json").read_text())
KEY = "openapi-key"
AUTH = {"Authorization": f"DeepL-Auth-Key {KEY}"}
FORMATS = FormatChecker()


@FORMATS.checks("date-time", raises=ValueError)
def deepl_timestamp(value: object) -> bool:
    """As the SDKs parse `creation_time` (deepl.util.parse_timestamp)."""
    if isinstance(value, str):
        datetime.strptime(re.sub(r"(\.\d{6})\d+", r"\1", value), "%Y-%m-%dT%H:%M:%S.%f%z")
    return True


def resolved(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        found: Any = SPEC
        for part in node["$ref"].removeprefix("#/").split("/"):
            found = found[part]
        node = found
    return node


def schema_of(path: str, method: str, status: int) -> dict[str, Any]:
    """DeepL's schema of the JSON answer to `method path` with `status`."""
    responses = SPEC["paths"][path][method.lower()]["responses"]
    assert str(status) in responses, f"DeepL's description has no {status} for {method} {path}"
    content = resolved(responses[str(status)]).get("content", {})
    assert "application/json" in content, f"{method} {path} {status} is not JSON in DeepL's description"
    schema: dict[str, Any] = content["application/json"]["schema"]
    return schema


def validator(path: str, method: str, status: int) -> Draft4Validator:
    """A validator of DeepL's schema (OpenAPI 3.0's schemas are JSON Schema draft 4 with extra keywords), its
    references resolved within the description."""
    schema = schema_of(path, method, status)
    return Draft4Validator({**schema, "components": SPEC["components"]}, format_checker=FORMATS)


def check(r: Any, path: str, status: int) -> Any:
    """The response has the status, and its body validates against DeepL's schema for it."""
    assert r.status_code == status, r.text
    validator(path, r.request.method, status).validate(r.json())
    return r.json()


def test_the_validation_would_catch_a_wrong_answer() -> None:
    with pytest.raises(ValidationError):
        validator("/v2/translate", "POST", 200).validate({"translations": [{"text": 3}]})
    with pytest.raises(ValidationError):
        validator("/v2/glossaries", "POST", 201).validate({"creation_time": "2026-05-01T10:00:00"})
    with pytest.raises(ValidationError):
        validator("/v2/translate", "POST", 400).validate({"error": "no message", "error_type": "x"})


@pytest.fixture(scope="module")
def client(tiny_model_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(server_settings(tiny_model_dir, api_keys=[KEY])), headers=AUTH) as c:
        yield c


def test_translate_answers_and_errors(client: TestClient) -> None:
    path = "/v2/translate"
    check(client.post(path, json={"text": ["Open the file."], "target_lang": "PT-BR"}), path, 200)
    full = check(client.post(path, json={"text": ["Open the <b>file</b>."], "target_lang": "PT-BR",
                                         "show_billed_characters": True, "tag_handling": "html",
                                         "model_type": "quality_optimized", "formality": "prefer_less",
                                         "context": "A menu item."}), path, 200)
    assert set(full["translations"][0]) == {"detected_source_language", "text", "billed_characters",
                                            "model_type_used", "tag_handling_version"}
    check(client.post(path, data={"text": ["Open the file.", "Save all."], "target_lang": "PT-PT"}), path, 200)
    check(client.post(path, json={"text": ["Open."], "target_lang": "DE"}), path, 400)
    check(client.post(path, json={"text": ["Open."], "target_lang": "PT-BR"},
                      headers={"Authorization": "DeepL-Auth-Key wrong"}), path, 403)
    check(client.post(path, json={"text": ["Open."], "source_lang": "EN", "target_lang": "PT-BR",
                                  "glossary_id": "missing"}), path, 404)


def test_languages_pairs_and_usage(client: TestClient) -> None:
    check(client.get("/v2/languages"), "/v2/languages", 200)
    targets = check(client.request("GET", "/v2/languages", data={"type": "target"}), "/v2/languages", 200)
    assert [t["language"] for t in targets] == ["PT-BR", "PT-PT"]
    check(client.get("/v2/glossary-language-pairs"), "/v2/glossary-language-pairs", 200)
    usage = check(client.get("/v2/usage"), "/v2/usage", 200)
    assert usage["character_count"] == usage["api_key_character_count"] > 0


def test_v2_glossaries(client: TestClient) -> None:
    made = check(client.post("/v2/glossaries", json={"name": "UI", "source_lang": "EN", "target_lang": "PT",
                                                     "entries": "file\tarquivo", "entries_format": "tsv"}),
                 "/v2/glossaries", 201)
    one = f"/v2/glossaries/{made['glossary_id']}"
    check(client.get("/v2/glossaries"), "/v2/glossaries", 200)
    assert check(client.get(one), "/v2/glossaries/{glossary_id}", 200) == made
    entries = client.get(f"{one}/entries", headers={"Accept": "text/tab-separated-values"})
    assert entries.headers["content-type"].startswith("text/tab-separated-values") and entries.text == "file\tarquivo\n"
    assert client.delete(one).status_code == 204
    check(client.get(one), "/v2/glossaries/{glossary_id}", 404)
    check(client.post("/v2/glossaries", json={"name": "UI", "source_lang": "EN", "target_lang": "PT",
                                              "entries": "file", "entries_format": "tsv"}), "/v2/glossaries", 400)


def test_v3_glossaries(client: TestClient) -> None:
    made = check(client.post("/v3/glossaries", json={"name": "M", "dictionaries": [
        {"source_lang": "en", "target_lang": "pt", "entries": "file\tarquivo", "entries_format": "tsv"}]}),
        "/v3/glossaries", 201)
    one = f"/v3/glossaries/{made['glossary_id']}"
    check(client.get("/v3/glossaries"), "/v3/glossaries", 200)
    check(client.get(one), "/v3/glossaries/{glossary_id}", 200)
    patched = check(client.patch(one, json={"name": "M2", "dictionaries": [
        {"source_lang": "en", "target_lang": "pt", "entries": "save\tsalvar", "entries_format": "tsv"}]}),
        "/v3/glossaries/{glossary_id}", 200)
    assert patched["name"] == "M2" and patched["dictionaries"][0]["entry_count"] == 2
    put = check(client.put(f"{one}/dictionaries", json={"source_lang": "en", "target_lang": "pt",
                                                        "entries": "disk,disco", "entries_format": "csv"}),
                "/v3/glossaries/{glossary_id}/dictionaries", 200)
    assert put == {"source_lang": "en", "target_lang": "pt", "entry_count": 1}
    entries = check(client.get(f"{one}/entries", params={"source_lang": "en", "target_lang": "pt"}),
                    "/v3/glossaries/{glossary_id}/entries", 200)
    assert entries["dictionaries"][0]["entries"] == "disk\tdisco\n"
    assert client.delete(f"{one}/dictionaries", params={"source_lang": "en", "target_lang": "pt"}).status_code == 204
    assert client.delete(one).status_code == 204
    check(client.get(one), "/v3/glossaries/{glossary_id}", 404)


def test_documents(client: TestClient) -> None:
    before = client.get("/v2/usage").json()["character_count"]
    handle = check(client.post("/v2/document", files={"file": ("notes.txt", b"Open the file.\n")},
                               data={"target_lang": "PT-BR"}), "/v2/document", 200)
    status_path = f"/v2/document/{handle['document_id']}"
    deadline = time.monotonic() + 30
    while True:
        status = check(client.post(status_path, json={"document_key": handle["document_key"]}),
                       "/v2/document/{document_id}", 200)
        if status["status"] in ("done", "error") or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert status["status"] == "done" and status["billed_characters"] >= len("Open the file.")
    assert client.get("/v2/usage").json()["character_count"] == before + status["billed_characters"]
    result = client.post(f"{status_path}/result", data={"document_key": handle["document_key"]})
    assert result.status_code == 200 and result.content
    check(client.post(f"{status_path}/result", json={"document_key": handle["document_key"]}),
          "/v2/document/{document_id}/result", 404)


def test_a_used_up_quota(tiny_model_dir: Path) -> None:
    settings = server_settings(tiny_model_dir, scheduler_process=False, character_limit=5)
    with TestClient(create_app(settings)) as c:
        check(c.post("/v2/translate", json={"text": ["Open the file."], "target_lang": "PT-BR"}), "/v2/translate", 200)
        check(c.post("/v2/translate", json={"text": ["Save."], "target_lang": "PT-BR"}), "/v2/translate", 456)
        usage = check(c.get("/v2/usage"), "/v2/usage", 200)
        assert (usage["character_count"], usage["character_limit"]) == (len("Open the file."), 5)
