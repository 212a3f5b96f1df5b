"""The fused CPU decode step (model/fused_step.py) against the operator-by-operator step, side by side in one process.

1. step: milliseconds of one decoder step at 1 to 128 rows, the two steps alternating (median of 3 rounds of 25 steps
   each), int8 with the model's fixed input ranges and float32. With more than one torch thread, also the fused step
   in one run (not cut: neither into runs of rows, `FusedStep.split_min_rows`, nor into parts of each product,
   `FusedStep.parts_max_rows`).
2. sentences: translating test sentences one at a time (greedy, as one request at a time reaches the server's
   engine), milliseconds per sentence, the two steps alternating per block of sentences; and how many sentences
   come out with the same tokens from both, and the same one at a time as in batches of 32 rows.

    python bench/fused_step.py [--model weights/en-pt] [--src data/corpus/test.en] [--sentences 200] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# the server's process settings, which hold only if made before torch loads (model/runtime.py)
from model import runtime  # noqa: E402, I001
runtime.configure()
import torch  # noqa: E402
from int8_products import cpu_flags  # noqa: E402

from model import checkpoint  # noqa: E402
from model.decode import DecodeBatch  # noqa: E402
from model.generation import GenerationConfig  # noqa: E402
from model.search import generate  # noqa: E402

ROWS = (1, 2, 4, 8, 16, 32, 64, 128)


def step_ms(lm: checkpoint.LoadedModel, sources: list[list[int]], rows: int, fused: bool, cut: bool = True) -> float:
    """Median time of a decoder step of `rows` rows (positions 5 to 30, every row decoding); `cut` off: the fused
    step's rows in one run."""
    net, fused_step = lm.net, lm.net.fused
    assert fused_step is not None
    saved, split, parts = fused_step.max_rows, fused_step.split_min_rows, fused_step.parts_max_rows
    fused_step.max_rows = rows if fused else 0
    fused_step.split_min_rows = split if cut else rows + 1
    fused_step.parts_max_rows = parts if cut else 0
    config = GenerationConfig(max_new_tokens=40, min_new_tokens=40, scores=False)
    batch = DecodeBatch(net, rows, max(map(len, sources)), 40)
    batch.admit([((0, i), sources[i % len(sources)], config) for i in range(rows)])
    times = []
    for n in range(30):
        start = time.perf_counter()
        logits, _ = batch.forward()
        batch.record(logits.argmax(-1))
        if n >= 5:
            times.append(time.perf_counter() - start)
    fused_step.max_rows, fused_step.split_min_rows, fused_step.parts_max_rows = saved, split, parts
    return 1000 * statistics.median(times)


def one_at_a_time(lm: checkpoint.LoadedModel, sources: list[list[int]], fused: bool) -> tuple[float, list[list[int]]]:
    """Milliseconds per sentence translated alone (greedy), and the tokens."""
    fused_step = lm.net.fused
    assert fused_step is not None
    saved = fused_step.max_rows
    fused_step.max_rows = saved if fused else 0
    config = lm.generation.update(scores=False)
    batch = DecodeBatch(lm.net, 1, max(map(len, sources)), config.max_new_tokens)
    start = time.perf_counter()
    tokens = [generate(lm.net, [s], config, batch=batch)[0][0].tokens for s in sources]
    fused_step.max_rows = saved
    return 1000 * (time.perf_counter() - start) / len(sources), tokens


def measure(model: Path, dtype: str, lines: list[str]) -> dict[str, Any]:
    lm = checkpoint.load(model, device="cpu", dtype=dtype, keep_modules=False)
    if lm.net.fused is None or not lm.net.fused.ready():
        raise SystemExit(f"{model} in {dtype}: the fused step does not apply (no numba, or int8 without int8.json)")
    sources = [lm.tokenizer.encode(line) for line in lines]
    out: dict[str, Any] = {"step_ms": {}}
    threads = torch.get_num_threads()
    for rows in ROWS:
        rounds = [(step_ms(lm, sources, rows, True), step_ms(lm, sources, rows, False),
                   step_ms(lm, sources, rows, True, cut=False) if threads > 1 else math.nan) for _ in range(3)]
        fused, plain, one_run = (min(r[i] for r in rounds) for i in range(3))
        out["step_ms"][rows] = {"fused": round(fused, 3), "operators": round(plain, 3),
                                "speedup": round(plain / fused, 2)}
        cut = ""
        if threads > 1:
            out["step_ms"][rows] |= {"fused_one_run": round(one_run, 3), "cut_speedup": round(one_run / fused, 2)}
            cut = f"; in one run {one_run:6.3f} ms ({one_run / fused:.2f}x)"
        print(f"{dtype:>8} step, {rows:>3} rows: fused {fused:6.3f} ms, operator by operator {plain:6.3f} ms, "
              f"{plain / fused:.2f}x{cut}", flush=True)
    one_at_a_time(lm, sources[:10], True)  # warm-up
    blocks = [sources[i: i + 50] for i in range(0, len(sources), 50)]
    spent = {True: 0.0, False: 0.0}
    tokens: dict[bool, list[list[int]]] = {True: [], False: []}
    for block in blocks:  # alternate per block, so that a change in the machine's speed hits both alike
        for fused in (True, False):
            ms, got = one_at_a_time(lm, block, fused)
            spent[fused] += ms * len(block)
            tokens[fused] += got
    batched = [h[0].tokens for h in generate(lm.net, sources, lm.generation.update(scores=False), max_rows=32)]
    n = len(sources)
    out["sentence_ms"] = {"fused": round(spent[True] / n, 2), "operators": round(spent[False] / n, 2),
                          "speedup": round(spent[False] / spent[True], 2)}
    out["same_tokens_fused_vs_operators"] = sum(a == b for a, b in zip(tokens[True], tokens[False], strict=True))
    out["same_tokens_alone_vs_32_rows"] = sum(a == b for a, b in zip(tokens[True], batched, strict=True))
    out["sentences"] = n
    print(f"{dtype:>8} one sentence at a time: fused {spent[True] / n:.2f} ms, operator by operator "
          f"{spent[False] / n:.2f} ms ({spent[False] / spent[True]:.2f}x); same tokens: fused vs operator step "
          f"{out['same_tokens_fused_vs_operators']}/{n}, alone vs in 32 rows {out['same_tokens_alone_vs_32_rows']}/{n}",
          flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=ROOT / "weights" / "en-pt")
    p.add_argument("--src", type=Path, default=ROOT / "data" / "corpus" / "test.en")
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument("--threads", type=int, default=1, help="torch threads (the server's default on 2 cores: 1)")
    p.add_argument("--dtypes", default="int8,float32")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "fused-step.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lines = args.src.read_text(encoding="utf-8").splitlines()[: args.sentences]
    results = {dtype: measure(args.model, dtype, lines) for dtype in args.dtypes.split(",")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "model": str(args.model), "threads": args.threads, "cpu": platform.processor() or platform.machine(),
        "cpu_flags": cpu_flags(),
        "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
