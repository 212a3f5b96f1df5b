"""DeepL's API beyond what its SDK sends: Weblate's DeepL request, tag options as markup of Tolk's HTML path, the
ways a key travels, glossaries named the /v3 way, and usage counts that outlive a restart.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.deepl import TagOptions
from tests.helpers import server_settings

KEY = "deepl-key"
AUTH = {"Authorization": f"DeepL-Auth-Key {KEY}"}


@pytest.fixture(scope="module")
def client(tiny_model_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(server_settings(tiny_model_dir, api_keys=[KEY]))) as c:
        yield c


def deepl(client: TestClient, headers: dict[str, str] | None = None, **fields: Any) -> list[str]:
    r = client.post("/v2/translate", json=fields, headers=AUTH if headers is None else headers)
    assert r.status_code == 200, r.text
    return [t["text"] for t in r.json()["translations"]]


def html(client: TestClient, q: str) -> str:
    r = client.post("/translate", json={"q": q, "source": "en", "target": "pt", "format": "html"}, headers=AUTH)
    assert r.status_code == 200, r.text
    text: str = r.json()["translatedText"]
    return text


def test_tag_options_are_undone_exactly() -> None:
    source = 'Open <x id="1"></x> the <foo a="1">big <span>file</span></foo>, <b>save</b> it<foo/>.'
    options = TagOptions(["x"], ["foo"], ["b"])
    prepared = options.prepare(source)
    assert "<x" not in prepared and "<foo" not in prepared and "<b>" not in prepared
    assert options.restore(prepared) == source


def test_weblates_request_keeps_its_placeholders(client: TestClient) -> None:
    """Weblate's DeepL backend: xml tags, `<x id="N"></x>` for its placeholders, ignore_tags x, context."""
    text = 'Copy <x id="1"></x> to <x id="2"></x> before closing the window.'
    out = deepl(client, text=[text, "Save changes."], source_lang="EN", target_lang="PT-BR", formality="default",
                tag_handling="xml", ignore_tags=["x"], context="A menu of a file manager.")
    assert out[0].count('<x id="1"></x>') == 1 and out[0].count('<x id="2"></x>') == 1 and out[0].count("<x") == 2
    assert out[1] == html(client, "Save changes.")  # a text without tags: the HTML path's own translation


def test_non_splitting_and_splitting_tags_act_as_inline_and_block_elements(client: TestClient) -> None:
    inline = deepl(client, text=["Open <foo>the file</foo> now."], target_lang="PT-BR", tag_handling="xml",
                   non_splitting_tags="foo")[0]
    assert inline == html(client, "Open <span>the file</span> now.").replace("span>", "foo>")
    block = deepl(client, text=["Open <b>the file</b> now."], target_lang="PT-BR", tag_handling="html",
                  splitting_tags=["b"])[0]
    assert block == html(client, "Open <div>the file</div> now.").replace("div>", "b>")


def test_a_form_body_with_repeated_text_and_comma_separated_tags(client: TestClient) -> None:
    form = {"text": ['Open <x id="1"></x> now.', "Save all."], "target_lang": "PT-BR", "tag_handling": "xml",
            "ignore_tags": "x,y", "split_sentences": "nonewlines", "preserve_formatting": "1"}
    r = client.post("/v2/translate", data=form, headers=AUTH)
    assert r.status_code == 200, r.text
    assert [t["text"] for t in r.json()["translations"]] == deepl(client, text=form["text"], target_lang="PT-BR",
                                                                  tag_handling="xml", ignore_tags=["x", "y"])


def test_a_key_travels_as_deepl_and_bearer_headers_or_deepls_old_auth_key(client: TestClient) -> None:
    expected = deepl(client, text=["Open the file."], target_lang="PT-BR")
    assert deepl(client, {"Authorization": f"Bearer {KEY}"}, text=["Open the file."], target_lang="PT-BR") == expected
    assert deepl(client, {}, text=["Open the file."], target_lang="PT-BR", auth_key=KEY) == expected
    r = client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "pt"}, headers=AUTH)
    assert r.status_code == 200 and r.json()["translatedText"] == expected[0]  # the LibreTranslate path takes it too
    missing = client.post("/v2/translate", json={"text": ["Open."], "target_lang": "PT-BR"})
    assert missing.status_code == 401 and set(missing.json()) == {"message", "code"}


def test_glossaries_named_the_v3_way(client: TestClient) -> None:
    made = client.post("/v3/glossaries", headers=AUTH, json={"name": "UI", "dictionaries": [
        {"source_lang": "en", "target_lang": "pt", "entries": "file\tarquivo", "entries_format": "tsv"}]}).json()
    v2 = client.post("/v2/glossaries", headers=AUTH, json={"name": "UI", "source_lang": "en", "target_lang": "pt",
                                                          "entries": "file\tarquivo", "entries_format": "tsv"}).json()
    texts = ["Open the file.", "Save the file to disk."]
    assert deepl(client, text=texts, source_lang="EN", target_lang="PT-BR", glossary_id=made["glossary_id"]) == \
        deepl(client, text=texts, source_lang="EN", target_lang="PT-BR", glossary_id=v2["glossary_id"])
    assert v2["glossary_id"] not in {g["glossary_id"] for g in client.get("/v3/glossaries", headers=AUTH).json()[
        "glossaries"]}  # each API lists its own
    assert made["glossary_id"] not in {g["glossary_id"] for g in client.get("/v2/glossaries", headers=AUTH).json()[
        "glossaries"]}
    no_source = client.post("/v2/translate", headers=AUTH, json={"text": ["Open."], "target_lang": "PT-BR",
                                                                  "glossary_id": made["glossary_id"]})
    assert no_source.status_code == 400 and "source_lang" in no_source.json()["message"]
    two = client.post("/v2/translate", headers=AUTH, json={"text": ["Open."], "source_lang": "EN", "target_lang": "PT",
                                                            "glossary_ids": [made["glossary_id"], v2["glossary_id"]]})
    assert two.status_code == 400
    other = client.get("/v3/glossaries", headers={"Authorization": "DeepL-Auth-Key wrong"})
    assert other.status_code == 403


def test_usage_outlives_a_restart_and_counts_each_key(tiny_model_dir: Path, tmp_path: Path) -> None:
    settings = server_settings(tiny_model_dir, scheduler_process=False, api_keys=["one", "two"], data_dir=tmp_path)
    texts = ["Open the file.", "Save."]
    with TestClient(create_app(settings)) as c:
        assert c.post("/v2/translate", json={"text": texts, "target_lang": "PT-BR"},
                      headers={"Authorization": "DeepL-Auth-Key one"}).status_code == 200
        assert c.post("/kiss/translate", json={"texts": texts, "to": "pt"},
                      headers={"Authorization": "Bearer two"}).status_code == 200
        assert c.post("/translate", json={"q": "Save.", "source": "en", "target": "pt", "api_key": "two"}
                      ).status_code == 200
    with TestClient(create_app(settings)) as c:  # a new server on the same data directory
        one = c.get("/v2/usage", headers={"Authorization": "DeepL-Auth-Key one"}).json()
        two = c.get("/v2/usage", headers={"Authorization": "DeepL-Auth-Key two"}).json()
    assert one["character_count"] == sum(map(len, texts))
    assert two["character_count"] == sum(map(len, texts)) + len("Save.")


def test_documents_count_towards_their_keys_usage(tiny_model_dir: Path, tmp_path: Path) -> None:
    """/translate_file, /documents and /v2/document charge the characters of the document's texts, once."""
    settings = server_settings(tiny_model_dir, scheduler_process=False, api_keys=["one"], data_dir=tmp_path)
    text = "Open the file.\nSave it."
    auth = {"Authorization": "DeepL-Auth-Key one"}
    with TestClient(create_app(settings)) as c:
        r = c.post("/translate_file", files={"file": ("a.txt", text.encode())}, data={"target": "pt", "api_key": "one"})
        assert r.status_code == 200, r.text
        assert c.get("/v2/usage", headers=auth).json()["character_count"] == len(text)
        r = c.post("/v2/document", files={"file": ("a.txt", text.encode())}, data={"target_lang": "PT"}, headers=auth)
        assert r.status_code == 200, r.text
        assert c.get("/v2/usage", headers=auth).json()["character_count"] == 2 * len(text)
