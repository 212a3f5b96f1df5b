"""The HTTP contract on the tiny model: every endpoint, SSE framing, streamed == non-streamed, bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.helpers import metric, parse_sse, server_settings, stream, tags, translate


@pytest.fixture
def client(served: TestClient) -> TestClient:
    return served  # the session's shared app (conftest.py): these tests only read


def test_info_endpoints(client: TestClient) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json() == {"status": "ready", "models": ["tiny-en-pt"]}
    assert client.get("/languages").json() == [{"code": "en", "name": "English", "targets": ["pt"]}]
    (model,) = client.get("/models").json()
    assert model["name"] == "tiny-en-pt" and model["device"] == "cpu" and model["parameters"] > 0
    settings = client.get("/settings").json()
    assert settings["defaults"]["tiny-en-pt"]["max_new_tokens"] == 24
    assert settings["limits"]["max_texts"] == 8 and settings["limits"]["api_key_required"] is False
    assert client.get("/openapi.json").json()["components"]["schemas"]["TranslateRequest"]


def test_translate_shapes(client: TestClient) -> None:
    one = translate(client, "Open the file.")
    assert set(one) == {"translatedText", "detectedLanguage"} and isinstance(one["translatedText"], str)
    assert one["detectedLanguage"] == {"confidence": 100.0, "language": "en"}  # the named source, as certain
    many = translate(client, ["Open the file.", "Save all."])
    assert many["translatedText"][0] == one["translatedText"]
    auto = client.post("/translate", json={"q": "Open the file.", "source": "auto", "target": "pt"}).json()
    assert auto["translatedText"] == one["translatedText"]
    assert auto["detectedLanguage"]["language"] == "en" and auto["detectedLanguage"]["confidence"] > 90
    form = client.post("/translate", data={"q": "Open the file.", "source": "en", "target": "pt"})
    assert form.json() == one
    multipart = client.post("/translate", files={"q": (None, "Open the file."), "target": (None, "pt")})
    assert multipart.json()["translatedText"] == one["translatedText"]


def test_long_text_is_split_into_sentences_and_whitespace_kept(client: TestClient) -> None:
    sentences = ["Open the file.", "Save changes before closing!", "Click here to continue"]
    alone = translate(client, sentences)["translatedText"]
    text = f"  {sentences[0]}  {sentences[1]}\n\n\t{sentences[2]}\n"
    assert translate(client, text)["translatedText"] == f"  {alone[0]}  {alone[1]}\n\n\t{alone[2]}\n"


def test_sentences_longer_than_the_model_takes_are_split(client: TestClient) -> None:
    text = " ".join(["open the file save changes"] * 60)  # one sentence of about 300 tokens; the model takes 128
    out = client.post("/translate", json={"q": text, "target": "pt", "options": {"return_scores": True}}).json()
    assert out["details"]["input_tokens"] > 128 and len(out["details"]["scores"]) > 1
    streamed = parse_sse(client.post("/translate/stream", json={"q": text, "target": "pt"}).text)
    assert streamed[-1][1]["translatedText"] == out["translatedText"]


def test_alternatives_scores_and_options(client: TestClient) -> None:
    out = translate(client, "Open the file.", alternatives=2, options={"return_scores": True})
    assert len(out["alternatives"]) == 2
    details = out["details"]
    assert details["finish_reason"] in {"eos", "length"} and details["input_tokens"] > 0
    assert len(details["scores"]) == 1 and details["models"] == ["tiny-en-pt"]
    short = translate(client, "Open the file.", options={"max_new_tokens": 2, "return_scores": True})
    assert short["details"]["generated_tokens"] <= 2
    a = translate(client, "Open the file.", options={"do_sample": True, "seed": 7, "temperature": 1.5})
    b = translate(client, "Open the file.", options={"do_sample": True, "seed": 7, "temperature": 1.5})
    assert a == b


def test_html_keeps_markup(client: TestClient) -> None:
    plain = translate(client, "Open the file.")["translatedText"]
    out = translate(client, '<p class="x">Open the file.</p><br/>', format="html")["translatedText"]
    assert out.startswith('<p class="x">') and out.endswith("</p><br/>")
    assert out == f'<p class="x">{plain.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")}</p><br/>'


def test_sse_framing(client: TestClient) -> None:
    events = stream(client, ["Open the file.", "Save all."])
    kinds = [e for e, _ in events]
    assert set(kinds) == {"token", "done"} and kinds.count("done") == 2
    for kind, data in events:
        if kind == "token":
            assert set(data) == {"index", "token"} and set(data["token"]) == {"id", "text", "logprob"}
            assert data["token"]["text"]
        else:
            assert set(data) == {"index", "translatedText", "finish_reason", "generated_tokens", "input_tokens"}
            assert data["finish_reason"] in {"eos", "length"}
    assert kinds[-1] == "done"


CASES: dict[str, dict[str, Any]] = {
    "greedy": {},
    "beam": {"options": {"beam_size": 3}},
    "sampling": {"options": {"do_sample": True, "seed": 3, "top_p": 0.9}},
    "penalties": {"options": {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2, "min_new_tokens": 3}},
    "html": {"format": "html"},
    "inline html": {"format": "html", "options": {"beam_size": 2}},
}


@pytest.mark.parametrize("case", CASES)
def test_streamed_equals_non_streamed(client: TestClient, case: str) -> None:
    q = ["  Open the file. Save changes before closing!\n\nClick here.  ", "<b>Disk full.</b> Undo?"]
    if case == "inline html":  # elements inside sentences: placed by the alignment that the decode returns
        q = ['<p>Save <b>all</b> changes <i>before <a href="x">closing</a></i>. <img src="a.png"> Undo?</p>',
             "Open <b>the</b> file."]
    elif case != "html":
        q[1] = "Disk full. Undo?"
    expected = translate(client, q, **CASES[case])["translatedText"]
    events = stream(client, q, **CASES[case])
    for index in range(len(q)):
        pieces = "".join(d["token"]["text"] for e, d in events if e == "token" and d["index"] == index)
        (done,) = [d for e, d in events if e == "done" and d["index"] == index]
        assert pieces == done["translatedText"] == expected[index]
        if "html" in case:  # every tag once, whatever the tiny model wrote
            assert tags(done["translatedText"]) == tags(q[index])


def test_stream_get_with_query_parameters(client: TestClient) -> None:
    expected = translate(client, "Open the file.", options={"max_new_tokens": 5})["translatedText"]
    r = client.get("/translate/stream", params={"q": "Open the file.", "target": "pt", "max_new_tokens": "5"})
    assert r.status_code == 200
    events = parse_sse(r.text)
    assert events[-1][0] == "done" and events[-1][1]["translatedText"] == expected


def test_stream_refusals_keep_their_status(client: TestClient) -> None:
    r = client.post("/translate/stream", json={"q": " ", "target": "pt"})
    assert r.status_code == 400 and r.json()["error_type"] == "empty_text"
    r = client.get("/translate/stream", params={"q": "hi", "target": "pt", "beam_size": "0"})
    assert r.status_code == 422 and r.json()["error_type"] == "invalid_settings"


def test_metrics_move(client: TestClient) -> None:
    ok = 'tolk_requests_total{route="/translate",status="200"}'
    model = '{model="tiny-en-pt"}'
    names = [ok, 'tolk_request_duration_seconds_count{route="/translate"}'] + [f"tolk_{name}{model}" for name in (
        "input_tokens_total", "decode_step_seconds_count", "batch_rows_count", "time_to_first_token_seconds_count",
        "queue_duration_seconds_count")]
    before = {n: metric(client, n) for n in names}
    translate(client, "Open the file.")
    stream(client, "Save all.")
    client.post("/translate", json={"q": "", "target": "pt"})
    for n in names:
        assert metric(client, n) > before[n], n
    assert metric(client, "tolk_inter_token_latency_seconds_count") > 0
    assert metric(client, "tolk_generated_tokens_total") > 0
    assert metric(client, 'tolk_request_failures_total{error_type="empty_text"}') >= 1
    assert metric(client, 'tolk_kv_cache_bytes{model="tiny-en-pt"}') > 0
    assert metric(client, 'tolk_kv_cache_rows_used{model="tiny-en-pt"}') == 0
    assert metric(client, 'tolk_requests_running{model="tiny-en-pt"}') == 0


BAD_JSON: list[tuple[str, Any, int, str]] = [
    ("empty", {"q": ""}, 400, "empty_text"),
    ("whitespace", {"q": " \n\t "}, 400, "empty_text"),
    ("empty list", {"q": []}, 400, "empty_text"),
    ("one empty of many", {"q": ["fine", ""]}, 400, "empty_text"),
    ("huge text", {"q": "word " * 500}, 413, "payload_too_large"),
    ("too many texts", {"q": ["a"] * 9}, 413, "payload_too_large"),
    ("unknown pair", {"q": "hi", "target": "xx"}, 400, "unsupported_language"),
    ("unknown source", {"q": "hi", "source": "de"}, 400, "unsupported_language"),
    ("q number", {"q": 5}, 422, "validation_error"),
    ("q list of numbers", {"q": [1, 2]}, 422, "validation_error"),
    ("missing q", {"source": "en"}, 422, "validation_error"),
    ("unknown field", {"q": "hi", "colour": "red"}, 422, "validation_error"),
    ("bad format", {"q": "hi", "format": "pdf"}, 422, "validation_error"),
    ("options not object", {"q": "hi", "options": [1]}, 422, "validation_error"),
    ("unknown option", {"q": "hi", "options": {"beam": 2}}, 422, "validation_error"),
    ("beam string", {"q": "hi", "options": {"beam_size": "four"}}, 422, "validation_error"),
    ("beam 0", {"q": "hi", "options": {"beam_size": 0}}, 422, "invalid_settings"),
    ("beam too wide", {"q": "hi", "options": {"beam_size": 16}}, 422, "invalid_settings"),
    ("negative temperature", {"q": "hi", "options": {"do_sample": True, "temperature": -1}}, 422, "invalid_settings"),
    ("top_p above 1", {"q": "hi", "options": {"do_sample": True, "top_p": 1.5}}, 422, "invalid_settings"),
    ("absurd length", {"q": "hi", "options": {"max_new_tokens": 10**9}}, 422, "invalid_settings"),
    ("over the server limit", {"q": "hi", "options": {"max_new_tokens": 600}}, 422, "invalid_settings"),
    ("min over max", {"q": "hi", "options": {"min_new_tokens": 30, "max_new_tokens": 5}}, 422, "invalid_settings"),
    ("sampling with beams", {"q": "hi", "options": {"do_sample": True, "beam_size": 2}}, 422, "invalid_settings"),
    ("temperature that overflows", {"q": "hi", "options": {"do_sample": True, "temperature": 1e-308}}, 422,
     "invalid_settings"),
    ("repetition penalty that overflows", {"q": "hi", "options": {"repetition_penalty": 1e-308}}, 422,
     "invalid_settings"),
    ("negative alternatives", {"q": "hi", "alternatives": -1}, 422, "validation_error"),
    ("too many alternatives", {"q": "hi", "alternatives": 9}, 422, "invalid_settings"),
    ("control character", {"q": "hi\x00there"}, 400, "invalid_text"),
]


@pytest.mark.parametrize(("body", "status", "error_type"), [c[1:] for c in BAD_JSON], ids=[c[0] for c in BAD_JSON])
def test_bad_json_input(client: TestClient, body: dict[str, Any], status: int, error_type: str) -> None:
    r = client.post("/translate", json={"target": "pt", **body})
    assert (r.status_code, r.json()["error_type"]) == (status, error_type), r.text
    assert set(r.json()) == {"error", "error_type"} and r.json()["error"]
    assert "Traceback" not in r.text


BAD_BODIES: list[tuple[str, bytes, str, int, str]] = [
    ("not utf-8", b'{"q": "caf\xe9", "target": "pt"}', "application/json", 400, "invalid_encoding"),
    ("not json", b'{"q": "hi",', "application/json", 400, "invalid_json"),
    ("lone surrogate escape", b'{"q": "a\\ud800b", "target": "pt"}', "application/json", 400, "invalid_text"),
    ("json array", b'["hi"]', "application/json", 422, "validation_error"),
    ("form not utf-8", b"q=caf%E9&target=pt", "application/x-www-form-urlencoded", 400, "invalid_encoding"),
    ("form bad options", b"q=hi&target=pt&options=%7B", "application/x-www-form-urlencoded", 400, "invalid_json"),
    ("too large", b'{"q": "' + b"a" * 70000 + b'"}', "application/json", 413, "payload_too_large"),
]


@pytest.mark.parametrize(("body", "content_type", "status", "error_type"), [c[1:] for c in BAD_BODIES],
                         ids=[c[0] for c in BAD_BODIES])
def test_bad_bodies(client: TestClient, body: bytes, content_type: str, status: int, error_type: str) -> None:
    r = client.post("/translate", content=body, headers={"content-type": content_type})
    assert (r.status_code, r.json()["error_type"]) == (status, error_type), r.text


def test_other_errors_have_the_error_body(client: TestClient) -> None:
    r = client.get("/nowhere")
    assert (r.status_code, r.json()["error_type"]) == (404, "not_found")
    r = client.delete("/translate")
    assert (r.status_code, r.json()["error_type"]) == (405, "method_not_allowed")


@pytest.mark.parametrize("q", ["Open the file.", ["Save it. Close the window.", "x"]])
def test_alternatives_differ_from_each_other_and_from_the_translation(client: TestClient, q: str | list[str]) -> None:
    """At most as many as asked, none twice, none the translation itself (fewer when the beam has no more)."""
    for alternatives in (1, 4):
        out = translate(client, q, alternatives=alternatives)
        texts = [out["translatedText"]] if isinstance(q, str) else out["translatedText"]
        lists = [out["alternatives"]] if isinstance(q, str) else out["alternatives"]
        for text, others in zip(texts, lists, strict=True):
            assert len(others) <= alternatives and len(set(others)) == len(others) and text not in others
        assert any(lists), "the beam found some other translation"
        r = client.post("/translate/stream", json={"q": q, "source": "en", "target": "pt",
                                                   "alternatives": alternatives})
        done = [d for e, d in parse_sse(r.text) if e == "done"]
        assert [d["alternatives"] for d in sorted(done, key=lambda d: d["index"])] == lists


def test_still_serving_after_bad_input(client: TestClient) -> None:
    assert translate(client, "Open the file.")["translatedText"]
    assert client.get("/ready").status_code == 200


def test_not_ready_before_startup(tiny_model_dir: Path) -> None:
    app = create_app(server_settings(tiny_model_dir))
    c = TestClient(app)  # no `with`: the lifespan has not run, so nothing is loaded
    r = c.get("/ready")
    assert (r.status_code, r.json()["error_type"]) == (503, "not_ready")
    r = c.post("/translate", json={"q": "hi", "target": "pt"})
    assert r.status_code == 503
    assert c.get("/health").status_code == 200
