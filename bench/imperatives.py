"""How the training split translates English imperatives: infinitive, imperative or third person, by segment shape.

For ten common verbs at the start of an English segment, counts the form of the first Portuguese word. Explains why
the model writes "Open the file." -> "Abrir o arquivo." (weights/en-pt/MODEL_CARD.md). Prints a table and writes JSON.

    python bench/imperatives.py [--corpus data/corpus]
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
SHAPES = {"2-5 words, with a period": (2, 5, True), "2-5 words, no period": (2, 5, False),
          "6-40 words, with a period": (6, 40, True)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", type=Path, default=ROOT / "data" / "corpus")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "imperatives.json")
    args = p.parse_args()
    en = (args.corpus / "train.en").read_text(encoding="utf-8").splitlines()
    pt = (args.corpus / "train.pt").read_text(encoding="utf-8").splitlines()
    result: dict[str, dict[str, int]] = {}
    for shape, (lo, hi, period) in SHAPES.items():
        counts: Counter[str] = Counter()
        for e, t in zip(en, pt, strict=True):
            verb = e.split(" ", 1)[0]
            if verb in VERBS and " " in e and lo <= len(e.split()) <= hi and e.endswith(".") == period:
                third, imperative, infinitive = VERBS[verb]
                first = t.split(" ", 1)[0]
                counts[{third: "third person", imperative: "imperative", infinitive: "infinitive"}.get(first,
                                                                                                    "other")] += 1
        result[shape] = dict(counts)
    print(f"{'segments':28s} {'infinitive':>10s} {'imperative':>10s} {'third person':>12s} {'other':>6s}")
    for shape, c in result.items():
        print(f"{shape:28s} {c.get('infinitive', 0):10d} {c.get('imperative', 0):10d} {c.get('third person', 0):12d} "
              f"{c.get('other', 0):6d}")
    args.out.write_text(json.dumps({"corpus": str(args.corpus), "counts": result}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
