"""`tolk data edu`: Qt `.qm` catalogs written by Qt's own lrelease and read back by the project's reader (the same
messages as Qt's lconvert reads), Qt resource files written by Qt's rcc, Tux Paint's stamp descriptions, and the
pairs cleaned as the corpus's."""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from model.data import edu, extra
from model.data.split import source_key

TS = """<?xml version="1.0" encoding="utf-8"?>
<!DOCTYPE TS>
<TS version="2.1" language="pt_BR">
<context>
    <name>Activity</name>
    <message>
        <source>Kick the ball into the goal.</source>
        <translation>Chute a bola para o gol.</translation>
    </message>
    <message numerus="yes">
        <source>%n second(s)</source>
        <translation><numerusform>%n segundo</numerusform><numerusform>%n segundos</numerusform></translation>
    </message>
    <message>
        <source>Not translated yet</source>
        <translation type="unfinished"></translation>
    </message>
    <message>
        <source>The cat is sleeping on the &lt;b&gt;sofa&lt;/b&gt;.</source>
        <comment>a translator's comment</comment>
        <translation>O gato está dormindo no &lt;b&gt;sofá&lt;/b&gt;. 😀</translation>
    </message>
</context>
<context>
    <name>Other</name>
    <message>
        <source>Kick the ball into the goal.</source>
        <translation>Chute a bola no gol.</translation>
    </message>
</context>
</TS>
"""


def qt_tool(name: str) -> str | None:
    """Qt's lrelease, lconvert or rcc (Debian's qt6-l10n-tools and qt6-base-dev-tools keep them out of PATH)."""
    for candidate in (shutil.which(name), f"/usr/lib/qt6/bin/{name}", f"/usr/lib/qt6/libexec/{name}",
                      f"/usr/lib/qt5/bin/{name}"):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


@pytest.fixture()
def qm_file(tmp_path: Path) -> Path:
    lrelease = qt_tool("lrelease")
    if lrelease is None:
        pytest.skip("Qt's lrelease is not installed (Debian: qt6-l10n-tools)")
    (tmp_path / "t.ts").write_text(TS, encoding="utf-8")
    subprocess.run([lrelease, str(tmp_path / "t.ts"), "-qm", str(tmp_path / "t.qm")], check=True,
                   capture_output=True)
    return tmp_path / "t.qm"


def test_messages_of_a_qm_file_written_by_lrelease(qm_file: Path) -> None:
    got = sorted(edu.qm_messages(qm_file.read_bytes()))
    assert got == sorted([
        ("Kick the ball into the goal.", ["Chute a bola para o gol."]),
        ("Kick the ball into the goal.", ["Chute a bola no gol."]),
        ("%n second(s)", ["%n segundo", "%n segundos"]),
        ("The cat is sleeping on the <b>sofa</b>.", ["O gato está dormindo no <b>sofá</b>. 😀"]),
    ])  # the untranslated message is not in the file
    # plural forms are left out of the pairs
    assert "%n second(s)" not in {en for en, _ in edu.qm_pairs(qm_file.read_bytes())}


def test_the_reader_agrees_with_qts_lconvert(qm_file: Path, tmp_path: Path) -> None:
    lconvert = qt_tool("lconvert")
    if lconvert is None:
        pytest.skip("Qt's lconvert is not installed (Debian: qt6-l10n-tools)")
    subprocess.run([lconvert, "-i", str(qm_file), "-o", str(tmp_path / "back.ts")], check=True, capture_output=True)
    theirs = []
    for message in ET.parse(tmp_path / "back.ts").getroot().iter("message"):
        translation = message.find("translation")
        assert translation is not None
        forms = [f.text or "" for f in translation.findall("numerusform")] or [translation.text or ""]
        theirs.append((message.findtext("source"), forms))
    assert sorted(edu.qm_messages(qm_file.read_bytes())) == sorted(theirs)


def test_a_file_that_is_not_qm_is_refused() -> None:
    with pytest.raises(ValueError, match="magic"):
        list(edu.qm_messages(b"\x00" * 32))


def write_rcc(folder: Path, files: dict[str, str], *options: str) -> bytes:
    """A binary Qt resource file made by Qt's rcc from `files` (path under the vocabulary activity -> text)."""
    rcc = qt_tool("rcc")
    if rcc is None:
        pytest.skip("Qt's rcc is not installed (Debian: qt6-base-dev-tools)")
    entries = []
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")
        entries.append(f"<file>{name}</file>")
    (folder / "t.qrc").write_text(f'<RCC><qresource prefix="/gcompris/src/activities/lang">{"".join(entries)}'
                                  "</qresource></RCC>", encoding="utf-8")
    subprocess.run([rcc, "-binary", *options, str(folder / "t.qrc"), "-o", str(folder / "t.rcc")], check=True,
                   capture_output=True)
    return (folder / "t.rcc").read_bytes()


VOCABULARY = {
    "resource/content-en.json": '{"beach.ogg": "beach", "jump.ogg": "to jump", "sofa.ogg": "sofa", "x.ogg": ""}',
    "resource/content-pt_BR.json": '{"jump.ogg": "pular", "beach.ogg": "praia", "sofa.ogg": "sofá", "x.ogg": "x"}',
    "resource/content-pt.json": '{"beach.ogg": "praia", "jump.ogg": "saltar"}',
    "resource/words.json": "[" + ", ".join(['{"description": "beach"}'] * 200) + "]",  # long enough to compress
}


@pytest.mark.parametrize("options", [("--compress-algo", "zlib", "--threshold", "0"), ("--no-compress",)])
def test_resource_files_written_by_rcc_are_read_whole(tmp_path: Path, options: tuple[str, ...]) -> None:
    data = write_rcc(tmp_path, VOCABULARY, *options)
    files = dict(edu.rcc_files(data))
    assert {path: raw.decode("utf-8") for path, raw in files.items()} == {
        f"/gcompris/src/activities/lang/{name}": text for name, text in VOCABULARY.items()}
    # the words that both languages name, by recording; Portugal's file is not read
    assert list(edu.vocabulary_pairs(data)) == [("beach", "praia"), ("to jump", "pular"), ("sofa", "sofá")]


def test_a_zstd_resource_is_refused_and_a_file_that_is_not_rcc_too(tmp_path: Path) -> None:
    data = write_rcc(tmp_path, VOCABULARY, "--compress-algo", "zstd", "--threshold", "0")
    with pytest.raises(ValueError, match="zstd"):
        dict(edu.rcc_files(data))
    with pytest.raises(ValueError, match="qres"):
        dict(edu.rcc_files(b"\x00" * 32))


def test_stamp_descriptions_take_brazilian_portuguese_only() -> None:
    text = ("A calculator.  6x7=42\naf.utf8='n Sakrekenaar. 6x7=42\npt.utf8=Uma calculadora.\n"
            "pt_BR.utf8=Uma calculadora. 6x7=42\n")
    assert edu.stamp_description(text) == ("A calculator.  6x7=42", "Uma calculadora. 6x7=42")
    assert edu.stamp_description("Grandma's old rag doll.\npt.utf8=Boneca de trapos da avó.\n") is None
    assert edu.stamp_description("") is None


def test_stamp_pairs_walk_the_stamps_folder_in_order(tmp_path: Path) -> None:
    folder = tmp_path / edu.STAMPS_ROOT
    (folder / "animals").mkdir(parents=True)
    (folder / "animals/cat.txt").write_text("A cat.\npt_BR.utf8=Um gato.\n", encoding="utf-8")
    (folder / "animals/dog.txt").write_text("A dog.\nfr.utf8=Un chien.\n", encoding="utf-8")
    (folder / "toys").mkdir()
    (folder / "toys/doll.txt").write_text("Grandma’s old rag doll.\npt_BR.utf8=Uma boneca de pano da vovó.\n",
                                          encoding="utf-8")
    (folder / "toys/doll.png").write_bytes(b"")
    assert list(edu.stamp_pairs(tmp_path)) == [("A cat.", "Um gato."),
                                               ("Grandma’s old rag doll.", "Uma boneca de pano da vovó.")]


def test_user_interface_pairs_lose_markup_and_accelerators_and_held_out_sentences(qm_file: Path) -> None:
    found = [(en, pt, edu.GCOMPRIS) for en, pt in edu.qm_pairs(qm_file.read_bytes())]
    found.append(("&Open the door.", "&Abra a porta.", edu.GCOMPRIS))
    found.append(("Take the train.", "Apanhe o comboio.", edu.GCOMPRIS))
    kept, stats = extra.train_pairs(found, edu.GCOMPRIS, {source_key("Chute a bola no gol.")}, markup=True,
                                    accelerators=True)
    assert sorted((p.en, p.pt) for p in kept) == [
        ("Kick the ball into the goal.", "Chute a bola para o gol."),
        ("Open the door.", "Abra a porta."),
        ("The cat is sleeping on the sofa.", "O gato está dormindo no sofá. 😀"),
    ]
    assert stats["held_out_dropped"] == 1 and stats["european"] == 1
