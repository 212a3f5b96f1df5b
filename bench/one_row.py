"""One-row products: a plain GEMM against prepacked oneDNN, side by side in one process.

The frozen network runs a product of one row and a small weight as a plain GEMM (model/projection.py,
ONE_ROW_PLAIN_MAX) because a prepacked oneDNN call has a fixed cost that dominates there. This measures that
choice where it matters, batch-1 greedy decoding in float32: (1) every product's time at one row through both
paths, for the shipped model's shapes and the OPUS-MT geometry's; (2) the decode step of the shipped model with
the plain one-row path on and off, alternating, with the same outputs. Prints tables and writes JSON. Never run
by the test suite.

    python bench/one_row.py [--model weights/en-pt] [--threads 1 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model.checkpoint import load  # noqa: E402
from model.frozen import FrozenTransformer  # noqa: E402
from model.projection import ONE_ROW_PLAIN_MAX, Projection  # noqa: E402

# (out, in) of the products of one decoder layer and the output projection
SHAPES = {"shipped (width 256)": [(768, 256), (256, 256), (1024, 256), (256, 1024), (8000, 256)],
          "OPUS-MT en-de (width 512)": [(1536, 512), (512, 512), (2048, 512), (512, 2048), (58101, 512)]}


def per_call_us(proj: Projection, x: torch.Tensor, calls: int, repeats: int = 5) -> float:
    """Median over repeats of the mean time of one proj(x), after a warm-up."""
    for _ in range(20):
        proj(x)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            proj(x)
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def products() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for geometry, shapes in SHAPES.items():
        for out_features, in_features in shapes:
            linear = nn.Linear(in_features, out_features)
            proj = Projection([linear])
            x = torch.randn(1, in_features)
            calls = 100 if out_features * in_features > 4_000_000 else 1000
            proj.one_row = linear.weight.detach().t().contiguous()  # the plain path, whatever the weight's size
            plain = per_call_us(proj, x, calls)
            proj.one_row = None
            onednn = per_call_us(proj, x, calls)
            rows.append({"geometry": geometry, "weight": f"{out_features}x{in_features}", "plain_us": plain,
                         "onednn_us": onednn, "plain_used": out_features * in_features <= ONE_ROW_PLAIN_MAX})
    return rows


def projections(net: FrozenTransformer) -> list[Projection]:
    layers: list[object] = [*net.encoder, *net.decoder]
    found = [p for layer in layers for p in vars(layer).values() if isinstance(p, Projection)]
    return found + [net.out, net.cross_kv_proj]


@torch.inference_mode()
def decode_steps(net: FrozenTransformer, src: torch.Tensor, start_id: int, steps: int) -> list[int]:
    """Greedy decoding of one sentence for `steps` tokens (end-of-sentence not honoured): the tokens."""
    cache = net.new_cache(1, src.shape[1], steps + 1)
    memory, mask = net.encode(src)
    cache.admit(0, net.cross_kv(memory), mask)
    token, out = torch.tensor([start_id]), []
    for _ in range(steps):
        token = net.decode_step(token, cache).argmax(-1)
        out.append(int(token))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=ROOT / "weights" / "en-pt")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--passes", type=int, default=51)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "one-row.json")
    args = p.parse_args()
    loaded = load(args.model, device="cpu", dtype="float32")
    net = loaded.net
    projs = projections(net)
    kept = {id(q): q.one_row for q in projs}
    src = torch.tensor([loaded.tokenizer.encode("The connection to the server was lost and could not be restored.")])
    start_id = loaded.model.cfg.decoder_start_id
    per_threads: dict[str, Any] = {}
    result = {"model": str(args.model), "torch": torch.__version__, "threads": per_threads}
    for threads in args.threads:
        torch.set_num_threads(threads)
        rows = products()
        print(f"\n{threads} thread(s): one product of one row, microseconds per call")
        print(f"{'geometry':<26} {'weight':>10} {'plain':>8} {'oneDNN':>8} {'oneDNN/plain':>12} {'used':>6}")
        for r in rows:
            print(f"{r['geometry']:<26} {r['weight']:>10} {r['plain_us']:8.1f} {r['onednn_us']:8.1f} "
                  f"{r['onednn_us'] / r['plain_us']:12.2f} {'plain' if r['plain_used'] else 'oneDNN':>6}")
        times: dict[bool, list[float]] = {True: [], False: []}
        outputs: dict[bool, list[int]] = {}
        for _ in range(args.passes):
            for on in (False, True):
                for q in projs:
                    q.one_row = kept[id(q)] if on else None
                start = time.perf_counter()
                outputs[on] = decode_steps(net, src, start_id, args.steps)
                times[on].append((time.perf_counter() - start) / args.steps * 1e3)
        for q in projs:
            q.one_row = kept[id(q)]
        plain, onednn = statistics.median(times[True]), statistics.median(times[False])
        same = outputs[True] == outputs[False]
        print(f"shipped model, batch-1 greedy, ms per step (median of {args.passes}, alternating): plain one-row "
              f"{plain:.3f}, oneDNN only {onednn:.3f}: {onednn / plain:.2f}x; same tokens: {same}")
        per_threads[str(threads)] = {"products": rows, "step_ms_plain_one_row": plain,
                                     "step_ms_onednn_only": onednn, "speedup": onednn / plain,
                                     "same_tokens": same}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
