"""The CPU encoder as one compiled loop nest (numba), with the cross-attention K/V of every decoder layer: what
`FrozenTransformer.encode_cross` computes, without PyTorch's cost per operator.

The operator-by-operator encoder of a short sentence is mostly fixed costs: 25 products whose cost per call
dominates at a few rows, and a few dozen small operators. Measured on the shipped model (one thread, the 2-core AVX2
EPYC, the two alternating in one process, ad hoc scripts):
- float32: this encoder was faster at every length up to 28 tokens (1.2-1.9x); with its products in panels
  (`model.kernels._panel_rows`, 2026-11-27, an AVX-512 EPYC, one thread) it is faster at every length measured,
  1.7x at up to 7 tokens, 1.35x at 16-23, 1.1-1.3x at 40-100, so every sentence is encoded here;
- int8 through AVX2's byte products (`model.kernels._dot_u8s8`): faster at every length, one sentence at a time
  (2.1x at up to 7 tokens, 1.4x at 16-23, 1.0x at 100), so every sentence is encoded here. Admissions of many
  sentences are cut over the torch threads (`SPLIT_MIN_TOKENS`): a batch of 32 test sentences took 0.59x the
  operator encoder's speed on 2 threads when it ran on one;
- int8 without AVX2 (float arithmetic on int8 weights): faster up to about 10 tokens only, so `MAX_TOKENS_INT8`.
Each sentence goes the way its own length says, whatever else is admitted with it, and its rows are computed on
their own: a sentence's numbers never depend on its neighbours' or on how an admission is cut.

Products are the fused decode step's (`model.kernels._product`): float32 as they are; int8 with the same int8
weights and fixed input ranges as fbgemm's, exact integer sums scaled as fbgemm scales them (per output channel
here, as the encoder's weights are quantized). Attention runs over each sentence's own tokens
(`attend_packed`, which the operator-by-operator encoder on the CPU uses too).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import Tensor

from model.fused_step import MAX_WEIGHT_BYTES, _weights, at_once, input_ranges
from model.kernels import ACTIVATIONS, INT8_DOT, encode_parts, encoder_shared_size, pack_weights, weight_sums
from model.kernels import encode as _encode
from model.native import Bound
from model.torch_ops import QuantizedLinear

if TYPE_CHECKING:
    from model.frozen import FrozenTransformer
    from model.layers import DecoderLayer, EncoderLayer
    from model.projection import Projection
    from model.transformer import Transformer

MAX_TOKENS_INT8 = 8  # sentences of at most this many tokens are encoded here in int8 without AVX2; else every one
SPLIT_MIN_TOKENS = 64  # admissions of at least this many tokens are cut over the torch threads
PRODUCTS = ("qkv", "o", "fc1", "fc2")


class FusedEncoder:
    """`encode_cross` on the CPU as one compiled function (`_encode`), for sentences of up to `max_tokens`."""

    def __init__(self, arrays: dict[str, np.ndarray], projections: dict[str, Projection], net: FrozenTransformer,
                 pre: bool, act: int, eps: float) -> None:
        self.arrays, self.projections, self.net = arrays, projections, net
        int8 = arrays["w_qkv"].dtype == np.int8
        self.max_tokens = net.cfg.max_positions if INT8_DOT or not int8 else MAX_TOKENS_INT8
        self.pre, self.act, self.eps = pre, act, eps
        self.args: tuple[Any, ...] | None = None  # `_encode`'s weight arguments, while usable
        self.bound: tuple[Bound, Bound] | None = None  # `_encode` and `encode_parts` with `args` bound
        self.usable: bool | None = None

    @classmethod
    def build(cls, model: Transformer, net: FrozenTransformer) -> FusedEncoder | None:
        """From the modules (float32 or int8), before their weights are released; None where not supported."""
        cfg = net.cfg
        if net.device.type != "cpu" or net.src_table.dtype != torch.float32 or cfg.activation not in ACTIVATIONS:
            return None
        encoder = cast("list[EncoderLayer]", list(model.encoder))
        itemsize = 1 if isinstance(model.out_proj, QuantizedLinear) or net.rows8 else 4
        D, F = cfg.d_model, cfg.d_ff
        if (len(encoder) * (4 * D * D + 2 * D * F) + cfg.decoder_layers * 2 * D * D) * itemsize > MAX_WEIGHT_BYTES:
            return None  # as for the fused step: a copy of large weights costs memory, and reading them is the cost
        linears = [{"qkv": [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj],
                    "o": [layer.self_attn.out_proj], "fc1": [layer.ff.fc1], "fc2": [layer.ff.fc2]}
                   for layer in encoder]
        arrays: dict[str, np.ndarray] = {}
        for name in PRODUCTS:
            per_layer = [_weights(products[name], net.rows8) for products in linears]
            if any(got is None for got in per_layer):
                return None
            for key, part in zip(("w", "s", "b"), zip(*per_layer, strict=True), strict=True):
                arrays[f"{key}_{name}"] = np.ascontiguousarray(np.stack(part))
        decoder = cast("list[DecoderLayer]", list(model.decoder))
        kv = _weights([lin for layer in decoder for lin in (layer.cross_attn.k_proj, layer.cross_attn.v_proj)],
                      net.rows8)
        if kv is None:
            return None
        arrays["w_kv"], arrays["s_kv"], arrays["b_kv"] = kv
        for name in (*PRODUCTS, "kv"):
            arrays[f"c_{name}"] = weight_sums(arrays[f"w_{name}"])
            arrays[f"w_{name}"] = pack_weights(arrays[f"w_{name}"])  # as the products read them
        norms = [[layer.self_res.norm, layer.ff_res.norm] for layer in encoder]
        arrays["norm_w"] = np.stack([[n.weight.detach().numpy() for n in ns] for ns in norms]).astype(np.float32)
        arrays["norm_b"] = np.stack([[n.bias.detach().numpy() for n in ns] for ns in norms]).astype(np.float32)
        final = cast(torch.nn.LayerNorm, model.encoder_norm)
        pre = cfg.norm == "pre"
        arrays["final_w"] = final.weight.detach().numpy().copy() if pre else np.ones(D, np.float32)
        arrays["final_b"] = final.bias.detach().numpy().copy() if pre else np.zeros(D, np.float32)
        named = net.projections()
        projections = {f"{name}.{i}": named[f"encoder.{i}.{name}"] for i in range(len(encoder))
                       for name in PRODUCTS} | {"kv": named["cross_kv"]}
        fused = cls(arrays, projections, net, pre, ACTIVATIONS[cfg.activation], cfg.layer_norm_eps)
        fused.warm()
        return fused

    def _quant(self) -> dict[str, np.ndarray] | None:
        return input_ranges(self.projections, PRODUCTS, self.arrays["w_qkv"].shape[0], "kv")

    def _args(self, quant: dict[str, np.ndarray]) -> tuple[Any, ...]:
        a = self.arrays
        products = [x for name in (*PRODUCTS, "kv")
                    for x in (a[f"w_{name}"], a[f"s_{name}"], a[f"b_{name}"], quant[name], a[f"c_{name}"])]
        return (self.net.cfg.n_heads, a["norm_w"], a["norm_b"], np.float32(self.eps), self.pre, a["final_w"],
                a["final_b"], self.act, *products)

    def warm(self) -> None:
        """Compile `_encode` for these weights' types now (or load it from numba's cache on disk)."""
        L = self.arrays["w_qkv"].shape[0]
        off = {name: np.zeros((L, 4), np.float32) for name in PRODUCTS} | {"kv": np.zeros(4, np.float32)}
        D = self.net.cfg.d_model
        _encode(np.zeros((1, D), np.float32), np.zeros(1, np.int64), np.ones(1, np.int64),  # type: ignore[call-arg]
                *self._args(off), np.empty((1, self.arrays["w_kv"].shape[0]), np.float32))

    def warm_parts(self) -> None:
        """Compile (or load) `encode_parts` now (`FusedStep.warm_parts`)."""
        L, D = self.arrays["w_qkv"].shape[0], self.net.cfg.d_model
        off = {name: np.zeros((L, 4), np.float32) for name in PRODUCTS} | {"kv": np.zeros(4, np.float32)}
        encode_parts(np.zeros((1, D), np.float32), np.zeros(1, np.int64), np.ones(1, np.int64),  # type: ignore[call-arg]
                     *self._args(off), np.empty((1, self.arrays["w_kv"].shape[0]), np.float32), 0, 1,
                     np.zeros(2, np.int64), self._shared(1))

    def changed(self) -> None:
        """Input ranges or calibration state changed: read them again before the next encoding."""
        self.usable, self.args, self.bound = None, None, None

    def ready(self) -> bool:
        if self.usable is None:
            quant = self._quant()
            self.args = self._args(quant) if quant is not None else None
            self.usable = self.args is not None
            if self.args is not None:  # after the tokens, the sentences' starts and lengths (`native.Bound`)
                self.bound = (Bound(_encode, 3, self.args), Bound(encode_parts, 3, self.args))
        return self.usable

    def __call__(self, x: Tensor, lengths: list[int]) -> Tensor:
        """x (N, D): the embedded tokens of sentences of these lengths, one after another -> their cross-attention
        K/V (N, L * 2 * D) in the same order."""
        if self.args is None:
            raise RuntimeError("the fused encoder runs only once ready() says so")
        xs = np.ascontiguousarray(x.numpy())  # overwritten
        kv = torch.empty(x.shape[0], self.arrays["w_kv"].shape[0])
        out = kv.numpy()
        threads = torch.get_num_threads()
        runs = split(lengths, threads if x.shape[0] >= SPLIT_MIN_TOKENS else 1)
        # too few tokens to cut by sentences, or too few sentences (one long one alone went on one thread: 5 ms
        # where its parts take about half, ad hoc): by products
        if threads > 1 and len(runs) < threads:
            flags, shared = np.zeros(threads + 1, np.int64), self._shared(x.shape[0])
            at_once([functools.partial(self._encode, xs, out, (0, lengths), part, threads, flags, shared)
                     for part in range(threads)])
            return kv
        at_once([functools.partial(self._encode, xs, out, run) for run in runs])  # the runs at once
        return kv

    def _encode(self, x: np.ndarray, out: np.ndarray, run: tuple[int, list[int]], part: int = 0, parts: int = 1,
                flags: np.ndarray | None = None, shared: np.ndarray | None = None) -> None:
        """The sentences of these lengths whose tokens start at row `first` of x, into the same rows of out; or
        part `part` of `parts` of them (with the parts' flags and shared arrays)."""
        first, lengths = run
        ns = np.array(lengths, np.int64)
        starts = np.concatenate([[0], np.cumsum(ns)[:-1]]).astype(np.int64)
        rows = slice(first, first + int(ns.sum()))
        assert self.bound is not None
        if shared is None:
            self.bound[0](x[rows], starts, ns, out[rows])
        else:
            self.bound[1](x[rows], starts, ns, out[rows], part, parts, flags, shared)

    def _shared(self, tokens: int) -> np.ndarray:
        cfg = self.net.cfg
        return np.empty(encoder_shared_size(tokens, cfg.d_model, cfg.d_ff), np.float32)


def split(lengths: list[int], parts: int) -> list[tuple[int, list[int]]]:
    """Consecutive sentences cut into at most `parts` runs of about as many tokens each: (first row, lengths)."""
    total = sum(lengths)
    runs: list[tuple[int, list[int]]] = []
    first, current, done = 0, [], 0
    for n in lengths:
        current.append(n)
        done += n
        if done * parts >= total * (len(runs) + 1) and len(runs) < parts - 1:
            runs.append((first, current))
            first, current = done, []
    if current:
        runs.append((first, current))
    return runs
