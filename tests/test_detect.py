"""Language detection: POST /detect, `source: auto` routing each text to its model, /frontend/settings, /suggest.

Three tiny models (the same weights under other languages): en -> pt, es -> pt (at most 2 new tokens, so what it
answers differs from what en -> pt would) and pt -> en. The detector is the real one (py3langid), restricted to
en, es and pt.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from server.app import create_app
from server.detect import Detector
from tests.helpers import ES, parse_sse, renamed, server_settings

EN = "The file could not be opened because the disk is full."
PT = "Não foi possível abrir o arquivo porque o disco está cheio."
FR = "Le fichier n'a pas pu être ouvert car le disque est plein."
SERVED = {"en", "es", "pt"}


@pytest.fixture(scope="module")
def model_dirs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    base = tmp_path_factory.mktemp("languages")
    return [tiny_model_dir, renamed(tiny_model_dir, base / "es-pt", "es", "pt", {"max_new_tokens": 2}),
            renamed(tiny_model_dir, base / "pt-en", "pt", "en")]


@pytest.fixture(scope="module")
def client(model_dirs: list[Path]) -> Iterator[TestClient]:
    with TestClient(create_app(server_settings(model_dirs[0]).model_copy(update={"models": model_dirs}))) as c:
        yield c


def detect(client: TestClient, q: str | list[str]) -> list[dict[str, Any]]:
    r = client.post("/detect", json={"q": q})
    assert r.status_code == 200, r.text
    found: list[dict[str, Any]] = r.json()
    confidences = [d["confidence"] for d in found]
    assert found and all(isinstance(c, float) and 0 <= c <= 100 for c in confidences)
    assert confidences == sorted(confidences, reverse=True)
    return found


def translate(client: TestClient, q: str | list[str], **fields: Any) -> Any:
    r = client.post("/translate", json={"q": q, **fields})
    assert r.status_code == 200, r.text
    return r.json()


# --- POST /detect -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "language"), [(EN, "en"), (PT, "pt"), (ES, "es")])
def test_detect_finds_the_language_of_clear_sentences(client: TestClient, text: str, language: str) -> None:
    best = detect(client, text)[0]
    assert best["language"] == language and best["confidence"] > 90


def test_detect_names_a_language_no_model_serves(client: TestClient) -> None:
    found = detect(client, FR)
    assert found[0]["language"] == "fr" and found[0]["confidence"] > 90


def test_detect_takes_a_form_and_a_list(client: TestClient) -> None:
    assert client.post("/detect", data={"q": PT}).json() == detect(client, PT)
    # LibreTranslate ranks a list once for all its texts, weighted by length: the longer Spanish text leads.
    found = detect(client, [EN, f"{ES} {ES}"])
    assert [d["language"] for d in found[:2]] == ["es", "en"]
    assert client.post("/detect", data={"q": [EN, f"{ES} {ES}"]}).json() == found


@pytest.mark.parametrize(("body", "status", "error_type"), [
    ({}, 422, "validation_error"),
    ({"q": 3}, 422, "validation_error"),
    ({"q": ["a", 1]}, 422, "validation_error"),
    ({"q": "a", "source": "en"}, 422, "validation_error"),
    ({"q": ""}, 400, "empty_text"),
    ({"q": "  \n"}, 400, "empty_text"),
    ({"q": []}, 400, "empty_text"),
    ({"q": "a\x00b"}, 400, "invalid_text"),
    ({"q": "a" * 2001}, 413, "payload_too_large"),
    ({"q": ["a"] * 9}, 413, "payload_too_large"),
])
def test_detect_refuses_bad_input(client: TestClient, body: dict[str, Any], status: int, error_type: str) -> None:
    r = client.post("/detect", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error_type"] == error_type and r.json()["error"]


def test_detect_refuses_broken_json_and_other_methods(client: TestClient) -> None:
    r = client.post("/detect", content=b'{"q": ', headers={"content-type": "application/json"})
    assert (r.status_code, r.json()["error_type"]) == (400, "invalid_json")
    r = client.get("/detect")
    assert (r.status_code, r.json()["error_type"]) == (405, "method_not_allowed")


def test_a_detector_of_served_codes() -> None:
    detector = Detector(["en", "pt-BR", "xx"])  # a region variant, and a code the model does not know
    assert detector.detect(PT)[0].language == "pt-BR"
    assert "xx" not in detector.probabilities(EN)
    assert detector.best(FR).language == "fr"  # not forced onto a served language
    assert Detector(["en"]).best(FR).language == "fr"
    # a short string in a served language stays one: the served languages are taken as likelier
    assert [detector.best(t).language for t in ("Save", "Open file", "Salvar", "Abrir arquivo")] == [
        "en", "en", "pt-BR", "pt-BR"]


# --- source: auto -------------------------------------------------------------------------------------------

def test_auto_routes_each_text_to_the_model_of_its_language(client: TestClient) -> None:
    from_en = translate(client, EN, source="en", target="pt")["translatedText"]
    from_es = translate(client, ES, source="es", target="pt")["translatedText"]
    assert from_es != translate(client, ES, source="en", target="pt")["translatedText"]  # the models differ
    out = translate(client, [EN, ES], source="auto", target="pt", options={"return_scores": True})
    assert out["translatedText"] == [from_en, from_es]
    assert [d["language"] for d in out["detectedLanguage"]] == ["en", "es"]
    assert all(d["confidence"] > 90 for d in out["detectedLanguage"])
    assert out["details"][1]["generated_tokens"] <= 2 < out["details"][0]["generated_tokens"]
    one = translate(client, ES, source="auto", target="pt")
    assert one["translatedText"] == from_es and one["detectedLanguage"]["language"] == "es"


def test_a_text_in_the_target_language_comes_back_as_it_is(client: TestClient) -> None:
    out = translate(client, [PT, EN], source="auto", target="pt")
    assert out["translatedText"][0] == PT and out["detectedLanguage"][0]["language"] == "pt"
    assert out["translatedText"][1] == translate(client, EN, source="en", target="pt")["translatedText"]
    assert translate(client, EN, source="en", target="en")["translatedText"] == EN  # named so, as LibreTranslate
    r = client.post("/translate/stream", json={"q": PT, "source": "auto", "target": "pt"})
    assert [(e, d.get("translatedText")) for e, d in parse_sse(r.text) if e == "done"] == [("done", PT)]
    # into English only pt -> en fits; with no target, pt's only model is taken
    from_pt = translate(client, PT, source="pt", target="en")["translatedText"]
    for fields in ({"target": "en"}, {}):
        out = translate(client, PT, source="auto", **fields)
        assert out["translatedText"] == from_pt
        assert out["detectedLanguage"]["language"] == "pt" and out["detectedLanguage"]["confidence"] > 90


def test_auto_without_a_model_to_the_target(client: TestClient) -> None:
    r = client.post("/translate", json={"q": EN, "source": "auto", "target": "de"})
    assert (r.status_code, r.json()["error_type"]) == (400, "unsupported_language")
    assert "detected language en" in r.json()["error"] and "into de" in r.json()["error"]


def test_auto_streams_as_it_translates(client: TestClient) -> None:
    whole = translate(client, [EN, ES, EN], source="auto", target="pt")
    r = client.post("/translate/stream", json={"q": [EN, ES, EN], "source": "auto", "target": "pt"})
    assert r.status_code == 200, r.text
    events = parse_sse(r.text)
    done = {data["index"]: data for event, data in events if event == "done"}
    assert sorted(done) == [0, 1, 2]
    assert [done[i]["translatedText"] for i in range(3)] == whole["translatedText"]
    assert [done[i]["detectedLanguage"] for i in range(3)] == whole["detectedLanguage"]
    for i in range(3):
        pieces = "".join(data["token"]["text"] for event, data in events if event == "token" and data["index"] == i)
        assert pieces == done[i]["translatedText"]


def test_auto_detects_a_document_once_on_its_text(client: TestClient) -> None:
    """A file is one language: detected on the start of its text, and every cue goes to that language's model
    (a short cue alone would be a guess)."""
    srt = f"1\n00:00:01,000 --> 00:00:02,000\n{ES}\n\n2\n00:00:03,000 --> 00:00:04,000\nOK.\n"
    r = client.post("/translate_file", files={"file": ("carta.srt", srt.encode())}, data={"target": "pt"})
    assert r.status_code == 200, r.text
    assert r.json()["detectedLanguage"]["language"] == "es" and r.json()["detectedLanguage"]["confidence"] > 90
    assert r.json()["translatedFileUrl"].endswith(".carta_pt.srt")
    out = client.get(r.json()["translatedFileUrl"]).text
    expected = [translate(client, t, source="es", target="pt")["translatedText"] for t in (ES, "OK.")]
    assert out == (f"1\n00:00:01,000 --> 00:00:02,000\n{expected[0]}\n\n"
                   f"2\n00:00:03,000 --> 00:00:04,000\n{expected[1]}\n")
    r = client.post("/translate_file", files={"file": ("a.txt", EN.encode())}, data={"target": "de"})
    assert (r.status_code, r.json()["error_type"]) == (400, "unsupported_language")


# --- LibreTranslate's other endpoints -----------------------------------------------------------------------

def test_frontend_settings(client: TestClient) -> None:
    r = client.get("/frontend/settings")
    assert r.status_code == 200
    assert r.json() == {
        "charLimit": 2000, "frontendTimeout": 500, "apiKeys": False, "keyRequired": False, "suggestions": False,
        "filesTranslation": True,
        "supportedFilesFormat": [".txt", ".html", ".htm", ".docx", ".pptx", ".odt", ".odp", ".epub", ".srt", ".vtt",
                                 ".po", ".pot", ".xliff", ".xlf"],
        "language": {"source": {"code": "auto", "name": "Auto Detect"}, "target": {"code": "pt", "name": "Portuguese"}},
    }


def test_suggestions_are_disabled(client: TestClient) -> None:
    r = client.post("/suggest", json={"q": "Hello", "s": "Olá", "source": "en", "target": "pt"})
    assert r.status_code == 403
    assert r.json() == {"error": "Suggestions are disabled on this server.", "error_type": "forbidden"}
    assert client.get("/suggest").status_code == 405


def test_detect_needs_a_key_and_counts_against_the_rate_limit(tiny_model_dir: Path) -> None:
    config = server_settings(tiny_model_dir, scheduler_process=False, api_keys=[SecretStr("k1")],
                             rate_limit="3/minute")
    with TestClient(create_app(config)) as client:
        assert client.post("/detect", json={"q": EN}).status_code == 401
        assert client.post("/detect", json={"q": EN, "api_key": "nope"}).status_code == 403
        assert client.post("/detect", json={"q": EN, "api_key": "k1"}).json()[0]["language"] == "en"
        assert client.post("/detect", data={"q": EN, "api_key": "k1"}).status_code == 200
        assert client.post("/detect", json={"q": EN}, headers={"Authorization": "Bearer k1"}).status_code == 200
        r = client.post("/detect", json={"q": EN, "api_key": "k1"})
        assert (r.status_code, r.json()["error_type"]) == (429, "rate_limited") and r.headers["Retry-After"]
        settings = client.get("/frontend/settings").json()
        assert settings["apiKeys"] is True and settings["keyRequired"] is True


# --- a server of two languages, as shipped ------------------------------------------------------------------

DE = "Die Datei konnte nicht geöffnet werden, weil die Festplatte voll ist."


@pytest.fixture(scope="module")
def en_pt(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    dirs = [tiny_model_dir, renamed(tiny_model_dir, tmp_path_factory.mktemp("back") / "pt-en", "pt", "en")]
    with TestClient(create_app(server_settings(tiny_model_dir).model_copy(update={"models": dirs}))) as c:
        yield c


@pytest.mark.parametrize(("text", "language"), [(FR, "fr"), (DE, "de"), (ES, "es")])
def test_a_language_no_model_serves_is_named_never_translated(en_pt: TestClient, text: str, language: str) -> None:
    for target in ("pt", "en"):
        r = en_pt.post("/translate", json={"q": ["Open the file.", text], "source": "auto", "target": target})
        assert (r.status_code, r.json()["error_type"]) == (400, "unsupported_language"), r.text
        assert f"q[1]: detected language {language}" in r.json()["error"]
        assert f"into {target}; it translates from {'en' if target == 'pt' else 'pt'}" in r.json()["error"]
    assert detect(en_pt, text)[0]["language"] == language


def test_a_text_without_words_goes_to_a_served_language(en_pt: TestClient) -> None:
    """Numbers and codes (py3langid's "zxx", no linguistic content) are never refused as an unserved language."""
    texts = ["12345", "v2.0.1", " ".join(f"Open file {4}{i}." for i in range(120))]
    out = translate(en_pt, texts, source="auto", target="pt")
    assert [d["language"] for d in out["detectedLanguage"]] == ["en"] * 3
    assert "zxx" not in [d["language"] for d in detect(en_pt, "12345")]


def test_english_and_portuguese_detect_and_translate_as_before(en_pt: TestClient) -> None:
    for text, source, target in ((EN, "en", "pt"), (PT, "pt", "en")):
        named = translate(en_pt, text, source=source, target=target)["translatedText"]
        out = translate(en_pt, text, source="auto", target=target)
        assert out["translatedText"] == named and out["detectedLanguage"]["language"] == source
        assert out["detectedLanguage"]["confidence"] > 90
        for q in ("Save", "Salvar"):
            assert detect(en_pt, q)[0]["language"] == ("en" if q == "Save" else "pt")
    for fields in ({"source": "auto"}, {"source": "en"}):  # English sent to English comes back unchanged
        assert translate(en_pt, EN, target="en", **fields)["translatedText"] == EN
