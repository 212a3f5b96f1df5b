"""Described commands: English commands whose Portuguese is a third-person description, found from the corpus."""

from __future__ import annotations

import json
from pathlib import Path

from model.data.commands import described_forms, filter_folder, is_described, leave_out_described, third_person

# a little corpus: "Open" is "Abrir" as a menu item (the infinitive the forms are learnt from), "Abra" as a command,
# "Abre" where a tooltip describes it; "List" is a verb and a noun
CORPUS = ([("Open", "Abrir")] * 6 + [("Open the file.", "Abra o arquivo.")] * 4
          + [("Open the file", "Abre o arquivo"), ("Open a new window", "Abre uma nova janela")]
          + [("List", "Listar")] * 5 + [("List the files", "Lista os arquivos"), ("List of types", "Lista de tipos")]
          + [("Opens the file", "Abre o arquivo"), ("Open files", "Arquivos abertos"), ("URL", "URL")])


def test_third_person_of_regular_infinitives() -> None:
    assert [third_person(w) for w in ("Salvar", "abrir", "mover", "excluir", "exibir")] == [
        "salva", "abre", "move", "exclui", "exibe"]
    # short infinitives are irregular or give function words ("dar" -> "da", "ser" -> "se"); "parar" gives "para"
    assert [third_person(w) for w in ("ir", "ser", "dar", "parar", "arquivo")] == [None] * 5


def test_forms_are_learnt_from_the_infinitives_that_translate_a_word() -> None:
    forms = described_forms(CORPUS)
    assert forms == {"open": frozenset({"abre"}), "list": frozenset({"lista"})}
    assert described_forms(CORPUS, min_count=7) == {}  # "Abrir" begins 6 translations of "Open"


def test_commands_translated_as_descriptions_are_left_out_and_nothing_else() -> None:
    kept, left = leave_out_described(CORPUS)
    dropped = [CORPUS[i] for i in sorted(set(range(len(CORPUS))) - set(kept))]
    assert dropped == [("Open the file", "Abre o arquivo"), ("Open a new window", "Abre uma nova janela"),
                       ("List the files", "Lista os arquivos")]
    assert left == {"open": 2, "list": 1}
    forms = described_forms(CORPUS)
    assert not is_described("Opens the file", "Abre o arquivo", forms)  # English third person: a faithful pair
    assert not is_described("List of types", "Lista de tipos", forms)  # nouns on both sides
    assert is_described("Open", "Abre", forms)


def test_a_folder_keeps_its_other_splits_and_its_pairs_aligned(tmp_path: Path) -> None:
    source, out = tmp_path / "corpus", tmp_path / "out"
    source.mkdir()
    (source / "train.en").write_text("".join(en + "\n" for en, _ in CORPUS), encoding="utf-8")
    (source / "train.pt").write_text("".join(pt + "\n" for _, pt in CORPUS), encoding="utf-8")
    (source / "test.en").write_text("Open the file\n", encoding="utf-8")
    (source / "test.pt").write_text("Abre o arquivo\n", encoding="utf-8")
    counts = filter_folder(source, out)
    assert counts["left_out"] == 3 and counts["kept"] == len(CORPUS) - 3
    en = (out / "train.en").read_text(encoding="utf-8").splitlines()
    pt = (out / "train.pt").read_text(encoding="utf-8").splitlines()
    kept, _ = leave_out_described(CORPUS)
    assert list(zip(en, pt, strict=True)) == [CORPUS[i] for i in kept]
    assert (out / "test.pt").read_text(encoding="utf-8") == "Abre o arquivo\n"  # held-out splits are not touched
    assert json.loads((out / "commands.json").read_text(encoding="utf-8"))["by_word"] == {"open": 2, "list": 1}
