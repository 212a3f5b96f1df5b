"""A frozen network's products: one or more linear maps stacked along the output, run the fastest way measured.

On the CPU in float32, weights prepacked for oneDNN, whose products run 2 to 4 times faster than PyTorch's default
(MKL) on the AMD EPYC machines we measured, from two rows up (docs/benchmarks.md); a product of one row and a small
weight runs as a plain GEMM, which is faster there (ONE_ROW_PLAIN_MAX). Elsewhere (CUDA, half precision, int8
modules) the same structure through F.linear or the quantized modules. model/frozen.py builds the network from them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model import torch_ops as ops
from model.layers import ACTIVATION_FUNCTIONS
from model.torch_ops import QuantizedLinear, int8_weight_bias

# oneDNN post-op (attr, algorithm) computing each activation exactly as ACTIVATION_FUNCTIONS does (gelu: erf)
ONEDNN_ACTIVATIONS = {"relu": ("relu", ""), "gelu": ("gelu", "none"), "swish": ("swish", "")}
# Weights of at most this many elements also keep a plain transposed copy for products of ONE row: there a
# prepacked oneDNN call costs a fixed 10-20 us, 1.4 to 4 times a plain GEMM of a 256x256 to 512x512 weight
# (measured on the 2-core EPYC, 1 and 2 threads); from two rows up, or for larger weights, oneDNN is as fast or
# faster. Batch-1 decoding of a small model is mostly such products.
ONE_ROW_PLAIN_MAX = 1 << 19

def onednn_usable(weight: Tensor) -> bool:
    """Products with this weight can run through prepacked oneDNN: float32 on the CPU, in a build that has it."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and ops.onednn_available()


def stacked_bias(linears: Sequence[nn.Linear] | Sequence[QuantizedLinear]) -> Tensor | None:
    """The biases of linears stacked along the output (zeros for those without one), or None if none has one."""
    biases = [int8_weight_bias(m)[1] if isinstance(m, QuantizedLinear) else m.bias for m in linears]
    if all(b is None for b in biases):
        return None
    like = next(b for b in biases if b is not None)
    sizes = [m.out_features for m in linears]
    return torch.cat([b if b is not None else like.new_zeros(n) for b, n in zip(biases, sizes, strict=True)])


def stacked_int8(linears: Sequence[QuantizedLinear], bias: Tensor | None) -> Any:
    """Dynamically quantized linears as one fbgemm product, with results equal to running them one by one.

    Each keeps its own weight scale as the per-channel scale of its rows, so the int8 weights, the activation
    quantization and the int32 accumulation are exactly those of the separate products.
    """
    weights = [int8_weight_bias(m)[0] for m in linears]
    ints = torch.cat([w.int_repr() for w in weights])
    scales = torch.cat([torch.full((w.shape[0],), w.q_scale(), dtype=torch.double) for w in weights])
    zero_points = torch.cat([torch.full((w.shape[0],), w.q_zero_point(), dtype=torch.long) for w in weights])
    weight = ops.per_channel_int8(ints, scales, zero_points)
    return ops.linear_prepack(weight, bias if bias is not None else stacked_bias(linears))


class Projection:
    """y = act(x @ W.T + b) [+ residual] for one or more linear maps stacked along the output.

    Several maps of the same input (Q, K and V) become one product. Float weights run as a prepacked oneDNN
    product with the activation or the residual addition fused in (CPU, float32, prepack=True), or through
    F.linear; dynamically quantized (int8) linears run as one fbgemm product. `bias` replaces the linears' own.
    half=True (CPU, float32 weights): the weights rounded to float16 and packed for fbgemm's float16 product,
    which reads half the bytes and computes in float32. Nothing about the activations is quantized, so a row's
    result does not depend on the other rows of its batch, unlike int8's per-call activation scale.

    The oneDNN ops are those torch.compile's CPU weight freezing emits for batch sizes that vary
    (torch/_inductor/fx_passes/mkldnn_fusion.py). torch.utils.mkldnn's public MkldnnLinear runs the same
    library but converts activations to and from oneDNN's layout on every call: 1.4 to 1.7 times slower here.
    A prepacked product of one row and a small weight runs as a plain GEMM instead (ONE_ROW_PLAIN_MAX).
    """

    def __init__(self, linears: Sequence[nn.Module], activation: str | None = None, bias: Tensor | None = None,
                 prepack: bool = True, half: bool = False, rows8: bool = False, defer: bool = False) -> None:
        self.act = ACTIVATION_FUNCTIONS[activation] if activation else None
        self.post_op = ONEDNN_ACTIVATIONS[activation] if activation else ("none", "")
        self.int8: Any = None  # fbgemm's packed weight and bias
        self.static: tuple[float, int] | None = None  # int8: the input's fixed scale and zero point (`set_range`)
        self.observed: Tensor | None = None  # while calibrating: the smallest and largest input value seen so far
        self.half: Any = None  # fbgemm's packed float16 weight and bias
        self.onednn = False
        self.weight: Tensor | None = None
        self.bias: Tensor | None = None
        self.one_row: Tensor | None = None  # (in, out) contiguous: the plain GEMM for one row (ONE_ROW_PLAIN_MAX)
        self.rows8: Rows8 | None = None  # int8 with a scale per input row (`rows8=True`)
        self.per_row = rows8 and not all(isinstance(m, QuantizedLinear) for m in linears)  # `Rows8`'s arithmetic
        # defer=True (float weights, `Rows8`): packed by `pack` or the first call, not now; a network loaded to
        # decode builds its fused step first and packs only the products that step leaves to this one
        self.pending: functools.partial[None] | None = None
        self.linears = list(linears)  # the modules it was made from (whose weights a decoding process may drop)
        self.released = False
        with torch.no_grad():
            if all(isinstance(m, QuantizedLinear) for m in linears):
                bias = bias.detach() if bias is not None else None
                self.int8 = stacked_int8(cast(list[QuantizedLinear], list(linears)), bias)
                return
            dense = cast(list[nn.Linear], list(linears))
            bias = bias if bias is not None else stacked_bias(dense)
            self.bias = bias.detach() if bias is not None else None
            self.pending = functools.partial(self._pack, dense, activation, prepack, half, rows8)
            if not defer:
                self.pack()

    def pack(self) -> None:
        """Pack the weights of a product made with defer=True (nothing once packed or released)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            with torch.no_grad():
                pending()

    def _pack(self, dense: list[nn.Linear], activation: str | None, prepack: bool, half: bool, rows8: bool) -> None:
        weight = (dense[0].weight if len(dense) == 1 else torch.cat([m.weight for m in dense])).detach()
        if rows8:
            self.rows8 = Rows8(weight, self.bias, activation)
            return
        if half:
            if weight.device.type != "cpu" or weight.dtype != torch.float32:
                raise ValueError("float16 weights with float32 arithmetic run on the CPU, from float32 weights")
            rounded = weight.half().float()  # the one-row product below reads the same numbers
            self.half = ops.linear_prepack_fp16(rounded, self.bias)
            if rounded.numel() <= ONE_ROW_PLAIN_MAX:
                self.one_row = rounded.t().contiguous()
            return
        self.onednn = prepack and onednn_usable(weight)
        if self.onednn and weight.numel() <= ONE_ROW_PLAIN_MAX:
            self.one_row = weight.t().contiguous()
        self.weight = ops.onednn_reorder(weight, None) if self.onednn else weight

    def release(self) -> None:
        """Drop this product's weights (the network's fused step holds its own copy and takes its steps): it cannot
        run afterwards. What the fused step reads of it stays: its input ranges, and which int8 arithmetic it is."""
        self.weight, self.one_row, self.int8, self.pending, self.released = torch.empty(0), None, None, None, True
        if self.rows8 is not None:
            self.rows8.packed = None

    def set_range(self, lo: float, hi: float) -> None:
        """int8: quantize inputs with a fixed scale covering [lo, hi] (measured on data by `model.calibrate`) instead
        of a scale computed per call from the whole batch. A row's numbers are then its own, whatever shares its
        batch; values outside the range saturate. The range is fbgemm's 7 bits (0..127, the `reduce_range` that
        the dynamic product uses too), so that the int16 sums of AVX2's int8 products cannot overflow."""
        if self.int8 is None:
            raise ValueError("a fixed input range applies to int8 products only")
        lo, hi = min(lo, 0.0), max(hi, 0.0)  # zero stays exact (padding, ReLU's zeros)
        scale = max(hi - lo, 1e-8) / 127
        self.static = (scale, min(127, max(0, round(-lo / scale))))

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        if self.pending is not None:
            self.pack()
        if self.observed is not None:
            self.observed = torch.minimum(self.observed, torch.stack([x.min(), -x.max()]))
        if self.rows8 is not None:
            y = self.rows8(x)
            return y if residual is None else y + residual
        if self.one_row is not None and x.numel() == x.shape[-1]:
            flat = x.reshape(1, -1)
            y = torch.addmm(self.bias, flat, self.one_row) if self.bias is not None else flat @ self.one_row
            y = y.view(*x.shape[:-1], -1)
            y = self.act(y) if self.act is not None else y
            return y if residual is None else y + residual
        if self.onednn:
            if residual is not None and self.act is None:
                fused = ops.onednn_linear_add(x, residual, self.weight, self.bias, "add")
                return cast(Tensor, fused)
            attr, algorithm = self.post_op
            y = ops.onednn_linear(x, self.weight, self.bias, attr, [], algorithm)
        else:
            if self.half is not None:
                flat = x.reshape(-1, x.shape[-1])
                y = ops.linear_dynamic_fp16(flat, self.half).view(*x.shape[:-1], -1)
            elif self.static is not None:
                scale, zero_point = self.static
                y = ops.linear_fixed_range(x, scale, zero_point, self.int8)
            elif self.int8 is not None:
                y = ops.linear_dynamic(x, self.int8, True)  # reduce_range, as the modules do
            else:
                y = F.linear(x, cast(Tensor, self.weight), self.bias)
            y = self.act(y) if self.act is not None else y
        return y if residual is None else y + residual


class Rows8:
    """int8 products whose every input row takes its own scale (`rows8=True`): a row's result never depends on the
    other rows of its call, with no input ranges to measure first (`model.calibrate`).

    The weights are quantized per output row (`model.kernels.quantize_rows`: 127 steps each side of zero). Each input
    row is scaled by a = 63 / max |x| and quantized by fbgemm with scale 1 around 64: 7 bits of its own, whose pairs
    of AVX2's byte products cannot saturate. The sums are exact, and y = fbgemm's output / a + bias
    (`kernels.scale_rows`, `kernels.unscale_rows`). The fused step computes the same numbers bit for bit
    (`model.kernels._rows_own`). CPU only.
    """

    QUANT = np.array([0.0, 0.0, 0.0, 2.0], np.float32)  # `model.kernels._product`'s marker of this arithmetic

    def __init__(self, weight: Tensor, bias: Tensor | None, activation: str | None) -> None:
        from model.kernels import ACTIVATIONS, quantize_rows, scale_rows, unscale_rows  # numba: the CPU's int8 only

        if weight.device.type != "cpu":
            raise ValueError("int8 with a scale per row runs on the CPU")
        self.scale_rows, self.unscale_rows = scale_rows, unscale_rows
        self.product = ops.linear_fixed_range
        q, scale = quantize_rows(weight.detach().float().numpy())
        self.bias = (bias.detach().float().numpy().copy() if bias is not None
                     else np.zeros(q.shape[0], np.float32))
        self.act = ACTIVATIONS[activation]
        w = ops.per_channel_int8(torch.from_numpy(q), torch.from_numpy(scale).double(),
                                 torch.zeros(len(q), dtype=torch.long))
        self.packed = ops.linear_prepack(w, None)

    def __call__(self, x: Tensor) -> Tensor:
        flat = np.ascontiguousarray(x.reshape(-1, x.shape[-1]).numpy())
        xs, a = np.empty_like(flat), np.empty(flat.shape[0], np.float32)
        self.scale_rows(flat, xs, a)
        y = self.product(torch.from_numpy(xs), 1.0, 64, self.packed)
        self.unscale_rows(y.numpy(), a, self.bias, self.act)
        return cast(Tensor, y).view(*x.shape[:-1], -1)


class Int8Table:
    """An embedding table kept in int8 with a multiplier per row (`kernels.quantize_rows`), looked up as float32 rows:
    a quarter of float32's memory. Used with int8 with a scale per row (`rows8`, imported models), whose 58k-piece
    tables (OPUS-MT) took 113 MB in float32; CTranslate2's int8 keeps its embeddings in int8 as well."""

    def __init__(self, table: Tensor) -> None:
        from model.kernels import quantize_rows  # numba: the CPU's int8 only

        q, scale = quantize_rows(table.detach().float().numpy())
        self.q, self.row_scale = torch.from_numpy(q), torch.from_numpy(scale)
        self.dtype, self.device, self.shape = torch.float32, table.device, table.shape

    def rows(self, ids: Tensor) -> Tensor:
        return self.q[ids].float() * self.row_scale[ids].unsqueeze(-1)


class PackedTable:
    """An embedding table read from a tied output projection's weights as the fused step packed them
    (`model.kernels.packed_layout`; `FusedStep.share_table`), looked up as float32 rows: the same numbers as the
    table they replace (float32, or `Int8Table`'s int8 and multipliers), without a second copy of the model's
    largest matrix (an OPUS-MT model's 58k x 512: 119 MB in float32)."""

    def __init__(self, packed: np.ndarray, layout: tuple[int, int] | None, row_scale: np.ndarray | None) -> None:
        rows, K = packed.shape
        lanes, group = layout or (1, K)  # (1, K): rows as they are
        self.flat = torch.from_numpy(packed.reshape(-1))
        self.row_scale = None if row_scale is None else torch.from_numpy(row_scale)
        self.dtype, self.device, self.shape = torch.float32, self.flat.device, torch.Size((rows, K))
        k = torch.arange(K)
        self.body_rows, self.lanes, self.group = rows - rows % lanes, lanes, group
        self.in_panel = (k // group) * lanes * group + k % group  # (K,) offsets of an input in a panel row
        self.in_row = k  # the last rows % lanes rows, as they are

    def rows(self, ids: Tensor) -> Tensor:
        K, lanes = self.shape[1], self.lanes
        body = ids < self.body_rows
        start = torch.where(body, (ids // lanes) * lanes * K + (ids % lanes) * self.group, ids * K)
        at = start.unsqueeze(-1) + torch.where(body.unsqueeze(-1), self.in_panel, self.in_row)
        x = self.flat[at]
        if self.row_scale is None:
            return x
        return x.float() * self.row_scale[ids].unsqueeze(-1)
