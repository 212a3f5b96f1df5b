"""Localisation files through POST /translate_file on the tiny model: gettext .po/.pot and XLIFF 1.2 / 2.0.

The tiny model's translations are junk; what is checked is the file: which messages are translated, plural forms,
flags, placeholders kept, `msgfmt -c` passing (skipped, saying why, where gettext is not installed), XLIFF targets
and states written with sources untouched, and hostile XML refused.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import polib
import pytest
from fastapi.testclient import TestClient
from lxml import etree

from server.app import create_app
from server.documents.gettext import put_accelerator, strip_accelerator
from server.documents.xliff import XLIFF_12, XLIFF_20
from tests.helpers import kept, relabelled, server_settings, translate_file, upload

PO_MEDIA = "text/x-gettext-translation; charset=utf-8"
XLIFF_MEDIA = "application/xliff+xml"

PO = r'''# Translation of Tolk's test catalog.
msgid ""
msgstr ""
"Project-Id-Version: tolk-test 1.0\n"
"Language: pt\n"
"MIME-Version: 1.0\n"
"Content-Type: text/plain; charset=UTF-8\n"
"Content-Transfer-Encoding: 8bit\n"

#: src/main.c:10
#, c-format
msgid "Could not open %s: %d bytes left"
msgstr ""

#, c-format
msgid "%d file could not be saved"
msgid_plural "%d files could not be saved"
msgstr[0] ""
msgstr[1] ""

#, python-format
msgid "Hello %(name)s, click here to continue"
msgstr ""

msgctxt "menu"
msgid "_Open the file"
msgstr ""

msgid "Save changes before closing"
msgstr "Salvar alterações antes de fechar"

#, fuzzy
msgid "Select all"
msgstr "Selecionar tudo"

msgid ""
"Error while reading\n"
"the disk\n"
msgstr ""

#~ msgid "Copy"
#~ msgstr "Copiar"
'''

POT = PO.replace('"Language: pt\\n"\n', "").replace("charset=UTF-8", "charset=CHARSET")

MSGFMT = shutil.which("msgfmt")
needs_msgfmt = pytest.mark.skipif(MSGFMT is None, reason="msgfmt (GNU gettext) is not installed: apt install gettext")


@pytest.fixture
def client(served: TestClient) -> TestClient:
    return served  # the session's shared app (conftest.py): these tests only read


def translated_po(client: TestClient, name: str, text: str) -> polib.POFile:
    out = translate_file(client, name, text.encode(), PO_MEDIA)
    return polib.pofile(out.decode())


def test_po_translates_untranslated_messages_only(client: TestClient) -> None:
    po = translated_po(client, "app.po", PO)
    source = polib.pofile(PO)
    by_id = {(e.msgctxt, e.msgid): e for e in po}
    for before in source:
        after = by_id[(before.msgctxt, before.msgid)]
        assert after.msgid_plural == before.msgid_plural and after.occurrences == before.occurrences
        assert set(before.flags) <= set(after.flags)
        if before.msgstr or before.obsolete:  # translated (fuzzy too) and obsolete messages are kept as they were
            assert (after.msgstr, after.flags, after.obsolete) == (before.msgstr, before.flags, before.obsolete)
        else:
            assert "fuzzy" in after.flags
    assert len(po.obsolete_entries()) == 1
    assert po.metadata["Plural-Forms"] == "nplurals=2; plural=(n != 1);"
    plural = by_id[(None, "%d file could not be saved")]
    assert sorted(plural.msgstr_plural) == [0, 1] and all(plural.msgstr_plural.values())
    for e in po:
        if e.msgid_plural:
            assert kept(e.msgid, e.msgstr_plural[0]) and kept(e.msgid_plural, e.msgstr_plural[1])
        elif e.msgstr and not e.obsolete:
            assert kept(e.msgid, e.msgstr), (e.msgid, e.msgstr)
    multiline = by_id[(None, "Error while reading\nthe disk\n")]
    assert multiline.msgstr.endswith("\n") and "\n" in multiline.msgstr[:-1]
    assert by_id[("menu", "_Open the file")].msgstr.count("_") == 1


def test_pot_gets_plural_forms_and_charset(client: TestClient) -> None:
    po = translated_po(client, "app.pot", POT)
    assert po.metadata["Content-Type"] == "text/plain; charset=UTF-8"
    assert po.metadata["Plural-Forms"] == "nplurals=2; plural=(n != 1);"
    assert po.metadata["Language"] == "pt"  # a template becomes a catalog of the language translated into


def test_a_catalog_without_language_takes_the_plural_forms_of_the_target(tiny_model_dir: Path,
                                                                         tmp_path: Path) -> None:
    """The target language of the request (here the model's ja, asked as ja-JP) decides the plural forms and the
    Language header when the catalog names none."""
    japanese = relabelled(tiny_model_dir, tmp_path, "en", "ja")
    with TestClient(create_app(server_settings(japanese))) as c:
        r = c.get(upload(c, "app.pot", POT.encode(), target="ja-JP")["translatedFileUrl"])
    assert r.status_code == 200, r.text
    po = polib.pofile(r.content.decode())
    assert po.metadata["Language"] == "ja" and po.metadata["Plural-Forms"] == "nplurals=1; plural=0;"
    assert all(len(e.msgstr_plural) == 1 for e in po if e.msgid_plural)


def test_po_plural_forms_follow_the_language(client: TestClient) -> None:
    ja = translated_po(client, "ja.po", PO.replace("Language: pt", "Language: ja"))
    plural = next(e for e in ja if e.msgid_plural)
    assert list(plural.msgstr_plural) == [0] and ja.metadata["Plural-Forms"] == "nplurals=1; plural=0;"
    ru = translated_po(client, "ru.po", PO.replace("Language: pt", "Language: ru"))
    assert sorted(next(e for e in ru if e.msgid_plural).msgstr_plural) == [0, 1, 2]


@needs_msgfmt
@pytest.mark.parametrize("name", ["app.po", "app.pot", "ja.po"])
def test_translated_po_passes_msgfmt_check(client: TestClient, tmp_path: Path, name: str) -> None:
    text = {"app.po": PO, "app.pot": POT, "ja.po": PO.replace("Language: pt", "Language: ja")}[name]
    path = tmp_path / name
    path.write_bytes(translate_file(client, name, text.encode(), PO_MEDIA))
    for fuzzy in ([], ["--use-fuzzy"]):  # machine translations are fuzzy: checked only with --use-fuzzy
        r = subprocess.run([str(MSGFMT), "-c", *fuzzy, "-o", str(tmp_path / "out.mo"), str(path)],
                           capture_output=True, text=True, check=False)
        assert r.returncode == 0, r.stderr


def test_fully_translated_po_has_nothing_to_translate(client: TestClient) -> None:
    done = polib.pofile(PO)
    for e in done:
        e.msgstr = e.msgstr or "x"
        if e.msgid_plural:
            e.msgstr_plural = {0: "x", 1: "y"}
    r = client.post("/translate_file", files={"file": ("done.po", str(done).encode())},
                    data={"source": "en", "target": "pt"})
    assert (r.status_code, r.json()["error_type"]) == (400, "empty_text")


@pytest.mark.parametrize(("text", "stripped", "marker"), [
    ("_File", "File", "_"), ("Save &As", "Save As", "&"), ("Tom &amp; Jerry", "Tom &amp; Jerry", None),
    ("R&D and my_var", "R&D and my_var", None), ("_One _Two", "_One _Two", None),
])
def test_accelerators(text: str, stripped: str, marker: str | None) -> None:
    out, acc = strip_accelerator(text)
    assert out == stripped and (acc.marker if acc else None) == marker
    if acc is not None:
        assert put_accelerator("Salvar como", acc).count(marker or "") == 1
    assert put_accelerator("Arquivo", strip_accelerator("_File")[1]) == "_Arquivo"
    assert put_accelerator("Salvar como", strip_accelerator("Save &As")[1]) == "S&alvar como"  # the same key


XLIFF12 = f'''<?xml version="1.0" encoding="UTF-8"?>
<xliff version="1.2" xmlns="{XLIFF_12}">
  <file source-language="en" target-language="pt" datatype="plaintext" original="app">
    <body>
      <trans-unit id="1">
        <source>Open the file %s now</source>
      </trans-unit>
      <trans-unit id="2">
        <source>Click <g id="b1">here</g> to continue<x id="br"/> please</source>
        <target/>
      </trans-unit>
      <trans-unit id="3">
        <source>Save changes</source>
        <target state="final">Salvar alterações</target>
      </trans-unit>
      <trans-unit id="4" translate="no">
        <source>Tolk</source>
      </trans-unit>
      <group id="g"><trans-unit id="5"><source>Select <ph id="p">&lt;b&gt;</ph>all</source></trans-unit></group>
    </body>
  </file>
</xliff>
'''

XLIFF20 = f'''<?xml version="1.0" encoding="UTF-8"?>
<xliff version="2.0" xmlns="{XLIFF_20}" srcLang="en" trgLang="pt">
  <file id="f1">
    <unit id="1">
      <segment>
        <source>Open the file {{0}} now</source>
      </segment>
      <segment state="final">
        <source>Save changes</source>
        <target>Salvar alterações</target>
      </segment>
    </unit>
    <unit id="2">
      <segment>
        <source>Click <pc id="1">here</pc> to <ph id="2"/>continue</source>
      </segment>
    </unit>
    <unit id="3" translate="no">
      <segment><source>Tolk</source></segment>
    </unit>
  </file>
</xliff>
'''


def xml(data: bytes) -> etree._Element:
    return etree.fromstring(data)


def test_xliff_12_targets(client: TestClient) -> None:
    out = translate_file(client, "app.xlf", XLIFF12.encode(), XLIFF_MEDIA)
    before, after = xml(XLIFF12.encode()), xml(out)
    ns = {"x": XLIFF_12}
    sources = [etree.tostring(s, with_tail=False) for s in before.iterfind(".//x:source", ns)]
    assert [etree.tostring(s, with_tail=False) for s in after.iterfind(".//x:source", ns)] == sources
    units = {u.get("id"): u for u in after.iterfind(".//x:trans-unit", ns)}
    for uid in ("1", "2", "5"):
        target = units[uid].find("x:target", ns)
        assert target is not None and "".join(target.itertext()).strip(), uid
        assert (target.get("state"), target.get("state-qualifier")) == ("needs-review-translation", "leveraged-mt")
    assert "%s" in "".join(units["1"].find("x:target", ns).itertext())
    inline = units["2"].find("x:target", ns)
    assert sorted((c.tag.split("}")[1], c.get("id")) for c in inline.iter() if c is not inline) == [
        ("g", "b1"), ("x", "br")]
    ph = units["5"].find("x:target/x:ph", ns)
    assert ph is not None and ph.text == "<b>" and ph.get("id") == "p"
    assert units["3"].find("x:target", ns).text == "Salvar alterações"
    assert units["3"].find("x:target", ns).get("state") == "final"
    assert units["4"].find("x:target", ns) is None


def test_xliff_20_targets(client: TestClient) -> None:
    out = translate_file(client, "app.xliff", XLIFF20.encode(), XLIFF_MEDIA)
    ns = {"x": XLIFF_20}
    before, after = xml(XLIFF20.encode()), xml(out)
    assert [etree.tostring(s, with_tail=False) for s in after.iterfind(".//x:source", ns)] == [
        etree.tostring(s, with_tail=False) for s in before.iterfind(".//x:source", ns)]
    segments = list(after.iterfind(".//x:segment", ns))
    first, kept_final, inline, untranslatable = segments
    assert first.get("state") == "translated" and "{0}" in "".join(first.find("x:target", ns).itertext())
    assert kept_final.get("state") == "final" and kept_final.find("x:target", ns).text == "Salvar alterações"
    target = inline.find("x:target", ns)
    assert inline.get("state") == "translated"
    assert sorted((c.tag.split("}")[1], c.get("id")) for c in target.iter() if c is not target) == [
        ("pc", "1"), ("ph", "2")]
    assert untranslatable.find("x:target", ns) is None
    assert after.get("trgLang") == "pt"


@pytest.mark.parametrize("version", ["1.2", "2.0"])
def test_xliff_without_a_target_language_gets_the_one_translated_into(client: TestClient, version: str) -> None:
    """XLIFF 2.0 requires trgLang once a target exists; 1.2 tools read <file target-language>."""
    text = (XLIFF20.replace(' trgLang="pt"', "") if version == "2.0"
            else XLIFF12.replace(' target-language="pt"', ""))
    after = xml(translate_file(client, "app.xlf", text.encode(), XLIFF_MEDIA))
    named = after.get("trgLang") if version == "2.0" else after.find(f"{{{XLIFF_12}}}file").get("target-language")
    assert named == "pt"


LAUGHS = ('<?xml version="1.0"?><!DOCTYPE xliff [<!ENTITY lol "lol">'
          + "".join(f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10 if i > 1 else "&lol;" * 10}">' for i in range(1, 10))
          + f']><xliff version="1.2" xmlns="{XLIFF_12}"><file><body><trans-unit id="1"><source>&lol9;</source>'
          '</trans-unit></body></file></xliff>')


@pytest.mark.parametrize(("name", "data"), [
    ("laughs.xlf", LAUGHS.encode()),
    ("xxe.xliff", (f'<?xml version="1.0"?><!DOCTYPE xliff [<!ENTITY s SYSTEM "file:///etc/passwd">]>'
                   f'<xliff version="1.2" xmlns="{XLIFF_12}"><file><body><trans-unit id="1"><source>&s;</source>'
                   '</trans-unit></body></file></xliff>').encode()),
    ("broken.xlf", b"<xliff><file>"),
    ("other.xlf", b"<html><body>Open the file</body></html>"),
    ("binary.po", b"msgid \"a\\x00\"\nmsgstr \"\"\n\x00"),
    ("latin1.po", 'msgid "Olá"\nmsgstr ""\n'.encode("latin-1")),
])
def test_hostile_or_broken_files_refused(client: TestClient, name: str, data: bytes) -> None:
    r = client.post("/translate_file", files={"file": (name, data)}, data={"source": "en", "target": "pt"})
    assert r.status_code == 400, r.text
    assert r.json()["error_type"] in ("invalid_document", "invalid_encoding")
