"""English commands whose Portuguese describes what they do: "Open the file" / "Abre o arquivo".

Tooltips and menu descriptions in the human corpus are often written as a command in English and as a description
in Portuguese (the verb in the third person: "Abre", "Salva", "Exibe"). A model trained on them answers "Open the
file." with "Abre o arquivo." where a user wants the imperative "Abra o arquivo.". These pairs are found from the
corpus itself, with no verb list: for each English first word, the Portuguese infinitives that translate it often
enough (a menu item "Open" is "Abrir") give, by the regular conjugation, the third-person forms to look for.

    python -m model.data.commands data/corpus --out data/corpus-commands

writes a copy of a corpus folder whose train split leaves such pairs out (dev, test and the rest stay as they are).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

_WORD = re.compile(r"[^\W\d_]+")
MIN_COUNT = 5  # an infinitive must begin at least this many of an English word's translations
MIN_SHARE = 0.05  # and at least this share of them
# third persons that are also common function words ("Parar" gives "para", "for")
_FUNCTION_WORDS = frozenset({"para", "como", "entre", "sobre", "contra"})
# after these a Portuguese first word is a noun ("Lista de tipos"), after "of" an English one ("List of")
_PT_OF = frozenset({"de", "do", "da", "dos", "das"})


def _words(text: str) -> list[str]:
    return _WORD.findall(text)


def _bare_english(word: str) -> bool:
    """A capitalised English word that can be a bare verb: "Open", "Press"; not "Opens" nor "URL"."""
    return (word[:1].isupper() and not (len(word) > 1 and word.isupper())
            and not (word.endswith("s") and not word.endswith("ss")))


def third_person(infinitive: str) -> str | None:
    """The present third person singular of a regular Portuguese infinitive ("salvar" -> "salva", "abrir" -> "abre",
    "mover" -> "move", "excluir" -> "exclui"); None for short or other words, whose forms are irregular or clash with
    function words ("ir", "ser", "dar")."""
    word = infinitive.lower()
    if len(word) < 4:
        return None
    if word.endswith(("uir", "ar")):  # "exclui", "salva"
        form = word[:-1]
    elif word.endswith(("er", "ir")):
        form = word[:-2] + "e"
    else:
        return None
    return None if form in _FUNCTION_WORDS else form


def _heads(en: str, pt: str) -> tuple[str, str, str, str] | None:
    """The first two words of each side, lower-cased (the second may be ""), when English begins with a bare word."""
    e, p = _words(en), _words(pt)
    if not e or not p or not _bare_english(e[0]):
        return None
    return e[0].lower(), (e[1].lower() if len(e) > 1 else ""), p[0].lower(), (p[1].lower() if len(p) > 1 else "")


def described_forms(pairs: Sequence[tuple[str, str]], min_count: int = MIN_COUNT,
                    min_share: float = MIN_SHARE) -> dict[str, frozenset[str]]:
    """English first word -> the Portuguese third persons that describe it, learnt from (English, Portuguese)
    pairs: the forms of every infinitive that begins at least `min_count` and `min_share` of its translations."""
    starts: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for en, pt in pairs:
        heads = _heads(en, pt)
        if heads is not None:
            starts[heads[0]][heads[2]] += 1
    forms: dict[str, frozenset[str]] = {}
    for word, counts in starts.items():
        total = sum(counts.values())
        found = {third_person(first) for first, n in counts.items()
                 if n >= min_count and n >= min_share * total and first.endswith(("ar", "er", "ir"))}
        found.discard(None)
        if found:
            forms[word] = frozenset(f for f in found if f is not None)
    return forms


def is_described(en: str, pt: str, forms: dict[str, frozenset[str]]) -> bool:
    """Whether an English command is translated by a description: its Portuguese begins with a third person of the
    English first word's infinitives, neither side read as a noun ("List of types" / "Lista de tipos")."""
    heads = _heads(en, pt)
    if heads is None:
        return False
    word, after_word, first, after_first = heads
    return first in forms.get(word, ()) and after_word != "of" and after_first not in _PT_OF


def leave_out_described(pairs: Sequence[tuple[str, str]],
                        forms: dict[str, frozenset[str]] | None = None) -> tuple[list[int], Counter[str]]:
    """The indices of the pairs to keep, and how many were left out per English first word. `forms` defaults to
    what `described_forms` learns from these pairs."""
    forms = described_forms(pairs) if forms is None else forms
    kept: list[int] = []
    left: Counter[str] = Counter()
    for i, (en, pt) in enumerate(pairs):
        if is_described(en, pt, forms):
            left[_words(en)[0].lower()] += 1
        else:
            kept.append(i)
    return kept, left


def filter_folder(source: Path, out: Path) -> dict[str, object]:
    """Copy a corpus folder to `out` with its train split's described commands left out; returns the counts, also
    written to `out/commands.json`."""
    out.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and not path.name.startswith("train."):
            shutil.copyfile(path, out / path.name)
    en = (source / "train.en").read_text(encoding="utf-8").splitlines()
    pt = (source / "train.pt").read_text(encoding="utf-8").splitlines()
    pairs = list(zip(en, pt, strict=True))
    kept, left = leave_out_described(pairs)
    for column, lang in enumerate(("en", "pt")):
        (out / f"train.{lang}").write_text("".join(pairs[i][column] + "\n" for i in kept), encoding="utf-8")
    counts: dict[str, object] = {"train": len(pairs), "kept": len(kept), "left_out": len(pairs) - len(kept),
                                 "by_word": dict(left.most_common())}
    (out / "commands.json").write_text(json.dumps(counts, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return counts


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("corpus", type=Path, help="a folder with train.en and train.pt")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    counts = filter_folder(args.corpus, args.out)
    print(f"wrote {args.out}: {counts['kept']} of {counts['train']} training pairs kept, "
          f"{counts['left_out']} described commands left out")


if __name__ == "__main__":
    main()
