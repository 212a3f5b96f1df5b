"""Which int8 product could replace fbgemm's dynamic quantization, side by side in one process.

The CPU default (int8) runs every linear layer through `quantized::linear_dynamic` (fbgemm), which quantizes the
activations with one scale per call: every row's rounding depends on the rest of the batch, so a sentence's
translation depends on what shares its step. Products whose rows stay their own are weight-only int8
(`torch._weight_int8pack_mm`, float activations) and int8 x int8 with per-row scales (`torch._int_mm`). This times
each against fbgemm and a float32 `addmm` for the products of the shipped model's decoder step, at 1 and 32 rows,
one thread. Prints a table and writes JSON. Never run by the test suite.

    python bench/int8_products.py [--threads 1] [--out bench/results/int8-products.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
# (out, in) of the products of one decoder layer and the output projection of the shipped model
SHAPES = [(768, 256), (256, 256), (1024, 256), (256, 1024), (8000, 256)]


def per_call_us(f: Callable[[], object], calls: int = 300) -> float:
    """Median time of one call, after a warm-up."""
    for _ in range(20):
        f()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def products(out_features: int, in_features: int, rows: int) -> dict[str, float]:
    """Microseconds per call of each way to compute x @ W.T (+ b) for x of `rows` rows."""
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized = torch.ao.quantization.quantize_dynamic(nn.Sequential(linear), {nn.Linear}, dtype=torch.qint8)[0]
    packed = quantized._packed_params._packed_params
    w = linear.weight.detach()
    scales = w.abs().amax(1) / 127  # per output channel
    w_int8 = (w / scales[:, None]).round().clamp(-127, 127).to(torch.int8)
    w_int8_t = w_int8.t().contiguous()
    w_t, bias = w.t().contiguous(), linear.bias.detach()
    x = torch.randn(rows, in_features)
    x_int8 = torch.randint(-127, 128, (rows, in_features), dtype=torch.int8)
    return {
        "fbgemm_dynamic": per_call_us(lambda: torch.ops.quantized.linear_dynamic(x, packed, True)),
        "weight_int8pack_mm": per_call_us(lambda: torch._weight_int8pack_mm(x, w_int8, scales)),
        "int_mm": per_call_us(lambda: torch._int_mm(x_int8, w_int8_t)),
        "float32_addmm": per_call_us(lambda: torch.addmm(bias, x, w_t)),
    }


def cpu_flags() -> str:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor()
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("Flags")), [])
    return " ".join(f for f in flags if f.startswith(("avx", "amx")) or "vnni" in f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "int8-products.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows_out = []
    print(f"torch {torch.__version__}, {args.threads} thread(s), CPU flags: {cpu_flags()}")
    print(f"{'out x in':>11} {'rows':>4} {'fbgemm us':>10} {'int8pack us':>12} {'_int_mm us':>11} {'f32 us':>8}")
    for out_features, in_features in SHAPES:
        for rows in (1, 32):
            t = products(out_features, in_features, rows)
            rows_out.append({"out": out_features, "in": in_features, "rows": rows, **{k: round(v, 1) for k, v in
                                                                                        t.items()}})
            print(f"{out_features:>5}x{in_features:<5} {rows:>4} {t['fbgemm_dynamic']:>10.1f} "
                  f"{t['weight_int8pack_mm']:>12.1f} {t['int_mm']:>11.1f} {t['float32_addmm']:>8.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"torch": torch.__version__, "threads": args.threads, "cpu_flags": cpu_flags(),
                                    "rows": rows_out}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
