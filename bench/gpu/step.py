"""The decoder step eager against CUDA graphs (model.graphs), per row count, on one model and dtype.

For each row count B: the ordinary step (`decode_step`, launched kernel by kernel from Python), the fixed-shape step
it records run eagerly, and the recorded graph's replay, each timed over --steps steps after a warm-up, rows at
mixed positions (as in a continuous batch). Prints a table and writes JSON. On the CPU (--device cpu) only the
eager rows run: a dry run of the script.

    python bench/gpu/step.py --model weights/en-pt --dtype float16 --out bench/results/step-cuda.json
    python bench/gpu/step.py --opus-mt --dtype float16        # bench/decode.py's OPUS-MT en-de geometry
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from decode import OPUS_MT_EN_DE  # noqa: E402

from model import checkpoint  # noqa: E402
from model.decode import DecodeBatch  # noqa: E402
from model.frozen import FrozenTransformer, freeze  # noqa: E402
from model.generation import GenerationConfig  # noqa: E402
from model.transformer import Transformer  # noqa: E402


def opus_mt_net(device: str, dtype: torch.dtype) -> FrozenTransformer:
    """bench/decode.py's OPUS-MT en-de geometry with random weights."""
    torch.manual_seed(0)
    return freeze(Transformer(OPUS_MT_EN_DE).to(device=device, dtype=dtype).eval())


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_steps(batch: DecodeBatch, steps: int, device: str, graphed: bool) -> list[float]:
    """Seconds per step of the batch's active rows (rows stay at their positions: the cache is rewound)."""
    net, cache, B = batch.net, batch.cache, batch.n
    pos0 = cache.pos.clone()
    bounds = (cache.t_lo, cache.t_hi)
    tokens = batch.state.last[:B]
    seconds = []
    with torch.inference_mode():
        for _ in range(steps):
            sync(device)
            start = time.perf_counter()
            if graphed and batch.graphed is not None:
                batch.graphed(tokens)
            else:
                net.decode_step(tokens, cache)
            sync(device)
            seconds.append(time.perf_counter() - start)
            cache.pos.copy_(pos0)
            cache.t_lo, cache.t_hi = bounds
    return seconds


def fill(batch: DecodeBatch, B: int, src_len: int, vocab: int) -> None:
    """B active rows of sources of src_len tokens, at positions 0..B-1 mod 24 (mixed ages, as when serving)."""
    g = torch.Generator().manual_seed(B)
    items = [((0, i), [*torch.randint(4, vocab, (src_len - 1,), generator=g).tolist(), 2],
              GenerationConfig(max_new_tokens=64)) for i in range(B)]
    batch.admit(items)
    batch.cache.pos[:B] = torch.arange(B, device=batch.cache.pos.device) % 24
    batch.cache.set_active(B)


def run(net: FrozenTransformer, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    cuda = args.device.startswith("cuda")
    for B in args.rows:
        batch = DecodeBatch(net, max(args.rows), args.src_len, 64, graphs=True)
        fill(batch, B, args.src_len, net.cfg.tgt_vocab_size)
        result: dict[str, Any] = {"rows": B}
        kinds = {"eager_ms": False, "graph_ms": True} if cuda else {"eager_ms": False, "fixed_eager_ms": True}
        for name, graphed in kinds.items():
            time_steps(batch, 3, args.device, graphed)  # warm-up
            result[name] = round(1e3 * statistics.median(time_steps(batch, args.steps, args.device, graphed)), 4)
        second = "graph_ms" if cuda else "fixed_eager_ms"
        result["speedup"] = round(result["eager_ms"] / result[second], 2)
        rows.append(result)
        print(result, flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="a model directory")
    source.add_argument("--opus-mt", action="store_true", help="bench/decode.py's OPUS-MT en-de geometry, random")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="float16", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    p.add_argument("--src-len", type=int, default=24)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    dtype = checkpoint.DTYPES[args.dtype]
    if args.model:
        net = checkpoint.load(args.model, device=args.device, dtype=args.dtype).net
    else:
        net = opus_mt_net(args.device, dtype)
    rows = run(net, args)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    model = str(args.model or "opus-mt-en-de geometry")
    print(f"\n{model}, {args.dtype}, {name}\n\n| rows | eager ms/step | graph ms/step | speedup |")
    print("|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['rows']} | {r['eager_ms']} | {r.get('graph_ms', r.get('fixed_eager_ms'))} | {r['speedup']} |")
    if args.out:
        meta = {"device": name, "torch": torch.__version__, "dtype": args.dtype,
                "model": model, "src_len": args.src_len, "steps": args.steps}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
