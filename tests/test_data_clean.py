"""Unit tests for the corpus cleaning code (no network, no downloads)."""

from __future__ import annotations

import struct
from pathlib import Path

from model.data.catalog import Entry, entry_pairs, parse_mo, parse_mo_bytes, parse_po_text
from model.data.clean import (
    length_ratio_ok,
    looks_untranslated,
    normalize,
    placeholders,
    placeholders_match,
    reject_reason,
    strip_accelerators,
    strip_markup,
)
from model.data.pairs import Pair
from model.data.segment import split_aligned
from model.data.sources.ddtp import description_pairs, paragraphs
from model.data.sources.help_html import html_paragraphs
from model.data.sources.l10n_files import parse_ftl, parse_properties, resolve_terms
from model.data.split import dedup, source_key, split_by_source


def _write_mo(path: Path, messages: dict[str, str]) -> None:
    """Write a little-endian GNU .mo file (same layout as msgfmt)."""
    keys = sorted(messages)
    ids = [k.encode() for k in keys]
    strs = [messages[k].encode() for k in keys]
    n = len(keys)
    orig_tab, trans_tab = 28, 28 + 8 * n
    offset = 28 + 16 * n
    header = struct.pack("<7I", 0x950412DE, 0, n, orig_tab, trans_tab, 0, 0)
    table_o, table_t, blob = b"", b"", b""
    for data in ids:
        table_o += struct.pack("<2I", len(data), offset + len(blob))
        blob += data + b"\0"
    for data in strs:
        table_t += struct.pack("<2I", len(data), offset + len(blob))
        blob += data + b"\0"
    path.write_bytes(header + table_o + table_t + blob)


def test_strip_accelerators() -> None:
    assert strip_accelerators("_File") == "File"
    assert strip_accelerators("E_xit") == "Exit"
    assert strip_accelerators("&Open") == "Open"
    assert strip_accelerators("Sa&ir") == "Sair"
    assert strip_accelerators("~Save As") == "Save As"
    assert strip_accelerators("Salvar (_S)") == "Salvar"
    assert strip_accelerators("R&D") == "R&D"
    assert strip_accelerators("my_var_name") == "my_var_name"


def test_strip_markup_and_normalize() -> None:
    assert strip_markup("<b>Bold</b> &amp; <i>it</i>") == "Bold & it"
    assert normalize("  <span foo='1'>_Open</span>\n file\t now ") == "Open file now"
    assert normalize("Fish &amp; Chips") == "Fish & Chips"
    assert normalize("a <= b") == "a <= b"


def test_placeholders() -> None:
    assert placeholders("%d files in %s") == placeholders("%s: %d arquivos")
    assert placeholders_match("%1$s of %2$s", "%2$s de %1$s")
    assert placeholders_match("{count} items", "{count} itens")
    assert placeholders_match("{ $name } says", "{ $name } diz")
    assert placeholders_match("%(n)d left", "restam %(n)d")
    assert placeholders_match("%1 of %2", "%2 de %1")
    assert placeholders_match("100%% done", "100%% feito")
    assert not placeholders_match("Open %s", "Abrir")
    assert not placeholders_match("%d items", "%s itens")
    assert not placeholders_match("{name}", "{nome}")


def test_length_ratio_and_reject() -> None:
    assert length_ratio_ok("Open the file", "Abrir o arquivo")
    assert not length_ratio_ok("Yes", "Sim, desejo realmente continuar com esta operação longa")
    assert reject_reason("Open the file", "Abrir o arquivo") is None
    assert reject_reason("Open the file", "Abrir o arquivo agora mesmo, por favor, " * 5) == "ratio"
    assert reject_reason("word " * 300, "palavra " * 300) == "length"
    assert reject_reason("0x%08x", "0x%08x") == "junk"
    assert reject_reason("MENU_FILE", "Arquivo") == "key"
    assert reject_reason("Hello world and more", "Hello world and more") == "identical"
    assert reject_reason("Open %s", "Abrir") == "placeholders"
    assert reject_reason("Hello", "Привет") == "script"


def test_looks_untranslated() -> None:
    assert looks_untranslated("GNU General Public License", "GNU General Public License.")
    assert looks_untranslated("This is a long English sentence", "This is a long English sentence too")
    assert not looks_untranslated("Open the file now", "Abrir o arquivo agora")


def test_dedup_and_cap() -> None:
    pairs = [Pair("Open", "Abrir", "s", "p"), Pair("Open", "Abrir", "s", "q"),
             Pair("Open", "Abre", "s", "p"), Pair("open", "Abra", "s", "p"),
             Pair("Open!", "Abrir!", "s", "p")]
    out = dedup(pairs, max_per_source=3)
    assert [(p.en, p.pt) for p in out] == [("Open", "Abrir"), ("Open", "Abre"), ("open", "Abra")]


def test_split_by_source_no_overlap() -> None:
    pairs = []
    for i in range(300):
        origin = ("a", "b", "c")[i % 3]
        sentence = f"This is sentence number {i} here"
        pairs.append(Pair(sentence, f"Esta é a frase número {i} aqui", origin, "p"))
        pairs.append(Pair(sentence.upper(), f"ESTA É A FRASE {i}", origin, "p"))
    pairs += [Pair(f"Word{i}", f"Palavra{i}", "a", "p") for i in range(50)]
    splits = split_by_source(pairs, {"dev": 30, "test": 30}, seed=7)
    keys = {name: {source_key(p.en) for p in split} for name, split in splits.items()}
    assert len(splits["dev"]) == 30 and len(splits["test"]) == 30
    assert not keys["dev"] & keys["test"]
    assert not keys["train"] & (keys["dev"] | keys["test"])
    assert {p.source for p in splits["dev"]} == {"a", "b", "c"}
    assert all(len(p.en.split()) >= 4 for p in splits["dev"] + splits["test"])
    again = split_by_source(pairs, {"dev": 30, "test": 30}, seed=7)
    assert again["dev"] == splits["dev"]


def test_mo_parsing(tmp_path: Path) -> None:
    mo = tmp_path / "tiny.mo"
    _write_mo(mo, {
        "": "Content-Type: text/plain; charset=UTF-8\nPlural-Forms: nplurals=2; plural=(n > 1);\n",
        "Open": "Abrir",
        "menu\x04_Quit": "_Sair",
        "%d file\x00%d files": "%d arquivo\x00%d arquivos",
    })
    entries = parse_mo(mo)
    assert len(entries) == 3
    pairs = {p for e in entries for p in entry_pairs(e)}
    assert pairs == {("Open", "Abrir"), ("_Quit", "_Sair"),
                     ("%d file", "%d arquivo"), ("%d files", "%d arquivos")}
    assert any(e.msgctxt == "menu" for e in entries)
    assert parse_mo_bytes(mo.read_bytes()) == entries


def test_po_parsing_skips_fuzzy_and_untranslated() -> None:
    text = '''msgid ""
msgstr "Content-Type: text/plain; charset=UTF-8\\n"

msgid "Open"
msgstr "Abrir"

#, fuzzy
msgid "Close"
msgstr "Fechar"

msgid "Empty"
msgstr ""

msgctxt "#123"
msgid ""
"Multi "
"line"
msgstr "Várias "
"linhas"

msgid "%d file"
msgid_plural "%d files"
msgstr[0] "%d arquivo"
msgstr[1] "%d arquivos"
'''
    entries = parse_po_text(text)
    assert [e.msgid for e in entries] == ["Open", "Multi line", "%d file"]
    assert entries[1].msgctxt == "#123"
    assert entry_pairs(entries[2]) == [("%d file", "%d arquivo"), ("%d files", "%d arquivos")]
    assert entry_pairs(Entry("x", ("",))) == []


def test_split_aligned() -> None:
    en = "First one. Second one.\n\nThird paragraph."
    pt = "Primeira. Segunda.\n\nTerceiro parágrafo."
    assert split_aligned(en, pt) == [("First one.", "Primeira."), ("Second one.", "Segunda."),
                                     ("Third paragraph.", "Terceiro parágrafo.")]
    assert split_aligned("A. B.", "Só uma.") == [("A. B.", "Só uma.")]


def test_ddtp_paragraphs() -> None:
    long_en = "Intro text.\n.\nFeatures:\n * one thing\n * another"
    long_pt = "Texto inicial.\n.\nRecursos:\n * uma coisa\n * outra"
    assert paragraphs(long_en) == ["Intro text.", "Features:", "one thing", "another"]
    pairs = description_pairs(("short", long_en), ("curta", long_pt))
    assert pairs[0] == ("short", "curta") and ("one thing", "uma coisa") in pairs


def test_help_html_and_mozilla_files(tmp_path: Path) -> None:
    page = tmp_path / "p.html"
    page.write_text('<html><body><h1 id="hd_id1">Title <span>x</span></h1><br>'
                    '<p id="par_id2" class="paragraph">Some <b>bold</b> text.</p>'
                    '<p id="par_id3" class="code">x = 1</p><div id="nav">menu</div></body></html>')
    assert html_paragraphs(page) == {"hd_id1": "Title x", "par_id2": "Some bold text."}
    ftl = parse_ftl("-brand = Firefox\nhello = Hello { -brand }\n    .title = Hi { $name }\n"
                    "sel = { $n ->\n   *[other] many\n}\n")
    resolved = resolve_terms(ftl, {"-brand": "Firefox"})
    assert resolved == {"hello": "Hello Firefox", "hello.title": "Hi { $name }"}
    props = parse_properties("# c\nkey = Value \\u00e9\nlong = a \\\n  b\n")
    assert props == {"key": "Value é", "long": "a b"}
