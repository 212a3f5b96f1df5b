"""Glossaries: matching, the DeepL-shaped API kept in SQLite, their terms in translations (child-process batcher)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from model import checkpoint
from server.app import create_app
from server.errors import InvalidRequest
from server.glossaries import Glossary, GlossaryInfo, GlossaryLimit, parse_entries, target_ids
from tests.helpers import parse_sse, server_settings

ENTRIES = "file\tarquivo\nsettings window\tjanela de configurações\nsave\tsalvar\n"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def client(tiny_model_dir: Path, data_dir: Path) -> Iterator[TestClient]:
    settings = server_settings(tiny_model_dir, data_dir=data_dir, max_glossary_entries=5, max_glossaries=4,
                               max_glossary_term_chars=40, scheduler_process=True)  # terms cross to the child
    with TestClient(create_app(settings)) as c:
        yield c


def create(client: TestClient, entries: str = ENTRIES, **fields: Any) -> Any:
    body = {"name": "UI", "source_lang": "en", "target_lang": "pt", "entries": entries, "entries_format": "tsv",
            **fields}
    return client.post("/glossaries", json=body)


def has(text: str, term: str) -> bool:
    """The term as the glossary gives it, or with a capital first letter (it may begin the sentence)."""
    return term in text or term[0].upper() + term[1:] in text


def translate(client: TestClient, q: str | list[str], **fields: Any) -> Any:
    r = client.post("/translate", json={"q": q, "source": "en", "target": "pt", **fields})
    assert r.status_code == 200, r.text
    return r.json()["translatedText"]


def test_matching_takes_the_longest_whole_words_case_aside() -> None:
    info = GlossaryInfo("g", "UI", "en", "pt", "2026-01-01T00:00:00.000Z", 4)
    g = Glossary(info, [("file", "arquivo"), ("file name", "nome do arquivo"), ("Drive", "Drive"), ("C++", "C++")])
    assert g.match("Rename the FILE NAME.") == ["nome do arquivo"]
    assert g.match("Open the file, then the file name") == ["arquivo", "nome do arquivo"]
    assert g.match("Profile files on drive") == ["Drive"]  # not inside "Profile", not "files"
    assert g.match("Learn C++ today") == ["C++"]
    assert g.match("file file") == ["arquivo"]  # each target once


def test_a_lowercase_term_may_begin_a_sentence_with_a_capital(tiny_loaded: checkpoint.LoadedModel) -> None:
    tok = tiny_loaded.tokenizer
    info = GlossaryInfo("g", "UI", "en", "pt", "2026-01-01T00:00:00.000Z", 2)
    g = Glossary(info, [("file", "arquivo"), ("drive", "Drive")])
    assert g.constraints("Open the file on the drive.", tok) == [
        [target_ids(tok, "arquivo"), target_ids(tok, "Arquivo")], [target_ids(tok, "Drive")]]
    assert tok.eos_id not in target_ids(tok, "arquivo") and tok.decode(target_ids(tok, "arquivo")) == "arquivo"


def test_nothing_inside_a_placeholder_is_a_term() -> None:
    info = GlossaryInfo("g", "UI", "en", "pt", "2026-01-01T00:00:00.000Z", 2)
    g = Glossary(info, [("index", "índice"), ("total", "total")])
    assert g.match("Match { $index } of %(total)s, index") == ["índice"]
    assert g.match("Match { $index } of { $total }") == []


def test_terms_know_the_source_tokens_they_translate(tiny_loaded: checkpoint.LoadedModel) -> None:
    tok = tiny_loaded.tokenizer
    info = GlossaryInfo("g", "UI", "en", "pt", "2026-01-01T00:00:00.000Z", 2)
    g = Glossary(info, [("settings window", "janela de configurações"), ("file", "arquivo")])
    sentence = "Save the file before closing the settings window."
    ids = tok.encode(sentence)
    terms, where = g.placed(sentence, tok, ids)
    assert terms == g.constraints(sentence, tok) and where is not None
    pieces = tok.source_pieces(ids)
    assert "".join(pieces[i] for i in where[0]).replace("\u2581", " ").strip() == "file"
    # a term's whitespace-separated words, with what clings to them
    assert "".join(pieces[i] for i in where[1]).replace("\u2581", " ").strip() == "settings window."


def test_entries_are_checked_with_clear_messages() -> None:
    assert parse_entries('"a, b",x\nc,"d ""e"""\n', "csv", 10, 40) == [("a, b", "x"), ("c", 'd "e"')]
    assert parse_entries("a\tb\n\n", "tsv", 10, 40) == [("a", "b")]
    cases = [("a\tb\n", "xml", "entries_format"), ("a\tb\nA\tc\n", "tsv", "repeats the source term of line 1"),
             ("a\t \n", "tsv", "empty term"), ("a\tb\tc\n", "tsv", "2 fields"), ("", "tsv", "at least one entry")]
    for text, fmt, message in cases:
        with pytest.raises(InvalidRequest, match=message):
            parse_entries(text, fmt, 10, 40)
    with pytest.raises(GlossaryLimit, match="at most 1"):
        parse_entries("a\tb\nc\td\n", "tsv", 1, 40)
    with pytest.raises(GlossaryLimit, match="over 3 characters"):
        parse_entries("abcd\tb\n", "tsv", 10, 3)


def test_create_list_read_and_delete(client: TestClient) -> None:
    r = create(client)
    assert r.status_code == 201, r.text
    info = r.json()
    assert info["name"] == "UI" and info["source_lang"] == "en" and info["target_lang"] == "pt"
    assert info["entry_count"] == 3 and info["ready"] is True and info["creation_time"].endswith("Z")
    gid = info["glossary_id"]
    assert client.get(f"/glossaries/{gid}").json() == info
    assert info in client.get("/glossaries").json()["glossaries"]
    entries = client.get(f"/glossaries/{gid}/entries")
    assert entries.headers["content-type"].startswith("text/tab-separated-values")
    assert entries.text == ENTRIES
    form = client.post("/glossaries", data={"name": "csv", "source_lang": "EN", "target_lang": "pt-BR",
                                            "entries": "folder,pasta\n", "entries_format": "csv"})
    assert form.status_code == 201 and form.json()["target_lang"] == "pt-BR"
    for g in (gid, form.json()["glossary_id"]):
        assert client.delete(f"/glossaries/{g}").status_code == 204
        assert client.get(f"/glossaries/{g}").status_code == 404
        assert client.delete(f"/glossaries/{g}").status_code == 404


def test_bad_glossaries_are_refused(client: TestClient) -> None:
    def error(r: Any) -> tuple[int, str]:
        return r.status_code, r.json()["error_type"]

    assert error(create(client, entries_format="xlsx")) == (400, "invalid_request")
    assert error(create(client, entries="file\ta\nFile\tb\n")) == (400, "invalid_request")
    assert error(create(client, entries="file\t\n")) == (400, "invalid_request")
    assert error(create(client, target_lang="de")) == (400, "unsupported_language")
    assert error(create(client, entries="".join(f"w{i}\tp{i}\n" for i in range(6)))) == (413, "glossary_limit")
    assert error(create(client, entries="x" * 41 + "\ty\n")) == (413, "glossary_limit")
    assert error(create(client, name=" ")) == (400, "invalid_request")
    assert create(client, entries=None).status_code == 422
    made = [create(client).json()["glossary_id"] for _ in range(4)]
    assert error(create(client)) == (413, "glossary_limit")  # the server keeps 4
    for g in made:
        client.delete(f"/glossaries/{g}")
    r = client.post("/translate", json={"q": "Open the file.", "target": "pt", "glossary_id": "nope"})
    assert error(r) == (404, "not_found")


def test_terms_appear_in_translations_and_other_sentences_are_untouched(client: TestClient) -> None:
    gid = create(client).json()["glossary_id"]
    try:
        texts = ["Open the file.", "Save changes before closing the settings window.", "Click here to continue."]
        plain = translate(client, texts)
        for options in ({}, {"beam_size": 4}):
            out = translate(client, texts, glossary_id=gid, options=options)
            assert has(out[0], "arquivo")
            assert has(out[1], "janela de configurações") and has(out[1], "salvar")
            assert out[2] == translate(client, texts[2], options=options)  # no term: as without a glossary
            assert out[2] == plain[2] or options
        auto = client.post("/translate", json={"q": texts[0], "source": "auto", "target": "pt", "glossary_id": gid})
        assert auto.json()["translatedText"] == translate(client, texts[0], glossary_id=gid)
    finally:
        client.delete(f"/glossaries/{gid}")


def test_streamed_equals_not_streamed_with_a_glossary(client: TestClient) -> None:
    gid = create(client).json()["glossary_id"]
    try:
        texts = ["Open the file.", "Save changes before closing the settings window.\nSave all."]
        whole = translate(client, texts, glossary_id=gid)
        r = client.post("/translate/stream", json={"q": texts, "source": "en", "target": "pt", "glossary_id": gid})
        events = parse_sse(r.text)
        done = {d["index"]: d["translatedText"] for e, d in events if e == "done"}
        pieces = ["".join(d["token"]["text"] for e, d in events if e == "token" and d["index"] == i) for i in (0, 1)]
        assert [done[0], done[1]] == whole == pieces
    finally:
        client.delete(f"/glossaries/{gid}")


def test_glossaries_outlive_a_restart(tiny_model_dir: Path, tmp_path: Path) -> None:
    settings = server_settings(tiny_model_dir, data_dir=tmp_path)
    with TestClient(create_app(settings)) as c:
        info = create(c).json()
        translated = translate(c, "Open the file.", glossary_id=info["glossary_id"])
    with TestClient(create_app(settings)) as c:
        assert c.get("/glossaries").json() == {"glossaries": [info]}
        assert c.get(f"/glossaries/{info['glossary_id']}/entries").text == ENTRIES
        assert translate(c, "Open the file.", glossary_id=info["glossary_id"]) == translated


def test_each_api_key_sees_its_own_glossaries(tiny_model_dir: Path, tmp_path: Path) -> None:
    settings = server_settings(tiny_model_dir, data_dir=tmp_path, api_keys=["alpha", "beta"],
                               scheduler_process=False)
    with TestClient(create_app(settings)) as c:
        alpha, beta = ({"Authorization": f"Bearer {k}"} for k in ("alpha", "beta"))
        assert create(c).status_code == 401
        gid = c.post("/glossaries", headers=alpha, json={"name": "a", "source_lang": "en", "target_lang": "pt",
                                                         "entries": ENTRIES}).json()["glossary_id"]
        assert c.get("/glossaries", headers=beta).json() == {"glossaries": []}
        assert c.get(f"/glossaries/{gid}", headers=beta).status_code == 404
        assert c.get(f"/glossaries/{gid}?api_key=alpha").status_code == 200
        r = c.post("/translate", headers=beta, json={"q": "Open the file.", "target": "pt", "glossary_id": gid})
        assert r.status_code == 404
        r = c.post("/translate", json={"q": "Open the file.", "target": "pt", "glossary_id": gid, "api_key": "alpha"})
        assert r.status_code == 200 and has(r.json()["translatedText"], "arquivo")
        assert c.delete(f"/glossaries/{gid}", headers=beta).status_code == 404
        assert c.delete(f"/glossaries/{gid}", headers=alpha).status_code == 204


def test_files_are_translated_with_a_glossary(client: TestClient) -> None:
    gid = create(client).json()["glossary_id"]
    try:
        text = "Open the file.\n\nClick here to continue.\n"
        fields = {"source": "en", "target": "pt"}
        answers = []
        for extra in ({}, {"glossary_id": gid}):
            r = client.post("/translate_file", files={"file": ("ui.txt", text.encode())}, data={**fields, **extra})
            assert r.status_code == 200, r.text
            answers.append(client.get(r.json()["translatedFileUrl"]).text.split("\n\n"))
        plain, forced = answers
        assert has(forced[0], "arquivo") and forced[1] == plain[1]
        r = client.post("/translate_file", files={"file": ("ui.txt", text.encode())},
                        data={**fields, "glossary_id": "nope"})
        assert r.status_code == 404
    finally:
        client.delete(f"/glossaries/{gid}")
