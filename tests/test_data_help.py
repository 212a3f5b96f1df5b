"""`tolk data help`: the help pairs that train holds, no others, in train's order, through the console script."""

from __future__ import annotations

from pathlib import Path

import pytest

from model.data import help as help_pairs
from model.data.pairs import Pair, pairs_path, write_pairs
from server.cli import main


def write_corpus(corpus: Path, pairs: list[tuple[str, str]]) -> None:
    corpus.mkdir(parents=True)
    for column, lang in enumerate(("en", "pt")):
        (corpus / f"train.{lang}").write_text("".join(p[column] + "\n" for p in pairs), encoding="utf-8")


def test_help_pairs_are_the_raw_pairs_train_kept(tmp_path: Path) -> None:
    raw = [
        Pair("Click the button to start.", "Clique no botão para começar.", "mallard", "gnome-user-docs"),
        Pair("Open the Activities overview.", "Abra o panorama de atividades.", "mallard", "gnome-user-docs"),
        Pair("This sentence was held out.", "Esta frase foi separada.", "mallard", "gnome-user-docs"),
        Pair("Play the game.", "Jogue o jogo.", "mallard", "gnome-mines"),
    ]
    write_pairs(pairs_path(tmp_path / "work", "mallard"), raw)
    train = [
        ("Play the game.", "Jogue o jogo."),
        ("Save the file.", "Salve o arquivo."),  # another source's pair
        ("Open the Activities overview.", "Abra a visão geral de atividades."),  # same English, other Portuguese
        ("Click the button to start.", "Clique no botão para começar."),
    ]
    write_corpus(tmp_path / "corpus", train)
    out = tmp_path / "help"
    assert main(["data", "help", "--corpus", str(tmp_path / "corpus"), "--work", str(tmp_path / "work"),
                 "--out", str(out)]) == 0
    assert (out / "train.en").read_text(encoding="utf-8").splitlines() == ["Play the game.",
                                                                           "Click the button to start."]
    assert (out / "train.pt").read_text(encoding="utf-8").splitlines() == ["Jogue o jogo.",
                                                                           "Clique no botão para começar."]
    assert "gnome-mines" in (out / "NOTICE").read_text(encoding="utf-8")


def test_a_pair_train_holds_twice_is_written_once() -> None:
    raw = [Pair("Play the game.", "Jogue o jogo.", "mallard", "gnome-mines")]
    kept = help_pairs.help_pairs([("Play the game.", "Jogue o jogo.")] * 2, raw)
    assert [(p.en, p.pt, p.package) for p in kept] == [("Play the game.", "Jogue o jogo.", "gnome-mines")]


def test_without_a_built_corpus_it_says_what_to_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert main(["data", "help", "--corpus", str(tmp_path / "corpus"), "--work", str(tmp_path / "work"),
                 "--out", str(tmp_path / "help")]) == 1
    assert "tolk data build" in caplog.text
    assert not (tmp_path / "help").exists()
