"""How finely a model's source vocabulary cuts text: SentencePiece pieces per whitespace word, and the share of words
cut into three pieces or more, for each model directory and text file given. Prints a table and writes JSON.

    python bench/pieces.py --model weights/pt-en --model runs/pt-en-vocab-init \
        --text bench/data/everyday.pt data/corpus/test.pt data/corpus/prose.pt --out bench/results/pieces-pt.json

The figures of docs/models.md ("A source vocabulary of its own") come from this.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import sentencepiece as spm


def cut(sp: spm.SentencePieceProcessor, lines: list[str]) -> dict[str, float]:
    words = [w for line in lines for w in line.split()]
    pieces = sum(len(ids) for ids in sp.encode(lines))
    split3 = sum(1 for ids in sp.encode(words) if len(ids) >= 3)
    return {"pieces_per_word": round(pieces / len(words), 3), "words_in_3_or_more": round(split3 / len(words), 4)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, action="append", required=True, help="a model directory (its source.spm)")
    p.add_argument("--text", type=Path, nargs="+", required=True)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    rows: list[dict[str, Any]] = []
    for model in args.model:
        sp = spm.SentencePieceProcessor(model_file=str(model / "source.spm"))
        for text in args.text:
            lines = [line for line in text.read_text(encoding="utf-8").splitlines() if line.strip()]
            rows.append({"model": str(model), "pieces": sp.get_piece_size(), "text": str(text), **cut(sp, lines)})
    print(f"{'model':<28}{'pieces':>8}  {'text':<28}{'pieces/word':>12}{'3+ pieces':>11}")
    for r in rows:
        print(f"{r['model']:<28}{r['pieces']:>8}  {r['text']:<28}{r['pieces_per_word']:>12.2f}"
              f"{100 * r['words_in_3_or_more']:>10.1f}%")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
