"""`tolk data dictionary`: FreeDict's dict-server files read as Debian packages them (a base-64 index into a gzip
file), one pair per sense; explanations, held-out sentences and Portugal's forms left out; either direction."""

from __future__ import annotations

import gzip
from pathlib import Path

from model.data import dictionary
from model.data.split import source_key

ENG_POR = [
    ("00-database-info", "00-database-info\nEnglish-Portuguese FreeDict Dictionary\n"),
    ("corner", "corner /kɔːnər/\n1. abarcar, açambarcar, fazer truste\n2. esquina\n"),
    ("beach", "beach /biːtʃ/\npraia\n"),
    ("as as", "as as\nqual...tal\n"),
    ("lan", "lan\nrede local (local area network)\n"),
    ("favlet", "favlet\npequeno programa escrito em JavaScript armazenado nos Favoritos\n"),
    ("radio", "radio /reidiou/ <s>\nradio\n"),
    ("open", "open /oupən/\n1. aberto\n2. abrir\n"),
]
POR_ENG = [("praia", "praia /pɹˈaɪɐ/\nbeach\n"), ("neblina", "neblina /nˌeblˈinɐ/\nfog, mist\n")]


def b64(number: int) -> str:
    digits = ""
    while True:
        number, digit = divmod(number, 64)
        digits = dictionary._B64[digit] + digits
        if not number:
            return digits


def write_dictd(folder: Path, stem: str, entries: list[tuple[str, str]]) -> None:
    """A dictd index (headword TAB base-64 offset TAB base-64 length) and its data, dictzip being gzip's format."""
    data, index = b"", []
    for word, text in entries:
        raw = text.encode("utf-8")
        index.append(f"{word}\t{b64(len(data))}\t{b64(len(raw))}")
        data += raw
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.index").write_text("\n".join(index) + "\n", encoding="utf-8")
    (folder / f"{stem}.dict.dz").write_bytes(gzip.compress(data))


def test_dictd_numbers_are_base_64_most_significant_first() -> None:
    assert [dictionary.dictd_number(s) for s in ("A", "B", "BA", "YGR", "/")] == [0, 1, 64, 24 * 4096 + 6 * 64 + 17,
                                                                                   63]


def test_each_sense_gives_its_first_translation_and_explanations_are_left_out(tmp_path: Path) -> None:
    root = tmp_path / "dict-freedict-eng-por"
    write_dictd(root / "usr/share/dictd", "freedict-eng-por", ENG_POR)
    index, data = dictionary.read_dictionary(root, "dict-freedict-eng-por")
    got = list(dictionary.word_pairs(index, data, "en"))
    # the database's own entry, the ellipsis, the parenthesis and the explanation are not pairs
    assert got == [("corner", "abarcar"), ("corner", "esquina"), ("beach", "praia"), ("radio", "radio"),
                   ("open", "aberto"), ("open", "abrir")]


def test_portuguese_headwords_give_english_portuguese_pairs(tmp_path: Path) -> None:
    root = tmp_path / "dict-freedict-por-eng"
    write_dictd(root / "usr/share/dictd", "freedict-por-eng", POR_ENG)
    index, data = dictionary.read_dictionary(root, "dict-freedict-por-eng")
    assert list(dictionary.word_pairs(index, data, "pt")) == [("beach", "praia"), ("fog", "neblina")]


def test_pairs_are_kept_once_cleaned_and_held_out_words_and_portugals_forms_dropped() -> None:
    found = [("beach", "praia", "dict-freedict-eng-por"), ("beach", "praia", "dict-freedict-por-eng"),
             ("radio", "radio", "dict-freedict-eng-por"), ("Open", "abrir", "dict-freedict-eng-por"),
             ("train", "comboio", "dict-freedict-eng-por"), ("fog", "neblina", "dict-freedict-por-eng")]
    kept, stats = dictionary.dictionary_pairs(found, {source_key("open")})
    assert [(p.en, p.pt, p.package) for p in kept] == [("beach", "praia", "dict-freedict-eng-por"),
                                                        ("fog", "neblina", "dict-freedict-por-eng")]
    assert stats == {"held_out_dropped": 1, "identical": 1, "european": 1}
