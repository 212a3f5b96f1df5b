"""The decode step compiled whole by inductor against today's step, on the CPU (issue 18's first lever).

Today's step (`FrozenTransformer.decode_step`: prepacked oneDNN products, one-row plain GEMMs, SDPA) runs operator by
operator from Python. The compiled form is one graph per shape family: the same decoder layers written over plain
weights, compiled by `torch.compile` (inductor, weight freezing, `cpp_wrapper`, dynamic shapes), so Python and
dispatch leave the step and the elementwise work fuses. It reads the cache and returns the new token's K/V, which
are written outside in one indexed copy: a graph that writes into its input cache copies the whole buffer back
after every call (inductor functionalizes the write), a full read and write of the cache per token.

Printed: milliseconds per step of each at 1, 8 and 32 rows (median of repeated 48-step runs over a cache of growing
length, the compiled graph attending over a power-of-two bucket of positions), their ratio, the time of the first
call of each shape (compilation, with a fresh cache), and the largest difference of the logits.
JSON: bench/results/compiled-step.json.

    python bench/compiled_step.py [--model weights/en-pt] [--threads 1] [--rows 1 8 32]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch._inductor.config as inductor_config
import torch.nn.functional as F
from torch import Tensor, nn

from model import checkpoint
from model.transformer import Transformer

ROOT = Path(__file__).resolve().parents[1]
# A fresh compilation cache, so that the first call of each shape shows the real compile time
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="tolk-inductor-")
S, T_MAX, STEPS = 24, 128, 48


class CompiledStep(nn.Module):
    """A pre-norm decoder step over plain weights: what inductor compiles (weights as frozen parameters)."""

    def __init__(self, m: Transformer) -> None:
        super().__init__()
        self.H, self.scale = m.cfg.n_heads, m.scale

        def p(t: Tensor) -> nn.Parameter:
            return nn.Parameter(t.detach().clone(), requires_grad=False)

        self.table, self.positions, self.out_w = p(m.tgt_embed.weight), p(m.positions), p(m.out_proj.weight)
        self.final = m.decoder_norm
        self.layers = nn.ModuleList()
        for layer in m.decoder:
            a, c = layer.self_attn, layer.cross_attn
            f = nn.Module()
            f.qkv_w = p(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
            f.qkv_b = p(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
            f.o_w, f.o_b = p(a.out_proj.weight), p(a.out_proj.bias)
            f.cq_w, f.cq_b = p(c.q_proj.weight), p(c.q_proj.bias)
            f.co_w, f.co_b = p(c.out_proj.weight), p(c.out_proj.bias)
            f.f1_w, f.f1_b = p(layer.ff.fc1.weight), p(layer.ff.fc1.bias)
            f.f2_w, f.f2_b = p(layer.ff.fc2.weight), p(layer.ff.fc2.bias)
            f.norms = nn.ModuleList([layer.self_res.norm, layer.cross_res.norm, layer.ff_res.norm])
            self.layers.append(f)

    def forward(self, tokens: Tensor, pos: Tensor, self_kv: Tensor, cross_kv: Tensor, src_mask: Tensor
                ) -> tuple[Tensor, Tensor]:
        """tokens, pos (B,); self_kv (L, 2, B, H, T, Dh), positions < pos real; cross_kv (L, 2, B, H, S, Dh);
        src_mask (B, S) -> logits (B, V) and the new token's K/V (L, B, 2, H, Dh)."""
        B, T = tokens.shape[0], self_kv.shape[4]
        x = F.embedding(tokens, self.table) * self.scale + self.positions[pos]  # (B, D)
        past = (torch.arange(T) < pos[:, None])[:, None, :]  # (B, 1, T)
        cross_mask = src_mask[:, None, None, :]
        new = []
        for i, f in enumerate(self.layers):
            q, k, v = F.linear(f.norms[0](x), f.qkv_w, f.qkv_b).view(B, 3, self.H, -1).unbind(1)  # (B, H, Dh)
            new.append(torch.stack([k, v], 1))
            q = q * q.shape[-1] ** -0.5
            scores = torch.einsum("bhd,bhtd->bht", q, self_kv[i, 0]).masked_fill(~past, float("-inf"))
            probs = torch.cat([scores, (q * k).sum(-1, keepdim=True)], -1).softmax(-1)  # the new token last
            a = torch.einsum("bht,bhtd->bhd", probs[..., :T], self_kv[i, 1]) + probs[..., T:] * v
            x = F.linear(a.reshape(B, -1), f.o_w, f.o_b) + x
            q = F.linear(f.norms[1](x), f.cq_w, f.cq_b).view(B, self.H, 1, -1)
            a = F.scaled_dot_product_attention(q, cross_kv[i, 0], cross_kv[i, 1], attn_mask=cross_mask)
            x = F.linear(a.reshape(B, -1), f.co_w, f.co_b) + x
            x = F.linear(F.relu(F.linear(f.norms[2](x), f.f1_w, f.f1_b)), f.f2_w, f.f2_b) + x
        return F.linear(self.final(x), self.out_w), torch.stack(new)


def bucket(t: int) -> int:
    return max(16, 1 << t.bit_length())


def timed_runs(run: Callable[[], Tensor], reps: int) -> tuple[float, Tensor]:
    """Median ms per step over reps runs of STEPS steps, and the last run's final logits."""
    times, logits = [], torch.empty(0)
    for _ in range(reps):
        start = time.perf_counter()
        logits = run()
        times.append((time.perf_counter() - start) / STEPS * 1e3)
    return statistics.median(times), logits


def measure(lm: checkpoint.LoadedModel, compiled: Callable[..., tuple[Tensor, Tensor]], B: int, reps: int
            ) -> dict[str, float]:
    cfg, net = lm.model.cfg, lm.net
    L, H, Dh = cfg.decoder_layers, cfg.n_heads, cfg.head_dim
    cross = torch.randn(L, 2, B, H, S, Dh, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(B, S, dtype=torch.bool)
    rows = torch.arange(B)

    def today() -> Tensor:
        cache = net.new_cache(B, S, T_MAX)
        cache.admit(0, cross, mask)
        tokens = torch.full((B,), 5)
        for _ in range(STEPS):
            logits = net.decode_step(tokens, cache)
            tokens = logits.argmax(-1)
        return logits

    def graph() -> Tensor:
        self_kv = torch.zeros(L, 2, B, H, T_MAX, Dh)
        tokens = torch.full((B,), 5)
        for t in range(STEPS):
            pos = torch.full((B,), t)
            logits, new = compiled(tokens, pos, self_kv[:, :, :, :, : bucket(t)], cross, mask)
            self_kv[:, :, rows, :, pos] = new.permute(1, 0, 2, 3, 4)  # (B, L, 2, H, Dh) into its place
            tokens = logits.argmax(-1)
        return logits

    start = time.perf_counter()
    graph()  # compiles the shapes it meets
    first = time.perf_counter() - start
    ms_today, ms_graph = [], []
    for _ in range(2):  # alternating, twice
        a, want = timed_runs(today, reps)
        b, got = timed_runs(graph, reps)
        ms_today.append(a)
        ms_graph.append(b)
    return {"rows": B, "today_ms": min(ms_today), "compiled_ms": min(ms_graph),
            "ratio": min(ms_today) / min(ms_graph), "first_call_s": first,
            "max_logit_diff": float((want - got).abs().max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "weights" / "en-pt")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "compiled-step.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lm = checkpoint.load(args.model, device="cpu", dtype="float32")
    if lm.model.cfg.norm != "pre":
        raise SystemExit("this comparison writes the pre-norm step only")
    inductor_config.freezing = True
    inductor_config.cpp_wrapper = True
    compiled = torch.compile(CompiledStep(lm.model).eval(), dynamic=True, fullgraph=True)
    results = []
    print(f"{args.model.name}, float32, {args.threads} thread(s), sources of {S} tokens, {STEPS} steps")
    print("| rows | today ms/step | compiled ms/step | today / compiled | first call s | max logit diff |")
    print("|---:|---:|---:|---:|---:|---:|")
    with torch.inference_mode():
        for B in args.rows:
            r = measure(lm, compiled, B, args.reps)
            results.append(r)
            print(f"| {B} | {r['today_ms']:.3f} | {r['compiled_ms']:.3f} | {r['ratio']:.2f} | "
                  f"{r['first_call_s']:.1f} | {r['max_logit_diff']:.1e} |", flush=True)
    args.out.write_text(json.dumps({"model": str(args.model.name), "threads": args.threads, "torch": torch.__version__,
                                    "cpu": platform.processor() or platform.machine(), "results": results},
                                   indent=2) + "\n")


if __name__ == "__main__":
    main()
