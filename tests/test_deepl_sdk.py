"""DeepL's own Python SDK (the `deepl` package, unchanged) drives a Tolk server started here, through every call a
DeepL client makes: texts, languages, usage, v2 and v3 glossaries, tags, a .docx document, and the SDK's exceptions.

Each answer is checked against the same request through LibreTranslate's /translate on the same server: one
engine, so the same texts must give the same translations. Two tiny models (en -> pt and pt -> en) let the regional
targets of both directions (`PT-BR`, `EN-US`) be asked for.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import deepl
import docx
import httpx
import pytest
from deepl.api_data import MultilingualGlossaryDictionaryEntries

from server.app import create_app
from tests.helpers import make_docx, relabelled, server_settings
from tests.live import live_server

pytestmark = pytest.mark.slow  # parity with a peer's SDK on a live server

KEY = "sdk-key"
TEXTS = ["Open the file.", "Save changes before closing the window."]


@pytest.fixture(scope="module")
def url(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    reverse = relabelled(tiny_model_dir, tmp_path_factory.mktemp("reverse"), "pt", "en")
    settings = server_settings(tiny_model_dir, api_keys=[KEY], scheduler_process=True)
    settings = settings.model_copy(update={"models": [tiny_model_dir, reverse]})
    with live_server(create_app(settings)) as base:
        yield base


@pytest.fixture(scope="module")
def sdk(url: str) -> deepl.DeepLClient:
    return deepl.DeepLClient(KEY, server_url=url, send_platform_info=False)


def libre(url: str, q: str | list[str], source: str = "en", target: str = "pt", **fields: Any) -> Any:
    """The same texts through LibreTranslate's /translate."""
    r = httpx.post(f"{url}/translate", json={"q": q, "source": source, "target": target, **fields},
                   headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["translatedText"]


def test_one_text_a_list_auto_source_and_regional_targets(sdk: deepl.DeepLClient, url: str) -> None:
    one = sdk.translate_text(TEXTS[0], target_lang="PT-BR")
    assert isinstance(one, deepl.TextResult)
    assert one.text == libre(url, TEXTS[0]) and one.detected_source_lang == "EN"
    assert one.billed_characters == len(TEXTS[0])
    many = sdk.translate_text(TEXTS, source_lang="EN", target_lang="PT-PT")
    assert [r.text for r in many] == libre(url, TEXTS) and [r.billed_characters for r in many] == list(map(len, TEXTS))
    same = sdk.translate_text(TEXTS[0], target_lang="EN-US")  # English into English comes back as it is
    assert same.text == TEXTS[0] and same.detected_source_lang == "EN"
    back = sdk.translate_text(TEXTS[0], source_lang="PT", target_lang="EN-GB")  # named: the pt -> en model reads it
    assert back.text == libre(url, TEXTS[0], "pt", "en") and back.detected_source_lang == "PT"


def test_languages_and_glossary_pairs(sdk: deepl.DeepLClient) -> None:
    assert {(lang.code, lang.name) for lang in sdk.get_source_languages()} == {("EN", "English"),
                                                                               ("PT", "Portuguese")}
    targets = sdk.get_target_languages()
    assert {lang.code for lang in targets} == {"EN-GB", "EN-US", "PT-BR", "PT-PT"}
    assert all(lang.supports_formality is False for lang in targets)
    assert {(p.source_lang, p.target_lang) for p in sdk.get_glossary_languages()} == {("en", "pt"), ("pt", "en")}


def test_usage_counts_the_characters_translated(sdk: deepl.DeepLClient) -> None:
    before = sdk.get_usage()
    assert before.character.valid and not before.any_limit_reached
    sdk.translate_text(TEXTS, target_lang="PT-BR")
    assert sdk.get_usage().character.count == before.character.count + sum(map(len, TEXTS))


def test_v2_glossary_create_list_entries_translate_delete(sdk: deepl.DeepLClient, url: str) -> None:
    entries = {"file": "arquivo", "window": "janela"}
    info = sdk.create_glossary("UI terms", "EN", "PT", entries)
    assert info.ready and info.entry_count == 2 and (info.source_lang, info.target_lang) == ("EN", "PT")
    assert isinstance(info.creation_time, datetime) and info.creation_time.tzinfo is not None
    assert info.glossary_id in {g.glossary_id for g in sdk.list_glossaries()}
    assert sdk.get_glossary(info.glossary_id).name == "UI terms"
    assert sdk.get_glossary_entries(info) == entries
    used = sdk.translate_text(TEXTS, source_lang="EN", target_lang="PT-BR", glossary=info)
    assert [r.text for r in used] == libre(url, TEXTS, glossary_id=info.glossary_id)
    assert "arquivo" in used[0].text.lower()  # the term the glossary forces
    sdk.delete_glossary(info)
    with pytest.raises(deepl.GlossaryNotFoundException):
        sdk.get_glossary(info.glossary_id)


def test_v3_multilingual_glossary(sdk: deepl.DeepLClient, url: str) -> None:
    info = sdk.create_multilingual_glossary("Both ways", [
        MultilingualGlossaryDictionaryEntries("EN", "PT", {"file": "arquivo"}),
        MultilingualGlossaryDictionaryEntries("PT", "EN", {"arquivo": "file"})])
    assert info.name == "Both ways" and info.creation_time.tzinfo is not None
    assert {(d.source_lang, d.target_lang, d.entry_count) for d in info.dictionaries} == {("EN", "PT", 1),
                                                                                       ("PT", "EN", 1)}
    assert sdk.update_multilingual_glossary_name(info, "Renamed").name == "Renamed"
    merged = sdk.update_multilingual_glossary_dictionary(
        info, MultilingualGlossaryDictionaryEntries("EN", "PT", {"window": "janela"}))
    assert {d.entry_count for d in merged.dictionaries if d.source_lang == "EN"} == {2}
    tsv = sdk.get_multilingual_glossary_entries(info, "EN", "PT").dictionaries[0].entries  # as DeepL sends it
    entries = deepl.convert_tsv_to_dict(tsv)
    assert entries == {"file": "arquivo", "window": "janela"}
    used = sdk.translate_text(TEXTS, source_lang="EN", target_lang="PT-BR", glossary=info.glossary_id)
    v2 = sdk.create_glossary("same entries", "EN", "PT", entries)  # one engine: the same terms, the same text
    assert [r.text for r in used] == libre(url, TEXTS, glossary_id=v2.glossary_id)
    sdk.delete_glossary(v2)
    replaced = sdk.replace_multilingual_glossary_dictionary(
        info, MultilingualGlossaryDictionaryEntries("EN", "PT", {"disk": "disco"}))
    assert replaced.entry_count == 1
    assert info.glossary_id in {g.glossary_id for g in sdk.list_multilingual_glossaries()}
    sdk.delete_multilingual_glossary_dictionary(info, source_lang="PT", target_lang="EN")
    assert len(sdk.get_multilingual_glossary(info.glossary_id).dictionaries) == 1
    sdk.delete_multilingual_glossary(info)
    with pytest.raises(deepl.GlossaryNotFoundException):
        sdk.get_multilingual_glossary(info.glossary_id)


def test_tag_handling_html_and_xml(sdk: deepl.DeepLClient, url: str) -> None:
    page = "<p>Open the <b>file</b> before closing.</p>"
    html = sdk.translate_text(page, target_lang="PT-BR", tag_handling="html")
    assert html.text == libre(url, page, format="html")
    weblate = 'Open the <x id="1"></x> file and <x id="2"></x> save it.'
    xml = sdk.translate_text(weblate, source_lang="EN", target_lang="PT-BR", tag_handling="xml", ignore_tags="x")
    assert xml.text.count('<x id="1"></x>') == 1 and xml.text.count('<x id="2"></x>') == 1
    assert xml.text.count("<x") == 2


def test_translate_document_docx(sdk: deepl.DeepLClient, url: str, tmp_path: Path) -> None:
    source, out = tmp_path / "report.docx", tmp_path / "report-pt.docx"
    source.write_bytes(make_docx())
    status = sdk.translate_document_from_filepath(source, out, target_lang="PT-BR")
    assert status.done and status.billed_characters and status.billed_characters > 0
    r = httpx.post(f"{url}/translate_file", files={"file": ("report.docx", make_docx())},
                   data={"source": "en", "target": "pt", "api_key": KEY}, timeout=60)
    assert r.status_code == 200, r.text
    reference = docx.Document(io.BytesIO(httpx.get(r.json()["translatedFileUrl"]).content))
    translated = docx.Document(str(out))
    assert [p.text for p in translated.paragraphs] == [p.text for p in reference.paragraphs]
    assert [p.text for p in translated.paragraphs] != [p.text for p in docx.Document(str(source)).paragraphs]


def test_exceptions_for_a_bad_key_and_an_unknown_glossary(url: str) -> None:
    with pytest.raises(deepl.AuthorizationException):
        deepl.DeepLClient("not-the-key", server_url=url).translate_text(TEXTS[0], target_lang="PT-BR")
    sdk = deepl.DeepLClient(KEY, server_url=url)
    with pytest.raises(deepl.GlossaryNotFoundException):
        sdk.get_glossary("no-such-glossary")
    with pytest.raises(deepl.DeepLException, match="Not found.*no glossary") as caught:
        sdk.translate_text(TEXTS[0], source_lang="EN", target_lang="PT-BR", glossary="no-such-glossary")
    assert caught.value.http_status_code == 404


def test_exceptions_for_overload_and_a_used_up_quota(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys of a server with a rate limit (429: the SDK's overload) and a monthly character limit (456)."""
    monkeypatch.setattr(deepl.http_client, "max_network_retries", 0)  # the SDK retries a 429 with backoff
    settings = server_settings(tiny_model_dir, scheduler_process=False, api_keys=["a", "b"], rate_limit="2/minute",
                               character_limit=len(TEXTS[1]))
    with live_server(create_app(settings)) as base:
        busy, spender = deepl.DeepLClient("a", server_url=base), deepl.DeepLClient("b", server_url=base)
        busy.translate_text("Save.", target_lang="PT-BR")
        busy.translate_text("Save.", target_lang="PT-BR")
        with pytest.raises(deepl.TooManyRequestsException):
            busy.translate_text("Save.", target_lang="PT-BR")
        spender.translate_text(TEXTS[1], target_lang="PT-BR")
        assert spender.get_usage().character.limit_reached
        with pytest.raises(deepl.QuotaExceededException):
            spender.translate_text("Save.", target_lang="PT-BR")
        assert busy.get_usage().character.count == 2 * len("Save.")  # each key counts its own
