"""Where one offline `generate` call spends its time, batch by batch, as bench/engines.py calls it.

On the H100, Tolk's engine did not scale past one sentence at a time on the test split (docs/experiments.md, "On an
NVIDIA H100"), while the same engine scaled on forced-length batches. This times the same calls, eager and with
CUDA graphs, stage by stage (encoder, decoder step, search, packing rows; the device synchronised around each stage
so time lands where it is spent), counts steps, and profiles one call with torch.profiler (the top operators by
host and by device time). Prints tables and writes JSON and the profiler's tables as text.

    python bench/gpu/stages.py --src data/corpus/test.en --out bench/results/profile-cuda
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from model import checkpoint, search  # noqa: E402
from model import frozen as frozen_module  # noqa: E402
from model.decode import DecodeBatch  # noqa: E402
from model.generation import GenerationConfig  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def staged(net: frozen_module.FrozenTransformer, jobs: list[list[list[int]]], config: GenerationConfig,
           batch: DecodeBatch | None) -> dict[str, Any]:
    """Run every job through generate with timers (and a device sync) around each stage."""
    spent: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    patched = [(frozen_module.FrozenTransformer, "encode_cross"), (DecodeBatch, "forward"),
               (DecodeBatch, "remove"), (search, "step")]
    originals = [(owner, name, getattr(owner, name)) for owner, name in patched]

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            sync(net.device)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                sync(net.device)
                spent[name] += time.perf_counter() - start
                calls[name] += 1
        return wrapper

    for owner, name, fn in originals:
        setattr(owner, name, timed(name, fn))
    try:
        sync(net.device)
        start = time.perf_counter()
        for job in jobs:
            search.generate(net, job, config, max_rows=len(job) * config.beam_size, batch=batch)
        sync(net.device)
        total = time.perf_counter() - start
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)
    steps = calls["step"]
    return {"seconds": round(total, 4), "calls": len(jobs), "steps": steps,
            "ms_per_step": round(1e3 * total / max(steps, 1), 3),
            "encoder_ms": round(1e3 * spent["encode_cross"], 1),
            "decoder_step_ms": round(1e3 * spent["forward"], 1),
            "search_ms": round(1e3 * (spent["step"] - spent["forward"] - spent["remove"]), 1),
            "packing_rows_ms": round(1e3 * spent["remove"], 1),
            "outside_steps_ms": round(1e3 * (total - spent["step"] - spent["encode_cross"]), 1)}


def profiled(net: frozen_module.FrozenTransformer, job: list[list[int]], config: GenerationConfig) -> str:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if net.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        search.generate(net, job, config, max_rows=len(job) * config.beam_size)
        sync(net.device)
    averages = prof.key_averages()
    text = "by host time\n" + averages.table(sort_by="self_cpu_time_total", row_limit=25)
    if net.device.type == "cuda":
        text += "\nby device time\n" + averages.table(sort_by="self_device_time_total", row_limit=25)
    return str(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=ROOT / "weights/en-pt")
    p.add_argument("--src", type=Path, required=True, help="sentences, one per line")
    p.add_argument("--sentences", type=int, default=64)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="float16", choices=list(checkpoint.PRECISIONS))
    p.add_argument("--beam", type=int, default=1, help="beam size (each sentence takes this many rows)")
    p.add_argument("--out", type=Path, default=None, help="writes OUT.json and OUT-profile.txt")
    args = p.parse_args()
    loaded = checkpoint.load(args.model, device=args.device, dtype=args.dtype)
    net, tok = loaded.net, loaded.tokenizer
    lines = args.src.read_text(encoding="utf-8").splitlines()[: args.sentences]
    sources = [tok.encode(line)[:256] for line in lines]
    config = GenerationConfig(max_new_tokens=loaded.generation.max_new_tokens, scores=False,  # as bench/workers.py
                              beam_size=args.beam)
    rows, text = [], ""
    for size in args.batches:
        jobs = [sources[i : i + size] for i in range(0, len(sources), size)]
        graphed = DecodeBatch(net, size * args.beam, 256, config.max_new_tokens, graphs=True)
        # "eager-again" repeats the eager pass over the same sentences: every shape has been seen once, so a cost
        # paid per new shape (kernel selection, plans) shows as the difference between the two
        for mode, batch in (("eager", None), ("eager-again", None), ("graphs", graphed)):
            if mode != "eager-again":
                staged(net, jobs[:1], config, batch)  # warm-up
            rows.append({"batch": size, "mode": mode, **staged(net, jobs, config, batch)})
            print(rows[-1], flush=True)
        text += f"\n=== one generate call of {size} sentences, beam {args.beam}, eager\n"
        text += profiled(net, jobs[0], config)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"device": torch.cuda.get_device_name() if net.device.type == "cuda" else "cpu",
                "torch": torch.__version__, "dtype": args.dtype, "model": str(args.model), "beam": args.beam}
        args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
        Path(f"{args.out}-profile.txt").write_text(text)


if __name__ == "__main__":
    main()
