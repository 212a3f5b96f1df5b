"""The decode step's levers, measured side by side in one process (docs/experiments.md, "levers measured").

1. stages: where offline `generate` spends its time on real sentences (encoder, decoder step, search, packing rows).
2. encoder: real source tokens per second encoding one, 16 or 64 sentences at a time, with the padding ratio that
   the packed encoder (model.frozen.Packing) no longer computes.
3. argmax: torch's argmax against model.search.argmax (numpy's on the CPU), microseconds a call; and torch's topk
   against model.beams.top_k's chunk maxima, per vocabulary width.
4. scores: offline greedy with and without token log-probs (GenerationConfig.scores), same tokens.
5. memory: an OPUS-MT-geometry float32 model in a fresh process, before and after the modules' linear weights are
   released (measured first: memory freed later in the run stays with the allocator and would hide it).
6. per-row int8: fbgemm's dynamic product against the same product on rows scaled to their own maximum.

    python bench/levers.py [--model weights/en-pt] [--src data/corpus/test.en] [--threads 2]
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from decode import OPUS_MT_EN_DE

from model import beams, checkpoint, frozen, search
from model.decode import DecodeBatch
from model.generation import GenerationConfig
from model.transformer import Transformer


def per_call_us(fn: Callable[..., object], *args: Any, n: int = 500) -> float:
    for _ in range(20):
        fn(*args)
    start = time.perf_counter()
    for _ in range(n):
        fn(*args)
    return (time.perf_counter() - start) / n * 1e6


def padded(group: list[list[int]]) -> torch.Tensor:
    S = max(map(len, group))
    return torch.tensor([s + [0] * (S - len(s)) for s in group])


def stages(net: frozen.FrozenTransformer, sources: list[list[int]]) -> dict[str, float]:
    """Share of offline generate's time in each stage (timers wrapped around the methods, then put back)."""
    spent: collections.Counter[str] = collections.Counter()
    patched = [(frozen.FrozenTransformer, "encode_cross"), (frozen.FrozenTransformer, "decode_step"),
               (DecodeBatch, "remove"), (search, "step")]
    originals = [(owner, name, getattr(owner, name)) for owner, name in patched]

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - start
        return wrapper

    for owner, name, fn in originals:
        setattr(owner, name, timed(name, fn))
    try:
        config = GenerationConfig(max_new_tokens=256)
        start = time.perf_counter()
        search.generate(net, sources, config)
        total = time.perf_counter() - start
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)
    search_only = spent["step"] - spent["decode_step"] - spent["remove"]
    return {"seconds": round(total, 3), "sentences_per_s": round(len(sources) / total, 1),
            "encoder_pct": round(100 * spent["encode_cross"] / total, 1),
            "decoder_step_pct": round(100 * spent["decode_step"] / total, 1),
            "search_pct": round(100 * search_only / total, 1),
            "packing_rows_pct": round(100 * spent["remove"] / total, 1)}


def encoder(net: frozen.FrozenTransformer, sources: list[list[int]]) -> list[dict[str, float]]:
    rows = []
    real = sum(map(len, sources))
    for size in (1, 16, 64):
        groups = [padded(sources[i : i + size]) for i in range(0, len(sources), size)]
        net.encode_cross(groups[0])
        start = time.perf_counter()
        for g in groups:
            net.encode_cross(g)
        seconds = time.perf_counter() - start
        rows.append({"sentences_at_once": size, "real_tokens_per_s": round(real / seconds),
                     "padding_ratio": round(sum(g.numel() for g in groups) / real, 2)})
    return rows


def argmax_speed() -> list[dict[str, float]]:
    rows = []
    for B, V in ((32, 8000), (8, 58101), (32, 58101)):
        x = torch.randn(B, V)
        rows.append({"rows": B, "vocabulary": V, "torch_us": round(per_call_us(torch.argmax, x, -1), 1),
                     "chunked_us": round(per_call_us(search.argmax, x), 1)})
    return rows


def top_k_speed() -> list[dict[str, float]]:
    """torch's topk against the chunk maxima of model.beams.top_k (k = 8, beam 4's candidates), per width."""
    rows = []
    for B, V in ((4, 8000), (32, 8000), (4, 16000), (32, 16000), (4, 32000), (32, 32000), (4, 58101), (32, 58101)):
        x = torch.randn(B, V)
        rows.append({"rows": B, "vocabulary": V, "torch_us": round(per_call_us(torch.topk, x, 8, n=200), 1),
                     "chunked_us": round(per_call_us(beams.top_k, x, 8, 256, 0, n=200), 1)})  # min_size 0: chunks
    return rows


def scores(net: frozen.FrozenTransformer, sources: list[list[int]], repeats: int = 3) -> dict[str, float]:
    config = GenerationConfig(max_new_tokens=256)
    times: dict[bool, list[float]] = {True: [], False: []}
    outputs: dict[bool, list[list[int]]] = {}
    for _ in range(repeats):
        for keep in (True, False):
            start = time.perf_counter()
            out = search.generate(net, sources, config.update(scores=keep), max_rows=32)
            times[keep].append(time.perf_counter() - start)
            outputs[keep] = [h[0].tokens for h in out]
    with_s, without = statistics.median(times[True]), statistics.median(times[False])
    return {"with_scores_s": round(with_s, 3), "without_scores_s": round(without, 3),
            "speedup": round(with_s / without, 3), "same_tokens": outputs[True] == outputs[False]}


def resident_mb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def memory() -> dict[str, int]:
    gc.collect()
    start = resident_mb()
    model = Transformer(OPUS_MT_EN_DE).eval()
    gc.collect()
    modules = resident_mb() - start
    net = frozen.freeze(model)
    gc.collect()
    both = resident_mb() - start
    checkpoint.release_linear_weights(model)
    gc.collect()
    once = resident_mb() - start
    del net, model
    return {"modules_mb": modules, "modules_and_frozen_mb": both, "after_release_mb": once}


def own_rows(x: torch.Tensor, bias: torch.Tensor, packed: Any) -> torch.Tensor:
    """An int8 product whose rows keep their own numbers: each row scaled to its maximum, one fixed input scale."""
    m = torch.linalg.vector_norm(x, float("inf"), -1, keepdim=True)
    fixed = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32
    return torch.addcmul(bias, fixed(x / m, 1 / 63.5, 64, packed), m)


def per_row_int8() -> list[dict[str, Any]]:
    rows = []
    for out_f, in_f in ((768, 256), (256, 256)):
        linear = torch.nn.Linear(in_f, out_f)
        quantized = checkpoint.quantize_int8(torch.nn.Sequential(linear))[0]
        weight, bias = quantized.weight(), quantized.bias()
        with_bias = torch.ops.quantized.linear_prepack(weight, bias)
        no_bias = torch.ops.quantized.linear_prepack(weight, None)
        for B in (1, 32):
            x = torch.randn(B, in_f)
            rows.append({"product": f"{out_f}x{in_f}", "rows": B,
                         "dynamic_us": round(per_call_us(torch.ops.quantized.linear_dynamic, x, with_bias, True), 1),
                         "per_row_scale_us": round(per_call_us(own_rows, x, bias, no_bias), 1)})
    return rows


def table(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{title}")
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=Path("weights/en-pt"))
    p.add_argument("--src", type=Path, default=Path("data/corpus/test.en"))
    p.add_argument("--sentences", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("bench/results/levers.json"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    lines = args.src.read_text(encoding="utf-8").splitlines()[: args.sentences]
    result: dict[str, Any] = {"machine": {"cpu": platform.processor() or platform.machine(), "threads": args.threads,
                                          "torch": torch.__version__,
                                          "capability": torch.backends.cpu.get_cpu_capability()}}
    # First, in a fresh process: freed memory that the allocator keeps would hide what the release gives back.
    result["memory_opus_mt_float32"] = memory()
    with torch.inference_mode():
        for dtype in ("int8", "float32"):
            loaded = checkpoint.load(args.model, device="cpu", dtype=dtype)
            sources = [loaded.tokenizer.encode(line) for line in lines]
            search.generate(loaded.net, sources[:16], GenerationConfig(max_new_tokens=32))  # warm-up
            result[f"stages_{dtype}"] = stages(loaded.net, sources)
            result[f"encoder_{dtype}"] = encoder(loaded.net, sources)
            result[f"scores_{dtype}"] = scores(loaded.net, sources[:128])
        result["argmax"] = argmax_speed()
        result["top_k"] = top_k_speed()
        result["per_row_int8"] = per_row_int8()
    for dtype in ("int8", "float32"):
        table(f"offline generate, {dtype}, {args.sentences} sentences: share of time", [result[f"stages_{dtype}"]])
        table(f"encoder, {dtype}", result[f"encoder_{dtype}"])
        table(f"greedy with and without scores, {dtype}, 128 sentences, 32 rows", [result[f"scores_{dtype}"]])
    table("argmax, one call", result["argmax"])
    table("top-8, one call", result["top_k"])
    table("int8 product, dynamic against a scale per row", result["per_row_int8"])
    table("OPUS-MT geometry, float32, resident MB", [result["memory_opus_mt_float32"]])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
