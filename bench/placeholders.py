"""Placeholders through the model: survival and invention by kind, and chrF, for each way of handling them.

Two sets: the strings of the test split that hold placeholders (`server/placeholders.py:find`, with the symbols the
model cannot write), and a generated set (`generated_set`): ordinary UI sentences with a placeholder of every kind
at their start, in their middle and at their end, the issue's strings among them. Each is translated with each
option: nothing done; "verbatim" (the server's choice: the kinds the model copies shown as they are, the others as
`{N}`) or every placeholder masked as a numbered token (`{N}`, `%N$s`, `XN`), each put back with no repair (what
the model wrote, invented placeholders and all), with a repair at the aligned place, or at the end; and the
sentence split at its placeholders, the pieces between them translated alone. "exact" is the share of strings whose
output holds exactly the source's placeholders (as a multiset: none lost, none repeated, none invented); "kept" the
share of placeholders found as often as in the source; "invented" the placeholders an output has that its source
lacks, by kind. chrF is on the placeholder strings, and on the whole split with those strings replaced by the
option's output. Prints tables and writes JSON.

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

from model import checkpoint  # isort: skip  (before torch: its OpenMP threads would spin)
import sacrebleu
import torch

from model.evaluate import translate_lines
from server import masks
from server import placeholders as ph

Opaque = Callable[[str], bool] | None


def kept_by_kind(source: str, output: str, opaque: Opaque = None) -> Counter[tuple[str, bool]]:
    """(kind, kept) of each placeholder of source: kept when its text is in output as often as in source."""
    found = ph.find(source, opaque)
    counts = Counter(p.text for p in found)
    return Counter((p.kind, output.count(p.text) == counts[p.text]) for p in found)


def invented_by_kind(source: str, output: str, opaque: Opaque = None) -> Counter[str]:
    """The kinds of the placeholders output has beyond source's (a text more often than in the source counts)."""
    extra = Counter(p.text for p in ph.find(output, opaque)) - Counter(p.text for p in ph.find(source, opaque))
    out: Counter[str] = Counter()
    for p in ph.find(output, opaque):
        if extra[p.text]:
            extra[p.text] -= 1
            out[p.kind] += 1
    return out


SENTENCES = ["Open the file", "Could not save the document", "Delete all messages in the folder",
             "Send a private message to the user", "Copy the selected files", "The download has finished",
             "Connect to the server", "Rename the folder before closing", "Show the password",
             "Check for updates now"]
SAMPLES = ["%s", "%d", "%1$s", "%(name)s", "%1", "{0}", "{name}", "{}", "{ $folder }", "{count, plural, one {# file} "
           "other {# files}}", "$HOME", "${XDG_DATA_HOME}", "<b>now</b>", "<br/>", "<nick>", "[<channel>]", "&amp;",
           "https://example.org/help", "help@example.org", "/usr/share/tolk", "~/models", "\x02", "🎉", "✅",
           "👨\u200d👩\u200d👧", "\u200d", "\u200b", "\ufeff", "\u202eRTL\u202c", "\u2028", "€", "°C"]
ISSUE = ["copied message id = { $id } to { $folder }", "Delete all messages and subfolders in the { $folder } folder?",
         "Delete %d files from {folder}?", "{ $commandName } <nick> <message>: Send a private message to a user",
         "🎉 Congratulations!", "Open 😀 file", "Saved ✅"]


def generated_set() -> list[str]:
    """Every sample placeholder at the start, in the middle and at the end of every sentence, and the issue's."""
    out = list(ISSUE)
    for sentence in SENTENCES:
        words = sentence.split()
        for sample in SAMPLES:
            out += [f"{sample} {sentence}.", " ".join([*words[:2], sample, *words[2:]]) + ".", f"{sentence} {sample}"]
    return out


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


def options(translate: Callable[[list[str]], list[str]], sources: list[str], opaque: Opaque,
            styles: tuple[masks.MaskStyle, ...] = masks.STYLES) -> dict[str, list[str]]:
    """Each option's outputs for the sources. Translated on their own, as every option is: int8's dynamic
    quantization makes a sentence's output depend a little on its batch, which would blur the comparison."""
    out: dict[str, list[str]] = {"no handling": translate(sources)}
    for style in styles:
        masked = [masks.mask(s, style, opaque) for s in sources]
        raw = translate([m.text for m in masked])
        for repair in ("none", "aligned", "end"):
            out[f"mask {style.name}, repair {repair}"] = [
                masks.unmask(m, o, repair) for m, o in zip(masked, raw, strict=True)]
    if styles == masks.STYLES:
        out["split at placeholders"] = split_option(translate, sources)
    return out


def rows_of(sources: list[str], outputs: dict[str, list[str]], opaque: Opaque, refs: list[str] | None = None,
            whole: list[str] | None = None, subset: list[int] | None = None) -> list[dict[str, object]]:
    chrf = sacrebleu.CHRF()
    rows = []
    for name, outs in outputs.items():
        kept: Counter[tuple[str, bool]] = Counter()
        invented: Counter[str] = Counter()
        exact = 0
        for s, o in zip(sources, outs, strict=True):
            kept += kept_by_kind(s, o, opaque)
            invented += invented_by_kind(s, o, opaque)
            exact += Counter(p.text for p in ph.find(o, opaque)) == Counter(p.text for p in ph.find(s, opaque))
        kinds = sorted({kind for kind, _ in kept})
        row: dict[str, object] = {
            "option": name,
            "strings_exact_pct": round(100 * exact / len(sources), 2),
            "kept_pct_by_kind": {k: round(100 * kept[(k, True)] / (kept[(k, True)] + kept[(k, False)]), 1)
                                 for k in kinds},
            "invented": sum(invented.values()),
            "invented_by_kind": dict(invented),
        }
        if refs is not None and whole is not None and subset is not None:
            full = list(whole)
            for i, o in zip(subset, outs, strict=True):
                full[i] = o
            row["chrf_placeholder_strings"] = round(chrf.corpus_score(outs, [[refs[i] for i in subset]]).score, 2)
            row["chrf_whole_split"] = round(chrf.corpus_score(full, [refs]).score, 2)
        rows.append(row)
    return rows


def run_model(spec: str, src: list[str], ref: list[str], threads: int) -> dict[str, object]:
    path, _, precision = spec.partition(":")
    loaded = checkpoint.load(path, device="cpu", dtype=precision or "float32")

    def translate(lines: list[str]) -> list[str]:
        return translate_lines(loaded.net, loaded.tokenizer, lines, loaded.generation)

    def opaque(char: str) -> bool:  # as the server's plan asks the tokenizer
        return not loaded.tokenizer.writes(char)

    subset = [i for i, s in enumerate(src) if ph.find(s, opaque)]
    sub_src = [src[i] for i in subset]
    start = time.perf_counter()
    whole = translate(src)
    seconds = time.perf_counter() - start
    # the server takes out of a sentence without placeholders what the model invents there that begins with a sign
    cleaned = [ph.clean(o, plain=True) for o in whole]
    generated = generated_set()
    return {
        "model": spec, "threads": threads, "strings": len(sub_src), "whole_split_seconds": round(seconds, 1),
        "placeholders_by_kind": dict(Counter(p.kind for s in sub_src for p in ph.find(s, opaque))),
        "plain_strings_with_invented": sum(1 for i, o in enumerate(whole) if i not in set(subset)
                                           and invented_by_kind(src[i], o)),
        "rows": rows_of(sub_src, options(translate, sub_src, opaque), opaque, ref, cleaned, subset),
        "generated": {"strings": len(generated),
                      "placeholders_by_kind": dict(Counter(p.kind for s in generated for p in ph.find(s, opaque))),
                      "rows": rows_of(generated, options(translate, generated, opaque, (masks.VERBATIM,)), opaque)},
    }


def print_table(title: str, rows: list[dict[str, object]]) -> None:
    print(f"\n{title}")
    print(f"{'option':<36}{'exact':>8}{'invented':>9}{'chrF ph':>9}{'chrF all':>9}  kept by kind / invented by kind")
    for r in rows:
        chrf = f"{r.get('chrf_placeholder_strings', '-'):>9}{r.get('chrf_whole_split', '-'):>9}"
        print(f"{r['option']:<36}{r['strings_exact_pct']:>8}{r['invented']:>9}{chrf}  {r['kept_pct_by_kind']} / "
              f"{r['invented_by_kind']}")


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
        r = run_model(spec, src, ref, args.threads)
        results.append(r)
        generated = r["generated"]
        assert isinstance(generated, dict)
        print_table(f"{spec}: {r['strings']} test-split strings with placeholders {r['placeholders_by_kind']}; "
                    f"plain strings with an invented one: {r['plain_strings_with_invented']}", r["rows"])  # type: ignore[arg-type]
        print_table(f"{spec}: {generated['strings']} generated strings", generated["rows"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"test_sentences": len(src), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
