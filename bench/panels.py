"""float32 products in panels (`model.kernels._panel_rows`) against the dot products they replaced (`_rows1`,
`_rows2`), one thread, at the shipped model's product shapes and 1 to 32 rows.

Both compute y = x @ w.T + bias on the same random weights: the panels on `pack_panels`' copy, the dot products on
the weights as they are. Median microseconds of 5 rounds of 200 calls, the two alternating; the largest difference
from float64's product is printed for each. Prints a table and writes JSON. Never run by the test suite.

    python bench/panels.py [--out bench/results/panels.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from int8_products import cpu_flags  # noqa: E402

from model.kernels import _product_cols, _rows1, _rows2, pack_panels  # noqa: E402

# (outputs, inputs) of the shipped model's decoder products: Q/K/V, the attention outputs, feed-forward in and out,
# and the output projection over 8,000 pieces
SHAPES = [(768, 256), (256, 256), (1024, 256), (256, 1024), (8000, 256)]
ROWS = [1, 2, 4, 8, 16, 32]


def timed(call: Callable[[], None], calls: int = 200) -> float:
    """Microseconds per call."""
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/panels.json")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    rows_out = []
    print(f"{'outputs':>8}{'inputs':>8}{'rows':>6}{'dots us':>10}{'panels us':>11}{'ratio':>8}{'max error':>11}")
    for N, K in SHAPES:
        w = rng.standard_normal((N, K), dtype=np.float32)
        packed, bias, ones = pack_panels(w), rng.standard_normal(N, dtype=np.float32), np.ones(N, np.float32)
        off, none = np.zeros(4, np.float32), np.empty((0, 0), np.float32)
        for B in ROWS:
            x = rng.standard_normal((B, K), dtype=np.float32)
            y_dots, y_panels = np.empty((B, N), np.float32), np.empty((B, N), np.float32)
            dots = _rows1 if B == 1 else _rows2

            def run_dots() -> None:
                dots(x, w, ones, bias, np.float32(1.0), 0, y_dots, 0, N)  # noqa: B023

            def run_panels() -> None:
                _product_cols(x, packed, ones, bias, off, ones, 0, none, y_panels, 0, N)  # noqa: B023

            times: dict[str, list[float]] = {"dots": [], "panels": []}
            run_dots(), run_panels()  # compiled (or loaded from numba's cache) before timing
            for _ in range(5):
                times["dots"].append(timed(run_dots))
                times["panels"].append(timed(run_panels))
            exact = x.astype(np.float64) @ w.T.astype(np.float64) + bias
            d, q = statistics.median(times["dots"]), statistics.median(times["panels"])
            err = {name: float(np.abs(y - exact).max()) for name, y in (("dots", y_dots), ("panels", y_panels))}
            rows_out.append({"outputs": N, "inputs": K, "rows": B, "dots_us": d, "panels_us": q,
                             "dots_over_panels": d / q, "max_error": err})
            print(f"{N:>8}{K:>8}{B:>6}{d:>10.1f}{q:>11.1f}{d / q:>7.2f}x{err['panels']:>11.1e}")
    args.out.write_text(json.dumps({"cpu_flags": cpu_flags(), "threads": 1, "rows": rows_out}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
