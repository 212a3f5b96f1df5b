"""Placeholders through the model: survival by kind and chrF for each way of handling them.

The strings of the test split that hold placeholders (`server/placeholders.py:find`) are translated with each
option: nothing done (today's server); "verbatim" (the server's choice: the kinds the model copies shown as they
are, the others as `{N}`) or every placeholder masked as a numbered token (`{N}`, `%N$s`, `XN`), each put back with
no repair, with a repair at the aligned place, or at the end; and the sentence split at its placeholders, the
pieces between them translated alone. "kept" is the share of placeholders found in the output exactly as often
as in the source. chrF is on the placeholder strings, and on the whole split with those strings replaced by the
option's output (the other strings have no placeholder, so their translation is the same in every option: greedy
decoding of a sentence does not depend on its batch). Prints tables and writes JSON.

    python bench/placeholders.py --model weights/en-pt:int8 --model weights/en-pt:float32
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import sacrebleu
import torch

from model import checkpoint
from model.evaluate import translate_lines
from server import placeholders as ph


def kept_by_kind(source: str, output: str) -> Counter[tuple[str, bool]]:
    """(kind, kept) of each placeholder of source: kept when its text is in output as often as in source."""
    found = ph.find(source)
    counts = Counter(p.text for p in found)
    return Counter((p.kind, output.count(p.text) == counts[p.text]) for p in found)


def split_option(translate: Callable[[list[str]], list[str]], sources: list[str]) -> list[str]:
    """Each string cut at its placeholders; the stretches with a letter translated alone, the rest kept."""
    pieces: list[list[str]] = []
    todo: list[str] = []
    for s in sources:
        parts, at = [], 0
        for p in ph.find(s):
            parts.extend([s[at:p.start], p.text])
            at = p.start + len(p.text)
        parts.append(s[at:])
        pieces.append(parts)
        for i, part in enumerate(parts):
            if i % 2 == 0 and re.search(r"[A-Za-z]", part):
                todo.append(part.strip())
    done = dict(zip(todo, translate(todo), strict=True))
    out = []
    for parts in pieces:
        text = ""
        for i, part in enumerate(parts):
            if i % 2 == 0 and part.strip() in done and part.strip():
                lead, trail = part[: len(part) - len(part.lstrip())], part[len(part.rstrip()):]
                text += lead + done[part.strip()] + trail
            else:
                text += part
        out.append(text)
    return out


def run_model(spec: str, src: list[str], ref: list[str], threads: int) -> dict[str, object]:
    path, _, precision = spec.partition(":")
    loaded = checkpoint.load(path, device="cpu", dtype=precision or "float32")

    def translate(lines: list[str]) -> list[str]:
        return translate_lines(loaded.net, loaded.tokenizer, lines, loaded.generation)

    chrf = sacrebleu.CHRF()
    subset = [i for i, s in enumerate(src) if ph.find(s)]
    sub_src, sub_ref = [src[i] for i in subset], [ref[i] for i in subset]
    start = time.perf_counter()
    whole = translate(src)
    seconds = time.perf_counter() - start
    # translated on their own, as every option is: int8's dynamic quantization makes a sentence's output depend a
    # little on its batch, which would blur the comparison
    options: dict[str, list[str]] = {"no handling (today)": translate(sub_src)}
    raw: dict[str, list[str]] = {}
    for style in ph.STYLES:
        masked = [ph.mask(s, style) for s in sub_src]
        raw[style.name] = outputs = translate([m.text for m in masked])
        for repair in ("none", "aligned", "end"):
            options[f"mask {style.name}, repair {repair}"] = [
                ph.unmask(m, o, repair) for m, o in zip(masked, outputs, strict=True)]
    options["split at placeholders"] = split_option(translate, sub_src)
    rows = []
    for name, outputs in options.items():
        kept: Counter[tuple[str, bool]] = Counter()
        for s, o in zip(sub_src, outputs, strict=True):
            kept += kept_by_kind(s, o)
        strings_kept = sum(all(k for (_, k) in kept_by_kind(s, o)) for s, o in zip(sub_src, outputs, strict=True))
        full = list(whole)
        for i, o in zip(subset, outputs, strict=True):
            full[i] = o
        kinds = sorted({kind for kind, _ in kept})
        rows.append({
            "option": name,
            "strings_all_kept_pct": round(100 * strings_kept / len(sub_src), 2),
            "kept_pct_by_kind": {k: round(100 * kept[(k, True)] / (kept[(k, True)] + kept[(k, False)]), 1)
                                 for k in kinds},
            "chrf_placeholder_strings": round(chrf.corpus_score(outputs, [sub_ref]).score, 2),
            "chrf_whole_split": round(chrf.corpus_score(full, [ref]).score, 2),
        })
    total = Counter(p.kind for s in sub_src for p in ph.find(s))
    return {"model": spec, "threads": threads, "strings": len(sub_src), "placeholders_by_kind": dict(total),
            "whole_split_seconds": round(seconds, 1), "rows": rows}


def print_table(result: dict[str, object]) -> None:
    rows = result["rows"]
    assert isinstance(rows, list)
    kinds = sorted(result["placeholders_by_kind"])  # type: ignore[call-overload]
    print(f"\n{result['model']}: {result['strings']} strings with placeholders {result['placeholders_by_kind']}")
    print(f"{'option':<36}{'strings':>8}" + "".join(f"{k:>9}" for k in kinds) + f"{'chrF ph':>9}{'chrF all':>9}")
    for r in rows:
        by = r["kept_pct_by_kind"]
        print(f"{r['option']:<36}{r['strings_all_kept_pct']:>8}" + "".join(f"{by.get(k, '-'):>9}" for k in kinds)
              + f"{r['chrf_placeholder_strings']:>9}{r['chrf_whole_split']:>9}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", type=Path, default=Path("data/corpus/test.en"))
    p.add_argument("--ref", type=Path, default=Path("data/corpus/test.pt"))
    p.add_argument("--model", action="append", default=[], help="DIR or DIR:int8; repeatable")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("bench/results/placeholders.json"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    src = args.src.read_text(encoding="utf-8").splitlines()
    ref = args.ref.read_text(encoding="utf-8").splitlines()
    results = []
    for spec in args.model or ["weights/en-pt:int8"]:
        results.append(run_model(spec, src, ref, args.threads))
        print_table(results[-1])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"test_sentences": len(src), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
