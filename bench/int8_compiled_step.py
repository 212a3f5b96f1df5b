"""The decode step statically quantized to int8 and compiled whole, against today's eager int8 step (issue 18).

`bench/compiled_step.py` found the compiled float32 step 1.17x today's at one row, and inductor unable to lower
fbgemm's int8 products. This measures the int8 route inductor does lower on x86: the same step over plain weights
(`compiled_step.CompiledStep`) exported, quantized by torchao's PT2E flow with `X86InductorQuantizer` (static
activation scales calibrated on a few steps, per-channel int8 weights: oneDNN's quantized linear with fused
quantize/dequantize), and compiled by inductor (weight freezing, `cpp_wrapper`). The graph has fixed shapes: it
attends over the whole 64-position cache buffer with a mask, the shape a CUDA graph or an AOT-compiled step would
have. Today's step is `FrozenTransformer.decode_step` on the model loaded in int8 (fbgemm, fixed input ranges).
The compiled float32 step on the same fixed shapes is timed beside them.

Printed: microseconds per step at each row count (48 steps from an empty cache, fastest of several runs, the
variants alternating) and the compile time. JSON: bench/results/int8-compiled-step.json. Needs torchao, which is
not in the bench extra (this lever was not kept): `pip install torchao==0.18.0` (0.15 does not import with torch
2.13).

    python bench/int8_compiled_step.py [--model weights/en-pt] [--threads 1] [--rows 1 8 32]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch._inductor.config as inductor_config
from compiled_step import CompiledStep

from model import checkpoint

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="tolk-inductor-"))
S, T, STEPS = 24, 64, 48


def quantized(step: CompiledStep, args: tuple[torch.Tensor, ...], calibration: int = 8) -> torch.nn.Module:
    """The step exported and statically quantized by torchao's x86 inductor quantizer (not yet compiled)."""
    try:
        import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    except ImportError as exc:
        raise SystemExit(f"bench/int8_compiled_step.py needs torchao (pip install torchao==0.18.0): {exc}") from exc

    exported = torch.export.export(step, args).module()
    quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(exported, quantizer)  # type: ignore[arg-type]
    tokens, _, self_kv, cross, mask = args
    g = torch.Generator().manual_seed(1)
    for t in range(calibration):  # a few steps of random states: the scales matter little to the speed measured
        prepared(torch.randint(4, step.table.shape[0], tokens.shape, generator=g), torch.full_like(tokens, t),
                 torch.randn(self_kv.shape, generator=g), cross, mask)
    return convert_pt2e(prepared)  # type: ignore[no-any-return]


def per_step_us(run: Callable[[], torch.Tensor], reps: int) -> tuple[float, torch.Tensor]:
    best, logits = float("inf"), torch.empty(0)
    for _ in range(reps):
        start = time.perf_counter()
        logits = run()
        best = min(best, (time.perf_counter() - start) / STEPS * 1e6)
    return best, logits


def measure(lm8: checkpoint.LoadedModel, graphs: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]],
            B: int, reps: int) -> dict[str, float]:
    cfg, net = lm8.model.cfg, lm8.net
    L, H, Dh = cfg.decoder_layers, cfg.n_heads, cfg.head_dim
    cross = torch.randn(L, 2, B, H, S, Dh, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(B, S, dtype=torch.bool)
    rows = torch.arange(B)

    def today() -> torch.Tensor:
        cache = net.new_cache(B, S, T)
        cache.admit(0, cross, mask)
        tokens = torch.full((B,), 5)
        for _ in range(STEPS):
            logits = net.decode_step(tokens, cache)
            tokens = logits.argmax(-1)
        return logits

    def graph(name: str) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            self_kv = torch.zeros(L, 2, B, H, T, Dh)
            tokens = torch.full((B,), 5)
            for t in range(STEPS):
                pos = torch.full((B,), t)
                logits, new = graphs[name](tokens, pos, self_kv, cross, mask)
                self_kv[:, :, rows, :, pos] = new.permute(1, 0, 2, 3, 4)
                tokens = logits.argmax(-1)
            return logits
        return run

    out: dict[str, float] = {"rows": B}
    for _, run in [("today_int8", today)] + [(n, graph(n)) for n in graphs]:
        run()  # compiles (or warms up) what it meets
    for _ in range(2):  # alternating, twice
        for name, run in [("today_int8", today)] + [(n, graph(n)) for n in graphs]:
            us, _ = per_step_us(run, reps)
            out[f"{name}_us"] = min(us, out.get(f"{name}_us", float("inf")))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "weights" / "en-pt")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "int8-compiled-step.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lm32 = checkpoint.load(args.model, device="cpu", dtype="float32")
    lm8 = checkpoint.load(args.model, device="cpu", dtype="int8")
    if lm32.model.cfg.norm != "pre":
        raise SystemExit("this comparison writes the pre-norm step only")
    inductor_config.freezing = True
    inductor_config.cpp_wrapper = True
    cfg = lm32.model.cfg
    results = []
    print(f"{args.model.name}, {args.threads} thread(s), sources of {S} tokens, a {T}-position cache, {STEPS} steps")
    print("| rows | today int8 us/step | compiled int8 us/step | compiled float32 us/step | today / compiled int8 "
          "| compile s (int8, float32) |")
    print("|---:|---:|---:|---:|---:|---:|")
    with torch.no_grad():
        for B in args.rows:
            step = CompiledStep(lm32.model).eval()
            example = (torch.full((B,), 5), torch.full((B,), 3),
                       torch.zeros(cfg.decoder_layers, 2, B, cfg.n_heads, T, cfg.head_dim),
                       torch.zeros(cfg.decoder_layers, 2, B, cfg.n_heads, S, cfg.head_dim),
                       torch.ones(B, S, dtype=torch.bool))
            seconds = {}
            graphs = {}
            for name, module in (("compiled_int8", quantized(step, example)), ("compiled_float32", step)):
                start = time.perf_counter()
                graphs[name] = torch.compile(module, fullgraph=True)
                graphs[name](*example)
                seconds[name] = time.perf_counter() - start
            r = measure(lm8, graphs, B, args.reps)
            r.update({f"{k}_compile_s": round(v, 1) for k, v in seconds.items()})
            results.append(r)
            print(f"| {B} | {r['today_int8_us']:.0f} | {r['compiled_int8_us']:.0f} | {r['compiled_float32_us']:.0f} | "
                  f"{r['today_int8_us'] / r['compiled_int8_us']:.2f} | {seconds['compiled_int8']:.0f}, "
                  f"{seconds['compiled_float32']:.0f} |", flush=True)
    from importlib.metadata import version

    args.out.write_text(json.dumps({"model": str(args.model.name), "threads": args.threads, "torch": torch.__version__,
                                    "torchao": version("torchao"), "cpu": platform.processor() or platform.machine(),
                                    "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
