"""The operator encoder's attention by length (model.kernels.attend_packed) against padding and SDPA with a mask.

Three measurements on the shipped model and its test split, old and new side by side in one process (the old way is
`model.frozen.attend_packed` set to None, as on a machine without numba):
1. the attention alone, one encoder layer over the sentences' real lengths (random Q, K and V), batch by batch;
2. `encode_packed` over the same sentences, the two ways alternating round by round (medians);
3. with `--check`: tokens and BLEU on the whole test split, greedy and beam 4, float32 and int8, batches of 32.
Prints a table and writes JSON. Never run by the test suite.

    python bench/encoder_attention.py [--limit 256] [--threads 2] [--check]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from int8_products import cpu_flags  # noqa: E402

import model.frozen as frozen  # noqa: E402
from model import checkpoint  # noqa: E402
from model.generation import GenerationConfig  # noqa: E402
from model.search import generate  # noqa: E402

NEW = frozen.attend_packed


def median_time(f: Callable[[], Any], n: int) -> float:
    f()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def padded(lengths: list[int]) -> torch.Tensor:
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.bool)
    for b, n in enumerate(lengths):
        mask[b, :n] = True
    return mask


def attention_alone(lengths: list[int], H: int, D: int, batch: int) -> dict[str, float]:
    """Seconds for one layer's attention over every batch of `batch` sentences: padded SDPA, and by length."""
    old = new = 0.0
    for i in range(0, len(lengths), batch):
        ls = lengths[i : i + batch]
        packing = frozen.Packing(padded(ls))
        qkv = torch.randn(sum(ls), 3 * D)

        def sdpa(ls: list[int] = ls, packing: frozen.Packing = packing, qkv: torch.Tensor = qkv) -> torch.Tensor:
            q, k, v = packing.pad(qkv).view(len(ls), max(ls), 3, H, -1).permute(2, 0, 3, 1, 4)
            return packing.pack(F.scaled_dot_product_attention(q, k, v, attn_mask=packing.attn_mask).transpose(1, 2))

        ns = np.array(ls, np.int64)
        starts = np.concatenate([[0], np.cumsum(ns)[:-1]]).astype(np.int64)
        out = np.empty((qkv.shape[0], D), np.float32)
        with torch.inference_mode():
            old += median_time(sdpa, 20)
            new += median_time(lambda: NEW(qkv.numpy(), starts, ns, H, out), 20)  # noqa: B023
    return {"batch": batch, "padded_sdpa_s": old, "by_length_s": new, "speedup": old / new}


def encode_rounds(net: Any, sources: list[list[int]], batch: int, rounds: int) -> dict[str, float]:
    batches = []
    for i in range(0, len(sources), batch):
        part = sources[i : i + batch]
        width = max(len(s) for s in part)
        batches.append(torch.tensor([s + [net.cfg.pad_id] * (width - len(s)) for s in part]))

    def run(on: bool) -> float:
        frozen.attend_packed = NEW if on else None
        start = time.perf_counter()
        with torch.inference_mode():
            for b in batches:
                net.encode_packed(b)
        return time.perf_counter() - start

    times: dict[bool, list[float]] = {True: [], False: []}
    run(True), run(False)
    for r in range(rounds):
        for on in (True, False) if r % 2 else (False, True):
            times[on].append(run(on))
    frozen.attend_packed = NEW
    old, new = statistics.median(times[False]), statistics.median(times[True])
    return {"batch": batch, "old_s": old, "new_s": new, "speedup": old / new}


def check(loaded: Any, dtype: str, sources: list[list[int]], refs: list[str]) -> list[dict[str, Any]]:
    import sacrebleu

    rows = []
    for beam in (1, 4):
        config = GenerationConfig(beam_size=beam, max_new_tokens=256, scores=False)
        outs: dict[bool, list[list[int]]] = {}
        for on in (True, False):
            frozen.attend_packed = NEW if on else None
            with torch.inference_mode():
                outs[on] = [h[0].tokens for i in range(0, len(sources), 32)
                            for h in generate(loaded.net, sources[i : i + 32], config, max_rows=32 * beam)]
        frozen.attend_packed = NEW
        bleu = {on: sacrebleu.corpus_bleu([loaded.tokenizer.decode(t) for t in outs[on]], [refs]).score
                for on in (True, False)}
        rows.append({"dtype": dtype, "beam": beam, "same": sum(a == b for a, b in zip(outs[True], outs[False],
                                                                                    strict=True)),
                     "of": len(sources), "bleu_new": round(bleu[True], 2), "bleu_old": round(bleu[False], 2)})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=ROOT / "weights" / "en-pt")
    p.add_argument("--src", type=Path, default=ROOT / "data" / "corpus" / "test.en")
    p.add_argument("--ref", type=Path, default=ROOT / "data" / "corpus" / "test.pt")
    p.add_argument("--limit", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--check", action="store_true", help="tokens and BLEU on the whole split (several minutes)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "encoder-attention.json")
    args = p.parse_args()
    if NEW is None:
        raise SystemExit("numba is not available: there is no by-length attention to measure")
    torch.set_num_threads(args.threads)
    lines = args.src.read_text(encoding="utf-8").splitlines()
    refs = args.ref.read_text(encoding="utf-8").splitlines()
    result: dict[str, Any] = {"cpu_flags": cpu_flags(), "threads": args.threads, "torch": torch.__version__,
                              "sentences": args.limit, "attention": [], "encode_packed": {}, "check": []}
    for dtype in ("float32", "int8"):
        loaded = checkpoint.load(args.model, dtype=dtype, keep_modules=True)  # the operator encoder it measures
        sources = [loaded.tokenizer.encode(s) for s in lines]
        cfg = loaded.net.cfg
        if dtype == "float32":
            lengths = [len(s) for s in sources[: args.limit]]
            for batch in (4, 8, 32, 64):
                result["attention"].append(attention_alone(lengths, cfg.n_heads, cfg.d_model, batch))
                print("attention alone", result["attention"][-1])
        result["encode_packed"][dtype] = [encode_rounds(loaded.net, sources[: args.limit], b, args.rounds)
                                          for b in (8, 32)]
        print("encode_packed", dtype, result["encode_packed"][dtype])
        if args.check:
            result["check"] += check(loaded, dtype, sources, refs)
            print("check", result["check"][-2:])
    print(f"\n{'what':32s} {'batch':>5s} {'old/new':>8s}")
    for row in result["attention"]:
        print(f"{'attention alone':32s} {row['batch']:5d} {row['speedup']:7.2f}x")
    for dtype, rows in result["encode_packed"].items():
        for row in rows:
            print(f"{'encode_packed ' + dtype:32s} {row['batch']:5d} {row['speedup']:7.2f}x")
    for row in result["check"]:
        print(f"{row['dtype']} beam {row['beam']}: same tokens {row['same']}/{row['of']}, BLEU {row['bleu_new']} "
              f"(old {row['bleu_old']})")
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
