"""The browser plugins' protocols, each with the exact request its plugin sends: Immersive Translate, Kiss
Translator, DeepLX and Google's v2 basic shape; and the same texts through every shape Tolk speaks (LibreTranslate's,
DeepL's, each plugin's) give the same translations.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.helpers import server_settings

KEY = "plugin-key"
TEXTS = ["Open the file.", "Save changes {0} before closing <b0></b0> the window.", "Click here to continue."]
BEARER = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def client(tiny_model_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(server_settings(tiny_model_dir, api_keys=[KEY]))) as c:
        yield c


def ok(r: Any) -> Any:
    assert r.status_code == 200, r.text
    return r.json()


def libre(client: TestClient, q: list[str]) -> list[str]:
    out: list[str] = ok(client.post("/translate", json={"q": q, "source": "en", "target": "pt"},
                                    headers=BEARER))["translatedText"]
    return out


def immersive(client: TestClient, texts: list[str]) -> list[str]:
    body = ok(client.post(f"/immersive/translate?token={KEY}",
                          json={"source_lang": "auto", "target_lang": "pt", "text_list": texts}))
    assert [t["detected_source_lang"] for t in body["translations"]] == ["en"] * len(texts)
    return [t["text"] for t in body["translations"]]


def kiss(client: TestClient, texts: list[str]) -> list[str]:
    body = ok(client.post("/kiss/translate", json={"texts": texts, "from": "auto", "to": "pt"}, headers=BEARER))
    assert set(body) == {"translations"} and [t["src"] for t in body["translations"]] == ["en"] * len(texts)
    return [t["text"] for t in body["translations"]]


def deeplx(client: TestClient, texts: list[str]) -> list[str]:
    out = []
    for text in texts:  # DeepLX takes one text a request
        body = ok(client.post(f"/deeplx/translate?token={KEY}",
                              json={"text": text, "source_lang": "auto", "target_lang": "PT"}))
        assert body["code"] == 200 and body["source_lang"] == "EN" and body["target_lang"] == "PT"
        assert body["alternatives"] == [] and isinstance(body["id"], int)
        out.append(body["data"])
    return out


def google(client: TestClient, texts: list[str]) -> list[str]:
    body = ok(client.post(f"/language/translate/v2?key={KEY}",
                          json={"q": texts, "target": "pt", "format": "text"}))
    assert [t["detectedSourceLanguage"] for t in body["data"]["translations"]] == ["en"] * len(texts)
    return [t["translatedText"] for t in body["data"]["translations"]]


def deepl_api(client: TestClient, texts: list[str]) -> list[str]:
    body = ok(client.post("/v2/translate", json={"text": texts, "target_lang": "PT-BR"},
                          headers={"Authorization": f"DeepL-Auth-Key {KEY}"}))
    return [t["text"] for t in body["translations"]]


@pytest.mark.parametrize("shape", [immersive, kiss, deeplx, google, deepl_api])
def test_every_shape_gives_libretranslates_translation(client: TestClient, shape: Any) -> None:
    assert shape(client, TEXTS) == libre(client, TEXTS)


def test_placeholders_the_plugins_put_for_markup_come_back_once(client: TestClient) -> None:
    """Immersive Translate puts `{0}` or `<b0></b0>` where markup was, and restores it from the translation."""
    text = "Save {0} the file {1} and <b0></b0> close <b1></b1> the window."
    out = immersive(client, [text])[0]
    for placeholder in ("{0}", "{1}", "<b0>", "</b0>", "<b1>", "</b1>"):
        assert out.count(placeholder) == 1, (placeholder, out)
    assert out.index("<b0>") < out.index("</b0>") and out.index("<b1>") < out.index("</b1>")


def test_kiss_translators_older_single_text_shape(client: TestClient) -> None:
    body = ok(client.post("/kiss/translate", json={"text": TEXTS[0], "from": "en", "to": "pt"}, headers=BEARER))
    assert body == {"text": libre(client, [TEXTS[0]])[0], "src": "en",
                    "translations": [{"text": body["text"], "src": "en"}]}


def test_deeplx_takes_its_token_three_ways(client: TestClient) -> None:
    request = {"text": TEXTS[0], "source_lang": "EN", "target_lang": "PT"}
    expected = libre(client, [TEXTS[0]])[0]
    assert ok(client.post(f"/deeplx/{KEY}/translate", json=request))["data"] == expected
    assert ok(client.post("/deeplx/translate", json=request, headers=BEARER))["data"] == expected
    assert ok(client.post(f"/deeplx/translate?token={KEY}", json=request))["data"] == expected
    wrong = client.post("/deeplx/not-the-key/translate", json=request)
    assert wrong.status_code == 403 and wrong.json() == {"code": 403, "message": "invalid API key"}
    html = ok(client.post(f"/deeplx/{KEY}/translate", json={**request, "text": "<p>Open the <b>file</b>.</p>",
                                                              "tag_handling": "html"}))["data"]
    assert html == ok(client.post("/translate", json={"q": "<p>Open the <b>file</b>.</p>", "source": "en",
                                                       "target": "pt", "format": "html"}, headers=BEARER))[
        "translatedText"]


def test_google_form_body_one_q_html_by_default_and_its_errors(client: TestClient) -> None:
    page = "<p>Open the <b>file</b>.</p>"
    body = ok(client.post(f"/language/translate/v2?key={KEY}", data={"q": page, "source": "en", "target": "pt"}))
    expected = ok(client.post("/translate", json={"q": page, "source": "en", "target": "pt", "format": "html"},
                              headers=BEARER))["translatedText"]
    assert body == {"data": {"translations": [{"translatedText": expected}]}}  # no detected language: it was named
    languages = ok(client.get("/language/translate/v2/languages"))["data"]["languages"]
    assert languages == [{"language": "en"}, {"language": "pt"}]
    bad = client.post(f"/language/translate/v2?key={KEY}", json={"q": ["Open."], "target": "xx"})
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert error["code"] == 400 and "xx" in error["message"] and error["errors"][0]["reason"] == "unsupported_language"


def test_plugins_need_the_key_when_the_server_has_keys(client: TestClient) -> None:
    immersive_request = {"source_lang": "auto", "target_lang": "pt", "text_list": [TEXTS[0]]}
    assert client.post("/immersive/translate", json=immersive_request).status_code == 401
    assert client.post("/immersive/translate?token=wrong", json=immersive_request).status_code == 403
    assert client.post("/kiss/translate", json={"texts": [TEXTS[0]], "to": "pt"}).status_code == 401
    assert client.post("/language/translate/v2?key=wrong", json={"q": "Open.", "target": "pt"}).status_code == 403


def test_without_keys_any_token_is_taken(served: TestClient) -> None:
    request = {"source_lang": "en", "target_lang": "pt", "text_list": [TEXTS[0]]}
    assert ok(served.post("/immersive/translate?token=anything", json=request))["translations"][0]["text"]
    assert ok(served.post("/deeplx/made-up/translate", json={"text": TEXTS[0], "target_lang": "PT"}))["data"]
