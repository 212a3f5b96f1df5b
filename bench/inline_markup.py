"""Inline HTML on the shipped model's test split: elements translated in context against node by node.

Each test sentence that holds a glossary word (the word pairs `bench/glossary.py` finds in the split: a source word
and the target word that go together far more often than apart) becomes a page: `<p>` around the sentence, `<b>`
around that word, and `<a href="#">` around its last word when that is another one. Every page is translated two
ways with the offline engine (`model.search.generate`, the server's continuous batching):
- node by node: each text node alone, as `format: html` did before (and LibreTranslate does);
- in context: `server.plan.make_plan(html=True)`, the sentence whole, its elements put back by alignment.
Reported: pages whose tags all came back once and well nested; the share of elements whose word's glossary
translation, when the output has it exactly once, is inside the element (a check of placement that needs no
hand-made alignment); chrF of the pages' text against the references, beside the sentences translated without
markup; and sentences/s of the same sentences decoded with and without alignment. Prints a table, writes JSON.

    python bench/inline_markup.py [--model weights/en-pt] [--dtype int8] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter
from html import escape
from pathlib import Path

import torch
from glossary import chrf, term_pairs

from model import checkpoint
from model.events import Hypothesis
from model.generation import GenerationConfig
from model.search import generate
from server import inline
from server.plan import join, make_plan
from server.text import split_html


def page(sentence: str, term: str) -> str | None:
    """The sentence as a page with its term in <b> and its last word in a link; None without the term as a word."""
    m = re.search(rf"\b{re.escape(term)}\b", sentence, re.IGNORECASE)
    if m is None:
        return None
    words = list(re.finditer(r"[^\W_]+", sentence))
    last = words[-1] if words and words[-1].start() >= m.end() else None
    out = escape(sentence[: m.start()]) + "<b>" + escape(m.group()) + "</b>"
    if last is None:
        return f"<p>{out}{escape(sentence[m.end():])}</p>"
    return (f"<p>{out}{escape(sentence[m.end():last.start()])}<a href=\"#\">{escape(last.group())}</a>"
            f"{escape(sentence[last.end():])}</p>")


def text_of(document: str) -> str:
    return " ".join("".join(c for is_text, c in split_html(document) if is_text).split())


def well_formed(out: str, source: str) -> bool:
    """Every tag of the source once, inline elements nested."""
    marks = [c for is_text, c in split_html(out) if not is_text]
    if Counter(marks) != Counter(c for is_text, c in split_html(source) if not is_text):
        return False
    stack: list[str] = []
    for content in marks:
        kind, name = inline._tag(content)
        if kind == "open":
            stack.append(name)
        elif kind == "close" and (not stack or stack.pop() != name):
            return False
    return not stack


def inside(out: str, target: str) -> bool | None:
    """Whether the one occurrence of the target word is inside <b>...</b>; None when it is not there once."""
    plain = text_of(out)
    if len(re.findall(rf"\b{re.escape(target)}\b", plain, re.IGNORECASE)) != 1:
        return None
    bold = re.search(r"<b>(.*?)</b>", out, re.DOTALL)
    return bold is not None and re.search(rf"\b{re.escape(target)}\b", bold.group(1), re.IGNORECASE) is not None


def bold_words(document: str) -> int:
    bold = re.search(r"<b>(.*?)</b>", document, re.DOTALL)
    return len(text_of(bold.group(1)).split()) if bold else 0


def translate(loaded: checkpoint.LoadedModel, sources: list[list[int]], configs: list[GenerationConfig]
              ) -> tuple[list[Hypothesis], float]:
    start = time.perf_counter()
    with torch.inference_mode():
        hyps = generate(loaded.net, sources, configs, max_rows=32)
    return [h[0] for h in hyps], time.perf_counter() - start


def node_by_node(loaded: checkpoint.LoadedModel, pages: list[str]) -> list[str]:
    """Each text node translated alone, escaped, between the page's markup: the former `format: html`."""
    segments = [split_html(p) for p in pages]
    nodes = [c for segs in segments for is_text, c in segs if is_text]
    plan = make_plan(nodes, loaded.tokenizer, html=False, max_source_tokens=256)
    best, _ = translate(loaded, plan.sources, [loaded.generation] * len(plan.sources))
    done = iter(join(plan, t, dict(enumerate(best)), loaded.tokenizer) for t in range(len(nodes)))
    return ["".join(escape(next(done), quote=False) if is_text else c for is_text, c in segs) for segs in segments]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=Path("weights/en-pt"))
    p.add_argument("--dtype", default="int8", help="the server's CPU default")
    p.add_argument("--src", type=Path, default=Path("data/corpus/test.en"))
    p.add_argument("--ref", type=Path, default=Path("data/corpus/test.pt"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="timed runs with and without alignment, in turn")
    p.add_argument("--limit", type=int, default=0, help="only the first N pages")
    p.add_argument("--out", type=Path, default=Path("bench/results/inline-markup.json"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    src = args.src.read_text(encoding="utf-8").splitlines()
    ref = args.ref.read_text(encoding="utf-8").splitlines()
    pairs = dict(term_pairs(src, ref, 4, 0.6))
    cases = []
    for s, r in zip(src, ref, strict=True):
        term = next((w for w in re.findall(r"[^\W\d_]{4,}", s) if w.lower() in pairs), None)
        doc = page(s, term) if term is not None else None
        if doc is not None and term is not None:
            cases.append((s, r, doc, pairs[term.lower()]))
    cases = cases[: args.limit or None]
    loaded = checkpoint.load(args.model, device="cpu", dtype=args.dtype)
    tok = loaded.tokenizer
    pages = [c[2] for c in cases]
    refs = [c[1] for c in cases]

    plan = make_plan(pages, tok, html=True, max_source_tokens=256)
    aligned = loaded.generation.update(alignment=True)
    configs = [aligned if s in plan.markup else loaded.generation for s in range(len(plan.sources))]
    best, _ = translate(loaded, plan.sources, configs)
    in_context = [join(plan, t, dict(enumerate(best)), tok) for t in range(len(pages))]
    by_node = node_by_node(loaded, pages)
    plain_plan = make_plan([c[0] for c in cases], tok, html=False, max_source_tokens=256)
    plain_best, _ = translate(loaded, plain_plan.sources, [loaded.generation] * len(plain_plan.sources))
    plain = [join(plain_plan, t, dict(enumerate(plain_best)), tok) for t in range(len(cases))]

    seconds: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for align in (False, True):
            seconds[align].append(translate(loaded, plan.sources, [aligned if align else loaded.generation]
                                            * len(plan.sources))[1])

    def report(outs: list[str]) -> dict[str, object]:
        placed = [inside(o, c[3]) for o, c in zip(outs, cases, strict=True)]
        known = [x for x in placed if x is not None]
        return {"well_formed_pct": round(100 * sum(well_formed(o, d) for o, d in zip(outs, pages, strict=True))
                                         / len(pages), 2),
                "term_inside_its_element_pct": round(100 * sum(known) / max(len(known), 1), 2),
                "elements_checked": len(known),
                "words_in_b_per_source_word": round(sum(bold_words(o) for o in outs)
                                                    / max(sum(bold_words(d) for d in pages), 1), 3),
                "chrf_text": chrf([text_of(o) for o in outs], refs)}

    result = {
        "model": str(args.model), "dtype": args.dtype, "threads": args.threads, "pages": len(pages),
        "node_by_node": report(by_node), "in_context": report(in_context),
        "plain_sentences_chrf": chrf(plain, refs),
        "in_context_text_equals_plain_pct": round(100 * sum(text_of(o) == " ".join(p.split()) for o, p in
                                                             zip(in_context, plain, strict=True)) / len(pages), 2),
        "sentences_per_s": {"without_alignment": round(len(plan.sources) / min(seconds[False]), 1),
                            "with_alignment": round(len(plan.sources) / min(seconds[True]), 1)},
        "timing": f"the pages' {len(plan.sources)} sentences, max 32 rows, fastest of {args.repeats} runs each, "
                  "with and without alignment in turn",
        "examples": [{"page": d, "node_by_node": n, "in_context": c}
                     for d, n, c in zip(pages, by_node, in_context, strict=True)][:12],
        "text_unlike_plain": [{"page": d, "in_context": c, "plain": p} for d, c, p in
                              zip(pages, in_context, plain, strict=True) if text_of(c) != " ".join(p.split())][:12],
    }
    print(f"{len(pages)} pages of the test split, a glossary word in <b>, the last word in a link\n")
    print(f"{'':<44}{'node by node':>14}{'in context':>12}")
    for key, name in (("well_formed_pct", "pages with every tag once, nested (%)"),
                      ("term_inside_its_element_pct", "term's translation inside its <b> (%)"),
                      ("elements_checked", "  elements checked"),
                      ("words_in_b_per_source_word", "words in <b> per source word"),
                      ("chrf_text", "chrF of the pages' text")):
        print(f"{name:<44}{result['node_by_node'][key]!s:>14}{result['in_context'][key]!s:>12}")  # type: ignore[index]
    print(f"\nchrF of the sentences without markup: {result['plain_sentences_chrf']}; in context, text equal to "
          f"theirs: {result['in_context_text_equals_plain_pct']}%")
    print(f"sentences/s without / with alignment: {result['sentences_per_s']['without_alignment']} / "
          f"{result['sentences_per_s']['with_alignment']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
