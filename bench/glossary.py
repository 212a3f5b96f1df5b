"""Glossaries on the shipped model's test split: are the terms in the outputs, what else changes, what it costs.

The glossary is built from the split itself: a source word and a target word that occur in the same sentence pairs
far more often than apart (Dice coefficient over sentence pairs) make an entry, as a localiser's term list pairs a
product's words with their agreed translations. Every test sentence is translated twice with the offline engine
(the server's continuous batching, `model.search.generate`, in chunks), without and with the glossary's terms as
constraints (found by `server.glossaries.Glossary.constraints`, as the server finds them). Prints a table and writes
JSON. A third variant gives the engine each term's source positions (`Glossary.placed`): a greedy row then also
starts a term where it attends to the term's source words (model.constraints.ALIGNED_MARGIN).

    python bench/glossary.py [--model weights/en-pt] [--dtype int8] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from collections import Counter
from pathlib import Path

import torch

from model import checkpoint
from model.generation import GenerationConfig
from model.search import generate
from server.glossaries import Glossary, GlossaryInfo

WORD = re.compile(r"[^\W\d_]{4,}")  # words of 4 letters or more: short ones are mostly function words


def words(line: str) -> set[str]:
    return {w.lower() for w in WORD.findall(line)}


def term_pairs(src: list[str], ref: list[str], min_count: int, min_dice: float) -> list[tuple[str, str]]:
    """(source word, target word) pairs that occur together in at least min_count sentence pairs with a Dice
    coefficient of at least min_dice: the target word each source word goes with best."""
    s_sets, t_sets = [words(s) for s in src], [words(t) for t in ref]
    fs, ft = Counter(w for s in s_sets for w in s), Counter(w for t in t_sets for w in t)
    both = Counter((a, b) for s, t in zip(s_sets, t_sets, strict=True) for a in s if fs[a] >= min_count
                   for b in t if ft[b] >= min_count)
    best: dict[str, tuple[float, str]] = {}
    for (a, b), n in both.items():
        dice = 2 * n / (fs[a] + ft[b])
        if n >= min_count and dice >= min_dice and dice > best.get(a, (0.0, ""))[0]:
            best[a] = (dice, b)
    return sorted((a, b) for a, (_, b) in best.items() if a != b)  # a word kept as it is needs no glossary


Placed = list[list[int]] | None  # per term, the source positions it translates


def decode(loaded: checkpoint.LoadedModel, sources: list[list[int]], config: GenerationConfig,
           constraints: list[list[list[list[int]]] | None] | None, placed: list[Placed] | None = None,
           ) -> tuple[list[str], float]:
    start = time.perf_counter()
    hyps = generate(loaded.net, sources, config, max_rows=32, constraints=constraints, constraint_sources=placed)
    seconds = time.perf_counter() - start
    return [loaded.tokenizer.decode(h[0].tokens) for h in hyps], seconds


VARIANTS = ("without_glossary", "with_glossary", "with_glossary_aligned")


def decode_all(loaded: checkpoint.LoadedModel, sources: list[list[int]], config: GenerationConfig,
               constraints: list[list[list[list[int]]] | None], placed: list[Placed], chunk: int, repeats: int,
               ) -> tuple[dict[str, list[str]], dict[str, float]]:
    """Outputs and seconds without the constraints, with them, and with them started where the model attends to
    their source words, chunk by chunk, taking turns; a chunk's time is the fastest of `repeats` runs. (On a shared
    machine other work slowed single runs 10 to 50 times.)"""
    outs: dict[str, list[str]] = {v: [] for v in VARIANTS}
    seconds = dict.fromkeys(VARIANTS, 0.0)
    for a in range(0, len(sources), chunk):
        best = dict.fromkeys(VARIANTS, math.inf)
        for r in range(repeats):
            for v in VARIANTS:
                text, t = decode(loaded, sources[a:a + chunk], config,
                                 constraints[a:a + chunk] if v != "without_glossary" else None,
                                 placed[a:a + chunk] if v == "with_glossary_aligned" else None)
                best[v] = min(best[v], t)
                if r == 0:
                    outs[v] += text
        for v in VARIANTS:
            seconds[v] += best[v]
    return outs, seconds


def chrf(hyps: list[str], refs: list[str]) -> float:
    import sacrebleu  # training/eval extra

    return round(sacrebleu.CHRF().corpus_score(hyps, [refs]).score, 2) if hyps else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=Path("weights/en-pt"))
    p.add_argument("--dtype", default="int8", help="the server's CPU default")
    p.add_argument("--src", type=Path, default=Path("data/corpus/test.en"))
    p.add_argument("--ref", type=Path, default=Path("data/corpus/test.pt"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--min-count", type=int, default=4)
    p.add_argument("--min-dice", type=float, default=0.6)
    p.add_argument("--limit", type=int, default=0, help="translate only the first N sentences (the glossary is "
                   "still built from the whole split)")
    p.add_argument("--chunk", type=int, default=250, help="sentences decoded at once (with and without in turn)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each chunk; its fastest is kept")
    p.add_argument("--out", type=Path, default=Path("bench/results/glossary.json"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    src = args.src.read_text(encoding="utf-8").splitlines()
    ref = args.ref.read_text(encoding="utf-8").splitlines()
    pairs = term_pairs(src, ref, args.min_count, args.min_dice)
    glossary = Glossary(GlossaryInfo("bench", "test split", "en", "pt", "", len(pairs)), pairs)
    if args.limit:
        src, ref = src[: args.limit], ref[: args.limit]
    loaded = checkpoint.load(args.model, device="cpu", dtype=args.dtype)
    tok = loaded.tokenizer
    sources = [tok.encode(s)[:256] for s in src]
    matched = [glossary.match(s) for s in src]
    found = [glossary.placed(s, tok, ids) for s, ids in zip(src, sources, strict=True)]
    constraints: list[list[list[list[int]]] | None] = [terms or None for terms, _ in found]
    placed: list[Placed] = [where if terms else None for terms, where in found]
    config = loaded.generation
    decode(loaded, sources[:32], config, constraints[:32])  # warm-up
    outs, seconds = decode_all(loaded, sources, config, constraints, placed, args.chunk, args.repeats)
    plain = outs["without_glossary"]

    def present(outs: list[str]) -> float:
        """The share of terms found whose target form is in the output, as given or with a capital first letter
        (where it begins the sentence): what a constraint asks for."""
        hits = [t in o or t[0].upper() + t[1:] in o for o, m in zip(outs, matched, strict=True) for t in m]
        return round(100 * sum(hits) / len(hits), 2)

    def at_end(outs: list[str]) -> float:
        """The share of terms the model did not write itself that end up last in the sentence (after its final
        punctuation, or as its last word): where a term forced at the end of the sentence lands."""
        moved = [(o, t) for o, p, m in zip(outs, plain, matched, strict=True) for t in m
                 if t.lower() not in p.lower()]
        last = [re.sub(r"\W+$", "", o).lower().endswith(t.lower()) for o, t in moved]
        return round(100 * sum(last) / max(len(last), 1), 2)

    with_terms = [i for i, m in enumerate(matched) if m]
    without = [i for i, m in enumerate(matched) if not m]
    refs_without = [ref[i] for i in without]
    result = {
        "model": str(args.model), "dtype": args.dtype, "threads": args.threads, "beam_size": config.beam_size,
        "timing": f"chunks of {args.chunk} sentences (max 32 rows), the variants in turn, fastest of "
                  f"{args.repeats} runs each",
        "sentences": len(src), "glossary_entries": len(pairs), "sentences_with_terms": len(with_terms),
        "term_occurrences": sum(len(m) for m in matched),
        "sentences_with_term_positions": sum(p is not None for p in placed),
        "terms_present_pct": {v: present(outs[v]) for v in VARIANTS},
        "terms_not_the_models_own_written_last_pct": {v: at_end(outs[v]) for v in VARIANTS},
        "chrf_sentences_without_terms": {**{v: chrf([outs[v][i] for i in without], refs_without) for v in VARIANTS},
                                         "identical_outputs": sum(plain[i] == outs["with_glossary"][i] == outs[
                                             "with_glossary_aligned"][i] for i in without)},
        "chrf_sentences_with_terms": {v: chrf([outs[v][i] for i in with_terms], [ref[i] for i in with_terms])
                                      for v in VARIANTS},
        "chrf_all": {v: chrf(outs[v], ref) for v in VARIANTS},
        "sentences_per_s": {v: round(len(src) / seconds[v], 1) for v in VARIANTS},
        "examples": [{"source": src[i], "terms": matched[i], **{v: outs[v][i] for v in VARIANTS}}
                     for i in with_terms if plain[i] != outs["with_glossary"][i]][:12],
        "aligned_changed": sum(outs["with_glossary"][i] != outs["with_glossary_aligned"][i] for i in with_terms),
        "aligned_examples": [{"source": src[i], "terms": matched[i], "with_glossary": outs["with_glossary"][i],
                              "with_glossary_aligned": outs["with_glossary_aligned"][i]} for i in with_terms
                             if outs["with_glossary"][i] != outs["with_glossary_aligned"][i]][:16],
        "entries_sample": pairs[:40],
    }
    print(f"glossary: {len(pairs)} entries; {len(with_terms)} of {len(src)} sentences hold "
          f"{result['term_occurrences']} term occurrences\n")
    print(f"{'':<44}{'without':>10}{'with':>10}{'aligned':>10}")
    rows = [("terms present in outputs (%)", result["terms_present_pct"]),
            ("terms not the model's own, last (%)", result["terms_not_the_models_own_written_last_pct"]),
            ("chrF, sentences without terms", result["chrf_sentences_without_terms"]),
            ("chrF, sentences with terms", result["chrf_sentences_with_terms"]),
            ("chrF, all", result["chrf_all"]), ("sentences/s", result["sentences_per_s"])]
    for name, r in rows:
        print(f"{name:<44}" + "".join(f"{r[v]:>10}" for v in VARIANTS))
    print(f"\nsentences without terms whose output is identical in all three: "
          f"{result['chrf_sentences_without_terms']['identical_outputs']} of {len(without)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
