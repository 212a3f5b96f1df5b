"""How the training split translates English imperatives: infinitive, imperative or third person, by segment shape;
or how models do.

For ten common verbs at the start of an English segment, counts the form of the first Portuguese word. Explains why
the model writes "Open the file." -> "Abrir o arquivo." (weights/en-pt/MODEL_CARD.md). With --model, translates two
commands a verb (`COMMANDS`, float32, greedy) with each model directory given and counts the same forms in what it
wrote. Prints a table and writes JSON.

    python bench/imperatives.py [--corpus data/corpus]
    python bench/imperatives.py --model weights/en-pt [--model OTHER] --out bench/results/imperatives-models.json
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERBS = {  # English verb -> (third person, imperative, infinitive) in Portuguese
    "Open": ("Abre", "Abra", "Abrir"), "Select": ("Seleciona", "Selecione", "Selecionar"),
    "Save": ("Salva", "Salve", "Salvar"), "Close": ("Fecha", "Feche", "Fechar"),
    "Delete": ("Exclui", "Exclua", "Excluir"), "Show": ("Mostra", "Mostre", "Mostrar"),
    "Create": ("Cria", "Crie", "Criar"), "Remove": ("Remove", "Remova", "Remover"),
    "Add": ("Adiciona", "Adicione", "Adicionar"), "Change": ("Altera", "Altere", "Alterar"),
}
# two commands a verb, as a user writes them to a translation server (sentences with a period)
COMMANDS = ["Open the file.", "Open a new window.", "Select a folder.", "Select the text you want to copy.",
            "Save your changes.", "Save the document before closing it.", "Close the window.",
            "Close all open tabs.", "Delete the selected files.", "Delete this message.", "Show hidden files.",
            "Show the full path in the title bar.", "Create a new document.", "Create a backup of your data.",
            "Remove the item from the list.", "Remove the old version first.", "Add a new user.",
            "Add the folder to your favorites.", "Change the password.", "Change the language in the settings."]
SHAPES = {"2-5 words, with a period": (2, 5, True), "2-5 words, no period": (2, 5, False),
          "6-40 words, with a period": (6, 40, True)}


def form(english: str, portuguese: str) -> str:
    """The form of the Portuguese first word for an English segment that begins with one of `VERBS`."""
    third, imperative, infinitive = VERBS[english.split(" ", 1)[0]]
    first = portuguese.split(" ", 1)[0]
    return {third: "third person", imperative: "imperative", infinitive: "infinitive"}.get(first, "other")


def models(directories: list[str], out: Path) -> None:
    import dataclasses
    import sys

    import torch

    sys.path.insert(0, str(ROOT))
    from model import checkpoint
    from model.search import generate

    torch.set_num_threads(2)
    result: dict[str, dict[str, object]] = {}
    for directory in directories:
        m = checkpoint.load(directory, device="cpu", dtype="float32")
        config = dataclasses.replace(m.generation, beam_size=1)
        hyps = generate(m.net, [m.tokenizer.encode(s) for s in COMMANDS], config, max_rows=len(COMMANDS))
        outputs = [m.tokenizer.decode(h[0].tokens) for h in hyps]
        counts = Counter(form(e, t) for e, t in zip(COMMANDS, outputs, strict=True))
        result[directory] = {"counts": dict(counts), "translations": dict(zip(COMMANDS, outputs, strict=True))}
        print(f"{directory}: " + ", ".join(f"{k} {counts.get(k, 0)}" for k in
                                           ("imperative", "infinitive", "third person", "other")))
        for e, t in zip(COMMANDS, outputs, strict=True):
            print(f"  {e} -> {t}")
    out.write_text(json.dumps({"commands": len(COMMANDS), "models": result}, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", type=Path, default=ROOT / "data" / "corpus")
    p.add_argument("--model", action="append", default=[], help="a model directory whose translations to count")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "imperatives.json")
    args = p.parse_args()
    if args.model:
        models(args.model, args.out)
        return
    en = (args.corpus / "train.en").read_text(encoding="utf-8").splitlines()
    pt = (args.corpus / "train.pt").read_text(encoding="utf-8").splitlines()
    result: dict[str, dict[str, int]] = {}
    for shape, (lo, hi, period) in SHAPES.items():
        counts: Counter[str] = Counter()
        for e, t in zip(en, pt, strict=True):
            verb = e.split(" ", 1)[0]
            if verb in VERBS and " " in e and lo <= len(e.split()) <= hi and e.endswith(".") == period:
                counts[form(e, t)] += 1
        result[shape] = dict(counts)
    print(f"{'segments':28s} {'infinitive':>10s} {'imperative':>10s} {'third person':>12s} {'other':>6s}")
    for shape, c in result.items():
        print(f"{shape:28s} {c.get('infinitive', 0):10d} {c.get('imperative', 0):10d} {c.get('third person', 0):12d} "
              f"{c.get('other', 0):6d}")
    args.out.write_text(json.dumps({"corpus": str(args.corpus), "counts": result}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
