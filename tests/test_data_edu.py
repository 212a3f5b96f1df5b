"""`tolk data edu`: Qt `.qm` catalogs written by Qt's own lrelease and read back by the project's reader (the same
messages as Qt's lconvert reads), Tux Paint's stamp descriptions, and the pairs cleaned as the corpus's."""

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
    """Qt's lrelease or lconvert (Debian's qt6-l10n-tools keeps them out of PATH)."""
    for candidate in (shutil.which(name), f"/usr/lib/qt6/bin/{name}", f"/usr/lib/qt5/bin/{name}"):
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
