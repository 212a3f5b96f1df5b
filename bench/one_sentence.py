"""One sentence at a time on one thread, as the server's scheduler decodes: Tolk's engine against CTranslate2's, and
where Tolk's encoder time goes.

1. The shipped model's test sentences translated one at a time, greedy, int8 on both sides, offline, Tolk
   (`model.search.generate`, one row) and CTranslate2 (`translate_batch`, the model converted by
   bench/ct2_convert.py) alternating sentence by sentence: medians and the paired ratio.
2. The operator-by-operator encoder (`encode_cross` with the fused encoder off) of one sentence, int8 (fbgemm's
   products) against float32 (oneDNN's), alternating, median milliseconds by source length.
Prints tables and writes JSON. Never run by the test suite; needs the bench extra (ctranslate2).

    python bench/one_sentence.py [--sentences data/corpus/test.en] [--limit 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ct2_convert import TolkConverter, banned_pieces  # noqa: E402
from int8_products import cpu_flags  # noqa: E402

from model.checkpoint import LoadedModel, load  # noqa: E402
from model.marian_format import spm_pieces  # noqa: E402
from model.search import generate  # noqa: E402


def engines(model_dir: Path, loaded: LoadedModel, lines: list[str]) -> dict[str, Any]:
    import ctranslate2

    ct2_dir = Path(tempfile.mkdtemp()) / "ct2"
    TolkConverter(model_dir).convert(str(ct2_dir), force=True)
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="int8", inter_threads=1,
                                        intra_threads=1)
    config = loaded.generation.update(max_new_tokens=256, scores=False)
    pieces = loaded.tokenizer.vocab or spm_pieces(model_dir / "target.spm")
    ids = [loaded.tokenizer.encode(s) for s in lines]
    tokens = [[pieces[i] for i in s] for s in ids]
    suppress = [[p] for p in banned_pieces(model_dir)]
    options = {"beam_size": 1, "max_decoding_length": 256, "suppress_sequences": suppress}

    def tolk(i: int) -> float:
        start = time.perf_counter()
        generate(loaded.net, [ids[i]], config, max_rows=1)
        return time.perf_counter() - start

    def ct2(i: int) -> float:
        start = time.perf_counter()
        translator.translate_batch([tokens[i]], **options)
        return time.perf_counter() - start

    for i in range(min(10, len(ids))):  # warm-up
        tolk(i), ct2(i)
    times: dict[str, list[float]] = {"tolk": [], "ct2": []}
    for i in range(len(ids)):
        for name, run in (("tolk", tolk), ("ct2", ct2)) if i % 2 else (("ct2", ct2), ("tolk", tolk)):
            times[name].append(run(i))
    ratios = [t / c for t, c in zip(times["tolk"], times["ct2"], strict=True)]
    return {"sentences": len(ids), "tolk_median_ms": statistics.median(times["tolk"]) * 1e3,
            "ct2_median_ms": statistics.median(times["ct2"]) * 1e3, "paired_ratio_median": statistics.median(ratios),
            "source_tokens_median": statistics.median(len(s) for s in ids)}


def encoder(model_dir: Path, int8: LoadedModel, lines: list[str], rounds: int = 3) -> list[dict[str, Any]]:
    float32 = load(model_dir, device="cpu", dtype="float32")
    nets = {"int8": int8.net, "float32": float32.net}
    for net in nets.values():
        net.fused_encoder = None  # the operator path for every length
    ids = [int8.tokenizer.encode(s) for s in lines]
    times: dict[tuple[str, int], list[float]] = {}
    with torch.inference_mode():
        for s in ids[:20]:
            for net in nets.values():
                net.encode_cross(torch.tensor([s]))
        for r in range(rounds):
            for s in ids:
                order = list(nets.items()) if r % 2 else list(reversed(nets.items()))
                for name, net in order:
                    src = torch.tensor([s])
                    start = time.perf_counter()
                    net.encode_cross(src)
                    times.setdefault((name, len(s) // 8 * 8), []).append(time.perf_counter() - start)
    rows = []
    for low in sorted({k for _, k in times}):
        a, f = times[("int8", low)], times[("float32", low)]
        rows.append({"tokens": f"{low}-{low + 7}", "sentences": len(a) // rounds, "int8_ms": statistics.median(a) * 1e3,
                     "float32_ms": statistics.median(f) * 1e3})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=ROOT / "weights/en-pt")
    p.add_argument("--sentences", type=Path, default=ROOT / "data/corpus/test.en")
    p.add_argument("--limit", type=int, default=300)
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/one-sentence.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    lines = args.sentences.read_text(encoding="utf-8").splitlines()[:args.limit]
    int8 = load(args.model, device="cpu", dtype="int8")
    result: dict[str, Any] = {"cpu_flags": cpu_flags(), "threads": 1, "torch": torch.__version__,
                              "engines": engines(args.model, int8, lines), "encoder": encoder(args.model, int8, lines)}
    e = result["engines"]
    print(f"torch {torch.__version__}, 1 thread, CPU flags: {result['cpu_flags']}")
    print(f"\none sentence at a time, int8, {e['sentences']} sentences (median {e['source_tokens_median']} tokens):")
    print(f"  Tolk {e['tolk_median_ms']:.2f} ms, CTranslate2 {e['ct2_median_ms']:.2f} ms median; "
          f"Tolk / CTranslate2 paired {e['paired_ratio_median']:.2f}x")
    print(f"\nthe operator encoder, one sentence:\n{'tokens':>8}{'n':>5}{'int8 ms':>10}{'float32 ms':>12}")
    for row in result["encoder"]:
        print(f"{row['tokens']:>8}{row['sentences']:>5}{row['int8_ms']:>10.2f}{row['float32_ms']:>12.2f}")
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
