"""Every numba loop nest of the fused CPU decode step and encoder: products, layer norms, attention over each row's
own length (also the operator-by-operator step's, `attend_rows`, and encoder's, `attend_packed`), and the step
(`step`) and encoder (`encode`) built from them.
model/fused_step.py and model/fused_encoder.py prepare their arguments and call them.

All of it lives in this one file on purpose: numba's on-disk cache checks only the source file of the function it
compiled, so a compiled `step` would keep an old copy of a product edited in another file.

Products are the same as the frozen network's, their weights packed once into panels (`pack_weights`) that
register-blocked kernels read, up to four rows sharing each weight load (`_panel_kernel`, `_byte_panel_kernel`:
LLVM IR emitted here through numba intrinsics):
- float32: the same weights, each output's sum its fused multiply-adds in input order, whatever rows share the call;
- int8: the same int8 weights and the same fixed input ranges (`model.calibrate`) as fbgemm's product. The input
  is quantized to 7 bits and each output is an exact integer sum, then scaled as fbgemm does. Where numba compiles
  for AVX2 (`INT8_DOT`) the sums are byte products, as in fbgemm: VNNI's `vpdpbusd` with AVX-512 VNNI
  (`INT8_VNNI`), else AVX2's `vpmaddubsw`; elsewhere they are computed in float32 (products of at most 127 x 128
  summed over at most 1,024 terms stay below 2^24, where float32 holds every integer). The same integers any way;
- int8 with a scale per input row (`model.projection.Rows8`, models without fixed ranges): 7 bits per row around
  its own largest value, exact sums (`_rows_own`), bit for bit as `Rows8` computes them through fbgemm.

The compiled functions themselves are in this one file; the IR of the products too, for the same reason. Each call
runs on its calling thread. A step or an encoding may be cut in parts, one call per thread at once: each computes
its share of every product's outputs and of the attention's heads, and the parts meet after each (`_sync`: spinning
on int64 flags, stored with release and loaded with acquire through LLVM's atomics). Helper threads take their parts
of steps from a control block of addresses and sizes (`step_worker`), so that no step waits for a sleeping thread to
wake. (Products cut over threads with numba's parallel=True were tried and removed: cached functions that call
parallel ones can crash when loaded from numba's cache; docs/benchmarks.md.)
"""

from __future__ import annotations

import math
import platform
from typing import Any, cast

import numpy as np
from llvmlite import ir  # pure Python: the IR types below are built at import either way

from model import native

# Kernels compiled ahead for this machine (model/native.py): then numba is not imported, and what only compiled code
# uses (intrinsics, overloads, numba's types) is never built
_AHEAD = native.extension(__name__)
if _AHEAD is None:
    from llvmlite import binding as llvm
    from numba import njit, types
    from numba.core import cgutils, config
    from numba.core.extending import intrinsic, overload
    from numba.np.numpy_support import carray
else:
    njit, intrinsic, overload = _AHEAD.njit, native.same, native.unused  # type: ignore[assignment]

# Reassociation lets sums vectorise; no "nnan"/"ninf": masked attention scores are -inf.
FAST = {"nsz", "arcp", "contract", "reassoc"}
ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2, "swish": 3}
EXACT_SUM_TERMS = 1024  # int8 sums of at most this many terms are exact in float32 (127 * 128 * 1024 < 2^24)


def _compiles_for(*wanted: str) -> bool:
    """Whether numba compiles for a CPU with these x86 features: its host, unless NUMBA_CPU_NAME or
    NUMBA_CPU_FEATURES say otherwise (a portable cache)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    features, name = getattr(config, "CPU_FEATURES", None), getattr(config, "CPU_NAME", None)
    if features is not None:
        return all(f"+{feature}" in str(features).split(",") for feature in wanted)
    host = llvm.get_host_cpu_features()
    return name in (None, "host") and all(bool(host.get(feature, False)) for feature in wanted)


# int8 products with fixed input ranges go through AVX2's byte products where the CPU has AVX2 (their K a multiple
# of 32), and through VNNI's (`vpdpbusd`: the same sums in one instruction) where it has AVX-512 VNNI as well
INT8_DOT: bool = _compiles_for("avx2") if _AHEAD is None else _AHEAD.value("INT8_DOT")
INT8_VNNI: bool = INT8_DOT and _compiles_for("avx512vnni", "avx512vl") if _AHEAD is None else _AHEAD.value("INT8_VNNI")
_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_V32I8, _V16I16, _V8I32 = ir.VectorType(_I8, 32), ir.VectorType(_I16, 16), ir.VectorType(_I32, 8)


def _emit_dot(context: Any, builder: Any, signature: Any, args: Any) -> Any:
    """The IR of one byte dot product: args (x, x offset, w, w offset, blocks of 32), offsets in bytes from each
    array's data."""
    x, x_at, w, w_at, blocks = args
    if not INT8_DOT or signature.args[0].dtype.bitwidth != 8 or signature.args[2].dtype.bitwidth != 8:
        # float weights, or a CPU without AVX2 (an ARM one has no such instructions at all): a branch `_product`
        # never takes, compiled without them
        return ir.Constant(_I32, 0)

    def declare(name: str, ret: Any, *params: Any) -> Any:
        return cast(Any, cgutils).get_or_insert_function(builder.module, ir.FunctionType(ret, params), name)

    ubsw = declare("llvm.x86.avx2.pmadd.ub.sw", _V16I16, _V32I8, _V32I8)
    wd = declare("llvm.x86.avx2.pmadd.wd", _V8I32, _V16I16, _V16I16)
    reduce = declare("llvm.vector.reduce.add.v8i32", _I32, _V8I32)

    def start(array: Any, aty: Any, at: Any) -> Any:
        return builder.gep(builder.bitcast(context.make_array(aty)(context, builder, array).data, _I8.as_pointer()),
                           [at])

    xp, wp = start(x, signature.args[0], x_at), start(w, signature.args[2], w_at)
    ones = ir.Constant(_V16I16, [1] * 16)
    acc = cast(Any, cgutils).alloca_once_value(builder, ir.Constant(_V8I32, [0] * 8))
    with cgutils.for_range(builder, blocks) as loop:
        at = builder.mul(loop.index, ir.Constant(loop.index.type, 32))
        xv = builder.load(builder.bitcast(builder.gep(xp, [at]), _V32I8.as_pointer()), align=1)
        wv = builder.load(builder.bitcast(builder.gep(wp, [at]), _V32I8.as_pointer()), align=1)
        pairs = builder.call(ubsw, [xv, wv])  # 32 products added in pairs into 16 bits, saturating
        builder.store(builder.add(builder.load(acc), builder.call(wd, [pairs, ones])), acc)
    return builder.call(reduce, [builder.load(acc)])


@intrinsic
def _dot_u8s8(typingctx, x, x_at, w, w_at, blocks):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """The sum over k < 32 * blocks of x[x_at + k] * w[w_at + k], bytes of x unsigned and of w signed, as an int32.

    AVX2's byte product (`vpmaddubsw`: 32 products added in pairs into 16-bit sums, saturating, as in fbgemm's
    int8 product) and `vpmaddwd` with ones into eight 32-bit sums, added up at the end. Offsets count bytes. Typed
    for any arrays, so that a product with float32 weights compiles the branch it never takes."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return _emit_dot(context, builder, signature, args)
    return types.int32(x, x_at, w, w_at, blocks), codegen


PANEL = 16  # float32 weights are stored in panels of this many outputs (`pack_panels`)
# The products walk their panels in chunks of about this many bytes of weights, every row through a chunk before the
# next: weights larger than the caches are then read from memory once a product, not once per four rows (64 KB and
# 256 KB measured alike on the OPUS-MT geometry, docs/benchmarks.md).
CHUNK_BYTES = 256 << 10
_F32 = ir.FloatType()
_VPANEL = ir.VectorType(_F32, PANEL)


def _pack(w: np.ndarray, lanes: int, group: int) -> np.ndarray:
    """Weights (..., N, K) in panels of `lanes` outputs, same shape and size: each panel holds K / group steps of
    `group` inputs of its first output, then of its second, ...; then the last N % lanes rows as they are. Row
    lanes * j of the result starts where panel j does."""
    *lead, N, K = w.shape
    body_rows = N - N % lanes
    flat = np.ascontiguousarray(w).reshape(-1, N, K)
    out = np.empty_like(flat)
    for src, dst in zip(flat, out, strict=True):  # into out's own rows (views): no temporary of the whole weight
        panels = dst[:body_rows].reshape(body_rows // lanes, K // group, lanes, group)
        panels[...] = src[:body_rows].reshape(body_rows // lanes, lanes, K // group, group).transpose(0, 2, 1, 3)
        dst[body_rows:] = src[body_rows:]
    return out.reshape(*lead, N, K)


def pack_panels(w: np.ndarray) -> np.ndarray:
    """float32 weights (..., N, K) as `_panel_rows` reads them: panels of 16 outputs, the 16 weights of each input
    next to each other (`_pack`)."""
    return _pack(w.astype(np.float32, copy=False), PANEL, 1)


def _panel_kernel(rows: int, panels: int) -> Any:
    """An intrinsic: outputs of `rows` rows of x against `panels` consecutive weight panels (`pack_panels`), each
    output the fused multiply-adds of its K terms in order, k = 0 first, so an output's number never depends on
    the rows or panels computed beside it. Args (x, x offset, x row stride, w, w offset, K, y, y offset, y row
    stride), offsets and strides in elements. Typed for any arrays; with other than float32 weights it does
    nothing (a branch `_rows_f32` never takes)."""
    def typer(typingctx, x, x_at, x_stride, w, w_at, K, y, y_at, y_stride):  # type: ignore[no-untyped-def]
        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            if signature.args[3].dtype != types.float32:
                return context.get_dummy_value()
            x, x_at, xs, w, w_at, K, y, y_at, ys = args

            def start(i: int, at: Any) -> Any:
                return builder.gep(context.make_array(signature.args[i])(context, builder, args[i]).data, [at])

            def times(v: Any, c: int) -> Any:
                return builder.mul(v, ir.Constant(v.type, c))

            fma = cast(Any, cgutils).get_or_insert_function(
                builder.module, ir.FunctionType(_VPANEL, [_VPANEL] * 3), f"llvm.fma.v{PANEL}f32")
            xp, wp, yp = start(0, x_at), start(3, w_at), start(6, y_at)
            x_rows = [builder.gep(xp, [times(xs, r)]) for r in range(rows)]
            w_panels = [builder.gep(wp, [times(K, PANEL * p)]) for p in range(panels)]
            zero, undef = ir.Constant(_VPANEL, [0.0] * PANEL), ir.Constant(_VPANEL, ir.Undefined)
            splat = ir.Constant(ir.VectorType(_I32, PANEL), [0] * PANEL)
            accs = [[cast(Any, cgutils).alloca_once_value(builder, zero) for _ in range(panels)] for _ in range(rows)]
            with cgutils.for_range(builder, K) as loop:
                at = times(loop.index, PANEL)
                ws = [builder.load(builder.bitcast(builder.gep(p, [at]), _VPANEL.as_pointer()), align=4)
                      for p in w_panels]
                for x_row, acc in zip(x_rows, accs, strict=True):
                    one = builder.insert_element(undef, builder.load(builder.gep(x_row, [loop.index])),
                                                 ir.Constant(_I32, 0))
                    xv = builder.shuffle_vector(one, undef, splat)
                    for wv, a in zip(ws, acc, strict=True):
                        builder.store(builder.call(fma, [xv, wv, builder.load(a)]), a)
            for r, acc in enumerate(accs):
                for p, a in enumerate(acc):
                    to = builder.add(times(ys, r), ir.Constant(ys.type, PANEL * p))
                    builder.store(builder.load(a), builder.bitcast(builder.gep(yp, [to]), _VPANEL.as_pointer()),
                                  align=4)
            return context.get_dummy_value()
        return types.void(x, x_at, x_stride, w, w_at, K, y, y_at, y_stride), codegen
    return intrinsic(typer)


BYTE_PANEL = 8  # int8 weights (with AVX2) in panels of this many outputs, four inputs of each together


def pack_byte_panels(w: np.ndarray) -> np.ndarray:
    """int8 weights (..., N, K), K a multiple of 4, as `_byte_dots_cols` reads them: panels of 8 outputs, steps of
    four inputs (32 bytes: four of the first output, then of the second, ...; `_pack`)."""
    return _pack(w, BYTE_PANEL, 4)


def pack_weights(w: np.ndarray) -> np.ndarray:
    """A fused product's weights (..., N, K) as `_product` reads them: float32 in panels (`pack_panels`), int8 in
    byte panels where the byte products take them (`pack_byte_panels`), else as they are (`packed_layout`)."""
    layout = packed_layout(w.dtype, w.shape[-1])
    return w if layout is None else _pack(w, *layout)


def packed_layout(dtype: Any, K: int) -> tuple[int, int] | None:
    """(lanes, group) of `_pack` for weights of this dtype and K inputs as `pack_weights` packs them: float32 in
    panels of 16 outputs, one input at a time; int8 where the byte products take them, in panels of 8, four inputs
    together; None: left as they are."""
    if np.dtype(dtype) == np.float32:
        return PANEL, 1
    return (BYTE_PANEL, 4) if INT8_DOT and K % 32 == 0 else None


def _byte_panel_kernel(rows: int, panels: int) -> Any:
    """An intrinsic: the exact int32 sums of `rows` rows of bytes xq (0..127) against `panels` consecutive byte
    panels (`pack_byte_panels`), four inputs at a time: VNNI's `vpdpbusd`, or AVX2's `vpmaddubsw` (pairs of
    products into 16 bits, which 7-bit inputs cannot saturate) and `vpmaddwd` with ones. Integer sums, so the same
    numbers as the dot products of `_dot_u8s8` in any order. Args (xq, x offset, x row stride, w, w offset, groups
    of four inputs, dots, dots offset, dots row stride), offsets and strides in elements. Typed for any arrays;
    without AVX2, or with other than int8 weights, it does nothing (a branch never taken)."""
    def typer(typingctx, x, x_at, x_stride, w, w_at, groups, y, y_at, y_stride):  # type: ignore[no-untyped-def]
        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            if not INT8_DOT or signature.args[3].dtype.bitwidth != 8 or signature.args[0].dtype.bitwidth != 8:
                return context.get_dummy_value()
            G, ys = args[5], args[8]

            def start(i: int, at: Any) -> Any:
                data = context.make_array(signature.args[i])(context, builder, args[i]).data
                return builder.gep(data, [at])

            def times(v: Any, c: int) -> Any:
                return builder.mul(v, ir.Constant(v.type, c))

            def declare(name: str, ret: Any, *params: Any) -> Any:
                return cast(Any, cgutils).get_or_insert_function(builder.module, ir.FunctionType(ret, params), name)

            xp = builder.bitcast(start(0, args[1]), _I8.as_pointer())
            wp = builder.bitcast(start(3, args[4]), _I8.as_pointer())
            yp = start(6, args[7])
            x_rows = [builder.gep(xp, [times(args[2], r)]) for r in range(rows)]
            w_panels = [builder.gep(wp, [times(G, 32 * p)]) for p in range(panels)]
            zero, undef = ir.Constant(_V8I32, [0] * 8), ir.Constant(_V8I32, ir.Undefined)
            splat = ir.Constant(_V8I32, [0] * 8)
            ones = ir.Constant(_V16I16, [1] * 16)
            if INT8_VNNI:
                dpbusd = declare("llvm.x86.avx512.vpdpbusd.256", _V8I32, _V8I32, _V8I32, _V8I32)
            else:
                ubsw = declare("llvm.x86.avx2.pmadd.ub.sw", _V16I16, _V32I8, _V32I8)
                wd = declare("llvm.x86.avx2.pmadd.wd", _V8I32, _V16I16, _V16I16)
            accs = [[cast(Any, cgutils).alloca_once_value(builder, zero) for _ in range(panels)] for _ in range(rows)]
            with cgutils.for_range(builder, G) as loop:
                ws = [builder.load(builder.bitcast(builder.gep(p, [times(loop.index, 32)]), _V8I32.as_pointer()),
                                   align=1) for p in w_panels]
                for x_row, acc in zip(x_rows, accs, strict=True):
                    four = builder.load(builder.bitcast(builder.gep(x_row, [times(loop.index, 4)]),
                                                        _I32.as_pointer()), align=1)
                    xv = builder.shuffle_vector(builder.insert_element(undef, four, ir.Constant(_I32, 0)), undef,
                                                splat)
                    for wv, a in zip(ws, acc, strict=True):
                        if INT8_VNNI:
                            builder.store(builder.call(dpbusd, [builder.load(a), xv, wv]), a)
                        else:
                            pairs = builder.call(ubsw, [builder.bitcast(xv, _V32I8), builder.bitcast(wv, _V32I8)])
                            builder.store(builder.add(builder.load(a), builder.call(wd, [pairs, ones])), a)
            for r, acc in enumerate(accs):
                for p, a in enumerate(acc):
                    to = builder.add(times(ys, r), ir.Constant(ys.type, BYTE_PANEL * p))
                    builder.store(builder.load(a), builder.bitcast(builder.gep(yp, [to]), _V8I32.as_pointer()),
                                  align=4)
            return context.get_dummy_value()
        return types.void(x, x_at, x_stride, w, w_at, groups, y, y_at, y_stride), codegen
    return intrinsic(typer)


_bytes_4x2, _bytes_3x2 = _byte_panel_kernel(4, 2), _byte_panel_kernel(3, 2)
_bytes_2x2, _bytes_1x4 = _byte_panel_kernel(2, 2), _byte_panel_kernel(1, 4)
_bytes_1x2, _bytes_1x1 = _byte_panel_kernel(1, 2), _byte_panel_kernel(1, 1)


# (rows, panels) per call: 8-12 accumulators of 16 floats, enough independent sums to keep the multiply-add units
# busy at one row, and the weights loaded once for up to four rows. Chosen among 4x2, 6x2, 8x1 and 4x4 layouts,
# ad hoc, on the AVX-512 machine and with numba told to compile for AVX2 alone: within 5% of each other from 8 rows,
# a 3-row kernel 1.2x at 3 rows (bench/panels.py times the products against the dot products they replaced)
# 16 accumulators where the panels allow: a core with two full-width 512-bit multiply-add units (AMD Zen 5) needs 8
# or more multiply-adds in flight; one whose units are 256 bits wide (Zen 4) is fed by 4 (docs/benchmarks.md)
_panels_4x4, _panels_4x2, _panels_4x1 = _panel_kernel(4, 4), _panel_kernel(4, 2), _panel_kernel(4, 1)
_panels_3x4, _panels_3x2 = _panel_kernel(3, 4), _panel_kernel(3, 2)
_panels_2x4, _panels_2x2 = _panel_kernel(2, 4), _panel_kernel(2, 2)
_panels_1x4 = _panel_kernel(1, 4)
_panels_1x2, _panels_1x1 = _panel_kernel(1, 2), _panel_kernel(1, 1)


def _float_weights(w: Any) -> bool:
    """Whether w holds float32 weights, known when compiling (so the other branch is never built)."""
    return bool(w.dtype == np.float32)


@overload(_float_weights)
def _float_weights_compiled(w):  # type: ignore[no-untyped-def]
    is_float = w.dtype == types.float32
    return lambda w: is_float


def _table_row(raw: Any, table: Any, v: int) -> None:
    """raw (D,) float32 = row v of an embedding table: a (V, D) array as it is, or a flat (V * D,) one holding a
    tied output projection's weights as `pack_weights` packed them (`_pack`: panels of `lanes` rows, `group`
    inputs of a row together), which the fused step then reads in place of a second copy of the table
    (`FusedStep.tied`). Which of the two is known when compiling."""
    raise NotImplementedError("compiled only")


@overload(_table_row)
def _table_row_compiled(raw, table, v):  # type: ignore[no-untyped-def]
    if table.ndim == 2:
        def plain(raw, table, v):  # type: ignore[no-untyped-def]
            for d in range(raw.shape[0]):
                raw[d] = np.float32(table[v, d])
        return plain
    lanes, group = (PANEL, 1) if table.dtype == types.float32 else (BYTE_PANEL, 4)  # `packed_layout`

    def packed(raw, table, v):  # type: ignore[no-untyped-def]
        D = raw.shape[0]
        rows = table.shape[0] // D
        if v >= rows - rows % lanes:  # the last rows % lanes rows, as they are
            for d in range(D):
                raw[d] = np.float32(table[v * D + d])
            return
        at = (v // lanes) * lanes * D + (v % lanes) * group  # the row's first input in its panel
        for g in range(D // group):
            for j in range(group):
                raw[g * group + j] = np.float32(table[at + g * lanes * group + j])
    return packed


@njit(fastmath=FAST, nogil=True, cache=True)
def embed(x, tokens, table, table_scale, emb_scale, positions, pos):  # type: ignore[no-untyped-def]  # pragma: no cover
    """x (B, D) = the embeddings of tokens (B,) at positions pos[:B]: the table's row (`_table_row`), float32 or
    int8 with a multiplier per row (`table_scale`; ones for float32), times emb_scale, plus the position's row."""
    D = x.shape[1]
    raw = np.empty(D, np.float32)
    for r in range(x.shape[0]):
        v = tokens[r]
        _table_row(raw, table, v)
        for d in range(D):
            x[r, d] = raw[d] * table_scale[v] * emb_scale + positions[pos[r], d]


def _flag_at(context: Any, builder: Any, signature: Any, args: Any) -> Any:
    """The address of flags[i] (an int64 array and an index)."""
    data = context.make_array(signature.args[0])(context, builder, args[0]).data
    return builder.gep(data, [context.cast(builder, args[1], signature.args[1], types.intp)])


@intrinsic
def _flag_load(typingctx, flags, i):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """flags[i] read atomically (acquire): what its writer wrote before setting it is seen after."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.load_atomic(_flag_at(context, builder, signature, args), "acquire", 8)
    return types.int64(flags, i), codegen


@intrinsic
def _flag_store(typingctx, flags, i, value):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """flags[i] = value, atomically (release)."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        v = context.cast(builder, args[2], signature.args[2], types.int64)
        builder.store_atomic(v, _flag_at(context, builder, signature, args), "release", 8)
        return context.get_dummy_value()
    return types.void(flags, i, value), codegen


_X86 = platform.machine().lower() in ("x86_64", "amd64")


@intrinsic
def _pause(typingctx):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """x86's `pause` in a spin-wait loop (nothing elsewhere)."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        if _X86:
            fn = builder.module.declare_intrinsic("llvm.x86.sse2.pause", fnty=ir.FunctionType(ir.VoidType(), []))
            builder.call(fn, [])
        return context.get_dummy_value()
    return types.void(), codegen


@njit(nogil=True, cache=True)
def _copy(dst, src):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """dst[...] = src for arrays of one shape (1 or 2 dimensions), element by element. A slice assignment
    (`dst[:] = src`) makes numba compile its shape-mismatch error, an exception message formatted from the shapes:
    5 to 8 s of the 45-65 s a process with numba's cache empty spends compiling its first greedy translation
    (numba's compile events: `bench/compile_time.py --events`)."""
    if src.ndim == 1:
        for i in range(src.shape[0]):
            dst[i] = src[i]
    else:
        for i in range(src.shape[0]):
            for j in range(src.shape[1]):
                dst[i, j] = src[i, j]


@njit(fastmath=FAST, nogil=True, cache=True)
def _act(v: float, kind: int) -> float:  # pragma: no cover - compiled
    if kind == 1:
        return max(v, 0.0)
    if kind == 2:
        return 0.5 * v * (1.0 + math.erf(v * 0.7071067811865476))
    if kind == 3:
        return v / (1.0 + math.exp(-v))
    return v


@njit(fastmath=FAST, nogil=True, cache=True)
def _product(x, w, scale, bias, quant, sums, act, res, y):  # type: ignore[no-untyped-def]  # pragma: no cover
    """y (B, N) = act(x (B, K) @ w (N, K).T * scale + bias) [+ res].

    quant = (1 / input scale, input scale, zero point, on): when on (1), x is quantized to 0..255 around the zero
    point first (fbgemm's uint8 input), and the integer sums are scaled by input scale * scale[j]. sums (N,) int32:
    each int8 weight row's sum (`weight_sums`), for the zero point. on = 2: every row of x takes its own scale
    (`_rows_own`; quant's other entries unused).
    """
    _product_cols(x, w, scale, bias, quant, sums, act, res, y, 0, w.shape[0])


@njit(fastmath=FAST, nogil=True, cache=True)
def _product_cols(x, w, scale, bias, quant, sums, act, res, y, j0, j1):  # type: ignore[no-untyped-def]  # pragma: no cover
    """`_product`'s outputs j0..j1-1 alone (y's other columns untouched). Each output is computed the same way
    whatever the range, as long as j0 is a multiple of 16 (`_cols`): products cut by columns over threads give
    the numbers of the whole product."""
    B, K = x.shape
    if quant[3] == 2:
        _rows_own(x, w, scale, bias, sums, act, y, j0, j1)
    elif quant[3] != 0 and INT8_DOT and K % 32 == 0:
        _rows_u8(x, w, scale, bias, quant, sums, act, y, j0, j1)
    else:
        _rows_f32(x, w, scale, bias, quant, act, y, j0, j1)
    if res.shape[0] == B:
        for r in range(B):  # (over views from 0: `_panel_rows`' epilogue says why)
            out, add = y[r, j0:j1], res[r, j0:j1]
            for j in range(out.shape[0]):
                out[j] += add[j]


@njit(fastmath=FAST, nogil=True, cache=True)
def _rows_f32(x, w, scale, bias, quant, act, y, j0, j1):  # type: ignore[no-untyped-def]  # pragma: no cover
    """`_product_cols` in float32: float32 weights (packed in panels, `_panel_rows`), or int8 ones without AVX2's
    byte products."""
    B, K = x.shape
    if quant[3] == 0 and _float_weights(w):
        _panel_rows(x, w, scale, bias, act, y, j0, j1)
        return
    xs = np.empty((B, K), np.float32)
    out_scale = np.float32(1.0)
    if quant[3] != 0:
        zp = quant[2]
        for r in range(B):
            for k in range(K):
                v = np.float32(np.round(x[r, k] * quant[0])) + zp
                xs[r, k] = min(max(v, np.float32(0.0)), np.float32(255.0)) - zp
        out_scale = quant[1]
    else:
        _copy(xs, x)
    if B == 1:
        _rows1(xs, w, scale, bias, out_scale, act, y, j0, j1)
    else:
        _rows2(xs, w, scale, bias, out_scale, act, y, j0, j1)


@njit(fastmath=FAST, nogil=True, cache=True)
def _panel_rows(x, w, scale, bias, act, y, j0, j1):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """`_product_cols` of float32 weights packed by `pack_panels`, j0 a multiple of 16: the panels' outputs four,
    three, two or one rows at a time (`_panel_kernel`), the last N % 16 as dot products (`_tail_rows`). Each
    output's sum is the same whichever rows and columns are computed with it."""
    B, K = x.shape
    N = w.shape[0]
    if x.strides[1] != 4:
        x = np.ascontiguousarray(x)
    xs, ys = x.strides[0] // 4, y.strides[0] // 4
    end = min(j1, N - N % PANEL)
    chunk = max(1, CHUNK_BYTES // (4 * K * PANEL)) * PANEL
    c0 = j0
    while c0 < end:  # a chunk of panels at a time, every row through it while its weights are in cache
        c1 = min(end, c0 + chunk)
        r = 0
        while r < B:
            n = min(4, B - r)
            j = c0
            while j < c1:
                left = (c1 - j) // PANEL
                at_x, at_w, at_y = r * xs, j * K, r * ys + j
                if n == 4 and left >= 4:
                    _panels_4x4(x, at_x, xs, w, at_w, K, y, at_y, ys)
                    j += 4 * PANEL
                elif n == 4 and left >= 2:
                    _panels_4x2(x, at_x, xs, w, at_w, K, y, at_y, ys)
                    j += 2 * PANEL
                elif n == 4:
                    _panels_4x1(x, at_x, xs, w, at_w, K, y, at_y, ys)
                    j += PANEL
                elif n == 3 and left >= 4:
                    _panels_3x4(x, at_x, xs, w, at_w, K, y, at_y, ys)
                    j += 4 * PANEL
                elif n == 3 and left >= 2:
                    _panels_3x2(x, at_x, xs, w, at_w, K, y, at_y, ys)
                    j += 2 * PANEL
                elif n == 2 and left >= 4:
                    _panels_2x4(x, at_x, xs, w, at_w, K, y, at_y, ys)
                    j += 4 * PANEL
                elif n >= 2 and left >= 2:
                    _panels_2x2(x, at_x, xs, w, at_w, K, y, at_y, ys)
                    j += 2 * PANEL
                elif n >= 2:  # one panel left for two or three rows: a row at a time
                    for i in range(n):
                        _panels_1x1(x, at_x + i * xs, xs, w, at_w, K, y, at_y + i * ys, ys)
                    j += PANEL
                elif left >= 4:
                    _panels_1x4(x, at_x, xs, w, at_w, K, y, at_y, ys)
                    j += 4 * PANEL
                elif left >= 2:
                    _panels_1x2(x, at_x, xs, w, at_w, K, y, at_y, ys)
                    j += 2 * PANEL
                else:
                    _panels_1x1(x, at_x, xs, w, at_w, K, y, at_y, ys)
                    j += PANEL
            r += n
        c0 = c1
    _tail_rows(x, w, max(j0, end), j1, y)
    zero = np.float32(0.0)
    # ReLU or none in the loop itself, and every loop over views from index 0, so that the loops vectorise: indexed
    # from j0, which numba cannot tell is not negative, each access carried its wrap-around test and the loop stayed
    # scalar (6.5 times as long: 15.6 us against 2.4 at 4 rows of 8,000 outputs, ad hoc; the same numbers)
    s, b = scale[j0:j1], bias[j0:j1]
    for r in range(B):
        out = y[r, j0:j1]
        if act == 1:
            for j in range(out.shape[0]):
                v = out[j] * s[j] + b[j]
                out[j] = v if v > zero else zero
        elif act == 0:
            for j in range(out.shape[0]):
                out[j] = out[j] * s[j] + b[j]
        else:
            for j in range(out.shape[0]):
                out[j] = _act(out[j] * s[j] + b[j], act)


@njit(fastmath=FAST, nogil=True, cache=True)
def _tail_rows(x, w, j0, j1, y):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """y[:, j0:j1] = the sums of x's rows against w's rows j0..j1-1 (stored as they are), one output at a time, the
    same loop for every row."""
    for r in range(x.shape[0]):
        for j in range(j0, j1):
            a = np.float32(0.0)
            for k in range(x.shape[1]):
                a += x[r, k] * w[j, k]
            y[r, j] = a


@njit(fastmath=FAST, nogil=True, cache=True)
def _rows_u8(x, w, scale, bias, quant, sums, act, y, j0, j1):  # type: ignore[no-untyped-def]  # pragma: no cover
    """`_product_cols`' int8 rows on AVX2: x quantized to bytes, and each sum of (x - zero point) * w as
    dot(x, w) - zero point * sum(w), the same integers as the float32 sums of the other way."""
    B, K = x.shape
    zp = quant[2]
    xq = np.empty((B, K), np.uint8)
    for r in range(B):
        for k in range(K):
            v = np.float32(np.round(x[r, k] * quant[0])) + zp
            xq[r, k] = np.uint8(min(max(v, np.float32(0.0)), np.float32(255.0)))
    dots = y.view(np.int32)  # the sums where their outputs go (`_rows_own`)
    _byte_dots_cols(xq, w, dots, j0, j1)
    izp = np.int32(zp)
    zero = np.float32(0.0)
    s, b, ws = scale[j0:j1], bias[j0:j1], sums[j0:j1]  # views from index 0 (`_panel_rows`' epilogue)
    for r in range(B):  # one row at a time, ReLU or none in the loop itself: the loops vectorise (with `_act`'s
        row, out = dots[r, j0:j1], y[r, j0:j1]  # branches inside, they did not: 14 of a 56 us product at 15 rows)
        if act == 1:
            for j in range(out.shape[0]):
                v = np.float32(row[j] - izp * ws[j]) * (quant[1] * s[j]) + b[j]
                out[j] = v if v > zero else zero
        elif act == 0:
            for j in range(out.shape[0]):
                out[j] = np.float32(row[j] - izp * ws[j]) * (quant[1] * s[j]) + b[j]
        else:
            for j in range(out.shape[0]):
                out[j] = _act(np.float32(row[j] - izp * ws[j]) * (quant[1] * s[j]) + b[j], act)


@njit(nogil=True, cache=True)
def _byte_dots(xq, w, dots):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """dots (B, N) int32 = xq (B, K) uint8 . w (N, K) int8 (packed by `pack_byte_panels`) through the byte products
    (K a multiple of 32): exact for inputs of at most 7 bits (0..127), whose pairs of products cannot saturate."""
    _byte_dots_cols(xq, w, dots, 0, w.shape[0])


@njit(nogil=True, cache=True)
def _byte_dots_cols(xq, w, dots, j0, j1):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """`_byte_dots`' columns j0..j1-1 (j0 a multiple of 8), w packed by `pack_byte_panels`: the panels' sums four,
    three, two or one rows at a time (`_byte_panel_kernel`), the last N % 8 rows' by `_dot_u8s8`."""
    B, K = xq.shape
    G = K // 4
    N, ys = w.shape[0], dots.strides[0] // 4
    end = min(j1, N - N % BYTE_PANEL)
    chunk = max(1, CHUNK_BYTES // (K * BYTE_PANEL)) * BYTE_PANEL
    c0 = j0
    while c0 < end:  # a chunk of panels at a time, as `_panel_rows`
        c1 = min(end, c0 + chunk)
        r = 0
        while r < B:
            n = min(4, B - r)
            j = c0
            while j < c1:
                left = (c1 - j) // BYTE_PANEL
                at_x, at_w, at_y = r * K, j * K, r * ys + j
                if n >= 3 and left >= 2:
                    if n == 4:
                        _bytes_4x2(xq, at_x, K, w, at_w, G, dots, at_y, ys)
                    else:
                        _bytes_3x2(xq, at_x, K, w, at_w, G, dots, at_y, ys)
                    j += 2 * BYTE_PANEL
                elif n >= 2 and left >= 2:
                    _bytes_2x2(xq, at_x, K, w, at_w, G, dots, at_y, ys)
                    j += 2 * BYTE_PANEL
                elif n >= 2:  # one panel left for two to four rows: a row at a time
                    for i in range(n):
                        _bytes_1x1(xq, at_x + i * K, K, w, at_w, G, dots, at_y + i * ys, ys)
                    j += BYTE_PANEL
                elif left >= 4:
                    _bytes_1x4(xq, at_x, K, w, at_w, G, dots, at_y, ys)
                    j += 4 * BYTE_PANEL
                elif left >= 2:
                    _bytes_1x2(xq, at_x, K, w, at_w, G, dots, at_y, ys)
                    j += 2 * BYTE_PANEL
                else:
                    _bytes_1x1(xq, at_x, K, w, at_w, G, dots, at_y, ys)
                    j += BYTE_PANEL
            r += n
        c0 = c1
    for j in range(max(j0, end), j1):
        for r in range(B):
            dots[r, j] = _dot_u8s8(xq, r * K, w, j * K, K // 32)  # type: ignore[call-arg]


@njit(nogil=True, cache=True)
def _int_dots(xq, w, dots, j0, j1):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """`_byte_dots_cols` without AVX2, or for any K: exact int32 sums."""
    B, K = xq.shape
    for r in range(B):
        for j in range(j0, j1):
            acc = np.int32(0)
            for k in range(K):
                acc += np.int32(xq[r, k]) * np.int32(w[j, k])
            dots[r, j] = acc


@njit(fastmath=FAST, nogil=True, cache=True)
def _amax(x):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """max |x| of a row: exact in any order, so it may vectorise."""
    m = np.float32(0.0)
    for v in x:
        m = max(m, abs(v))
    return m


@njit(nogil=True, cache=True)
def _row_scale(x):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """A row's own int8 scale: 63 / max |x| (a true division), 1 for a row of zeros."""
    amax = _amax(x)
    return np.float32(63.0) / amax if amax != 0 else np.float32(1.0)


@njit(fastmath=FAST, nogil=True, cache=True)
def _round_into(x, a, xq):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """xq = round(x * a) + 64 (half to even) into bytes: one product and one rounding each, in any order."""
    for k in range(x.shape[0]):
        xq[k] = np.uint8(np.int32(np.rint(x[k] * a)) + 64)


@njit(nogil=True, cache=True)  # no fastmath: each rounding as fbgemm's product rounds (`Rows8`)
def _rows_own(x, w, scale, bias, sums, act, y, j0, j1):  # type: ignore[no-untyped-def]  # pragma: no cover
    """`_product` with a scale per input row (quant[3] == 2, `model.projection.Rows8`): row r quantized on its own
    with a = 63 / max |x[r]| into 7 bits around 64 (pairs of byte products cannot saturate), exact integer sums with
    the int8 weights (one multiplier scale[j] per output row, `quantize_rows`), and
    y = (sum * scale[j]) / a + bias[j]: bit for bit what `Rows8` computes through fbgemm."""
    B, K = x.shape
    xq = np.empty((B, K), np.uint8)
    a = np.empty(B, np.float32)
    for r in range(B):
        a[r] = _row_scale(x[r])
        _round_into(x[r], a[r], xq[r])
    # the int32 sums in y's own memory, each read once where its float32 output is then written: a (B, N) array of
    # their own was 3.7 MB a step for 16 rows of an OPUS-MT output product, mapped anew each time under a fixed mmap
    # threshold (`runtime.settle_heap`)
    dots = y.view(np.int32)
    if INT8_DOT and K % 32 == 0:
        _byte_dots_cols(xq, w, dots, j0, j1)
    else:
        _int_dots(xq, w, dots, j0, j1)
    for r in range(B):
        for j in range(j0, j1):
            v = np.float32(dots[r, j] - np.int32(64) * sums[j]) * scale[j]
            y[r, j] = _act(v / a[r] + bias[j], act)


@njit(nogil=True, cache=True)
def scale_rows(x, xs, a):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """`_rows_own`'s input scales for fbgemm (`Rows8`): a[r] = 63 / max |x[r]| (1 for a row of zeros), xs = x * a."""
    for r in range(x.shape[0]):
        ar = _row_scale(x[r])
        a[r] = ar
        row, out = x[r], xs[r]
        for k in range(x.shape[1]):
            out[k] = row[k] * ar


@njit(nogil=True, cache=True)
def unscale_rows(y, a, bias, act):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """fbgemm's output of `scale_rows`' input back to `_rows_own`'s: y = act(y / a + bias), in place."""
    B, N = y.shape
    zero = np.float32(0.0)
    for r in range(B):
        row, ar = y[r], a[r]  # one row at a time: the loops vectorise
        if act == 1:  # ReLU in the same pass
            for j in range(N):
                v = row[j] / ar + bias[j]
                row[j] = v if v > zero else zero
            continue
        for j in range(N):
            row[j] = row[j] / ar + bias[j]
        if act != 0:
            for j in range(N):
                row[j] = _act(row[j], act)


QUANTIZE_ROWS = 4096  # rows quantized at a time by `quantize_rows`


def quantize_rows(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weights (N, K) float32 -> int8 (N, K) and a multiplier per row: round(w * 127 / max |w|), and max |w| / 127
    (1 for a row of zeros), as float32 (`_rows_own`'s and `Rows8`'s weights)."""
    w = np.asarray(w, np.float32)
    q, amax = np.empty(w.shape, np.int8), np.empty(w.shape[0], np.float32)
    for i in range(0, w.shape[0], QUANTIZE_ROWS):  # a block at a time: temporaries of a block, not of a 58k table
        block = w[i:i + QUANTIZE_ROWS]
        amax[i:i + QUANTIZE_ROWS] = peak = np.abs(block).max(1)
        nonzero = np.where(peak != 0, peak, 1).astype(np.float32)
        q[i:i + QUANTIZE_ROWS] = np.rint(block * (np.float32(127.0) / nonzero)[:, None])
    return q, np.where(amax != 0, amax.astype(np.float64) / 127, 1.0).astype(np.float32)


def weight_sums(w: np.ndarray) -> np.ndarray:
    """Each output row's sum of int8 weights (..., N, K) -> (..., N) int32, `_product`'s `sums`; zeros for float
    weights, which do not read them."""
    if w.dtype != np.int8:
        return np.zeros(w.shape[:-1], np.int32)
    return np.asarray(w.sum(-1, dtype=np.int64), np.int32)


@njit(fastmath=FAST, nogil=True, cache=True)
def _rows1(xs, w, scale, bias, out_scale, act, y, j0, j1):  # type: ignore[no-untyped-def]  # pragma: no cover
    """One row, outputs j0..j1-1: four at a time, the weights converted as they are read."""
    K = xs.shape[1]
    N4 = j1 - (j1 - j0) % 4
    for j in range(j0, N4, 4):
        a0 = np.float32(0.0)
        a1 = np.float32(0.0)
        a2 = np.float32(0.0)
        a3 = np.float32(0.0)
        for k in range(K):
            v = xs[0, k]
            a0 += v * np.float32(w[j, k])
            a1 += v * np.float32(w[j + 1, k])
            a2 += v * np.float32(w[j + 2, k])
            a3 += v * np.float32(w[j + 3, k])
        y[0, j] = _act(a0 * (out_scale * scale[j]) + bias[j], act)
        y[0, j + 1] = _act(a1 * (out_scale * scale[j + 1]) + bias[j + 1], act)
        y[0, j + 2] = _act(a2 * (out_scale * scale[j + 2]) + bias[j + 2], act)
        y[0, j + 3] = _act(a3 * (out_scale * scale[j + 3]) + bias[j + 3], act)
    for j in range(N4, j1):
        a = np.float32(0.0)
        for k in range(K):
            a += xs[0, k] * np.float32(w[j, k])
        y[0, j] = _act(a * (out_scale * scale[j]) + bias[j], act)


@njit(fastmath=FAST, nogil=True, cache=True)
def _rows2(xs, w, scale, bias, out_scale, act, y, j0, j1):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Several rows, outputs j0..j1-1: four outputs' weights converted once into a block, then two rows at a time
    over it."""
    B, K = xs.shape
    wb = np.zeros((4, K), np.float32)
    acc = np.empty((2, 4), np.float32)
    for j in range(j0, j1, 4):
        n = min(4, j1 - j)
        for c in range(n):
            for k in range(K):
                wb[c, k] = w[j + c, k]
        for r in range(0, B, 2):
            u_row = xs[r]
            v_row = xs[r + 1] if r + 1 < B else xs[r]
            a0 = np.float32(0.0)
            a1 = np.float32(0.0)
            a2 = np.float32(0.0)
            a3 = np.float32(0.0)
            b0 = np.float32(0.0)
            b1 = np.float32(0.0)
            b2 = np.float32(0.0)
            b3 = np.float32(0.0)
            for k in range(K):
                u = u_row[k]
                v = v_row[k]
                a0 += u * wb[0, k]
                a1 += u * wb[1, k]
                a2 += u * wb[2, k]
                a3 += u * wb[3, k]
                b0 += v * wb[0, k]
                b1 += v * wb[1, k]
                b2 += v * wb[2, k]
                b3 += v * wb[3, k]
            acc[0, 0], acc[0, 1], acc[0, 2], acc[0, 3] = a0, a1, a2, a3
            acc[1, 0], acc[1, 1], acc[1, 2], acc[1, 3] = b0, b1, b2, b3
            for i in range(min(2, B - r)):
                for c in range(n):
                    y[r + i, j + c] = _act(acc[i, c] * (out_scale * scale[j + c]) + bias[j + c], act)


@njit(fastmath=FAST, nogil=True, cache=True)
def _norm(x, w, b, eps, out):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """LayerNorm of each row of x (B, D) into out."""
    B, D = x.shape
    for r in range(B):
        mean = np.float32(0.0)
        for d in range(D):
            mean += x[r, d]
        mean /= D
        var = np.float32(0.0)
        for d in range(D):
            c = x[r, d] - mean
            var += c * c
        inv = np.float32(1.0) / np.sqrt(var / D + eps)
        for d in range(D):
            out[r, d] = (x[r, d] - mean) * inv * w[d] + b[d]


@njit(fastmath=FAST, nogil=True, cache=True)
def _qkv(x, h, norm_w, norm_b, eps, pre, w, s, b, q, c, none, qkv):  # type: ignore[no-untyped-def]  # pragma: no cover
    """A layer's self-attention Q, K and V of x into qkv, through the sublayer's norm first when pre-norm (into h).
    Shared by the step and the encoder (model/fused_encoder.py)."""
    if pre:
        _norm(x, norm_w, norm_b, eps, h)
        _product(h, w, s, b, q, c, 0, none, qkv)
    else:
        _product(x, w, s, b, q, c, 0, none, qkv)


@njit(fastmath=FAST, nogil=True, cache=True)
def _next(x, h, norm_w, norm_b, j, eps, pre):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """h holds sublayer j's residual sum: x becomes the stream and h the input of sublayer j + 1 (pre-norm: the
    stream normalised by norm j + 1; post-norm: the sum normalised by norm j, which is also the stream)."""
    if pre:
        _copy(x, h)
        _norm(x, norm_w[j + 1], norm_b[j + 1], eps, h)
    else:
        _norm(h, norm_w[j], norm_b[j], eps, x)
        _copy(h, x)


@njit(fastmath=FAST, nogil=True, cache=True)
def _feed_forward(x, h, f, w_1, s_1, b_1, q_1, c_1, w_2, s_2, b_2, q_2, c_2, act, norm_w, norm_b, eps,  # type: ignore[no-untyped-def]
                  pre):  # pragma: no cover - compiled
    """The feed-forward sublayer of the rows: h holds its input, x the stream, f (B, F) is scratch. x becomes the
    stream after it (post-norm: the residual sum normalised by norm_w, norm_b)."""
    _product(h, w_1, s_1, b_1, q_1, c_1, act, np.empty((0, 0), np.float32), f)
    _product(f, w_2, s_2, b_2, q_2, c_2, 0, x, h)
    if pre:
        _copy(x, h)
    else:
        _norm(h, norm_w, norm_b, eps, x)


@njit(fastmath=FAST, nogil=True, cache=True)
def _last(x, h, final_w, final_b, eps, pre, w, s, b, q, c, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    """The stack's output product of the stream x: after the final norm (pre-norm, into h), or of x itself."""
    if pre:
        _norm(x, final_w, final_b, eps, h)
        _product(h, w, s, b, q, c, 0, np.empty((0, 0), np.float32), out)
    else:
        _product(x, w, s, b, q, c, 0, np.empty((0, 0), np.float32), out)


@njit(fastmath=FAST, nogil=True, cache=True)
def _attend(q, k, v, n, out, weights):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """One query q (H * Dh,) over the first n keys and values k, v (H, T, Dh) into out (H * Dh,); the attention
    weights averaged over heads are added into `weights` (T,) unless it is empty."""
    _attend_heads(q, k, v, n, out, weights, 0, k.shape[0])


@njit(fastmath=FAST, nogil=True, cache=True)
def _attend_heads(q, k, v, n, out, weights, h0, h1):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """`_attend`'s heads h0..h1-1 alone, each computed as in the whole (`weights` gets their share). Its scratch is
    its own: passed in, the compiler could not tell it apart from the outputs and left the loops scalar (the
    encoder's attention took about 1.2x as long, ad hoc)."""
    H, _, Dh = k.shape
    scale = np.float32(1.0 / math.sqrt(Dh))
    p = np.empty(n, np.float32)
    o = np.empty(Dh, np.float32)
    for h in range(H):  # from 0, not h0: an index numba cannot tell is not negative kept the loops scalar (2.1x as
        if h < h0 or h >= h1:  # long at 18 tokens, ad hoc; the same numbers; `_panel_rows`' epilogue)
            continue
        top = -np.inf
        for t in range(n):
            s = np.float32(0.0)
            for d in range(Dh):
                s += q[h * Dh + d] * k[h, t, d]
            p[t] = s * scale
            top = max(top, p[t])
        total = np.float32(0.0)
        for t in range(n):
            p[t] = np.exp(p[t] - top)
            total += p[t]
        # the values weighted key by key: the inner loop runs along a value's contiguous Dh (2.4 times faster
        # at 32 rows than summing each output over the keys, a strided walk)
        o[:] = 0.0
        for t in range(n):
            pt = p[t]
            for d in range(Dh):
                o[d] += pt * v[h, t, d]
        for d in range(Dh):
            out[h * Dh + d] = o[d] / total
        if weights.shape[0] > 0:
            for t in range(n):
                weights[t] += p[t] / total / H


@njit(fastmath=FAST, nogil=True, cache=True)
def _scratch(rows, D, F):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """The step's and the encoder's working arrays for `rows` rows: h, qkv, a, f, and the empty stand-ins for
    "no residual" (2-D) and "no attention weights" (1-D)."""
    return (np.empty((rows, D), np.float32), np.empty((rows, 3 * D), np.float32), np.empty((rows, D), np.float32),
            np.empty((rows, F), np.float32), np.empty((0, 0), np.float32), np.empty(0, np.float32))


@njit(fastmath=FAST, nogil=True, cache=True)
def attend_rows(q, k, v, lengths, out, weights):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Row r's query q[r, :H * Dh] over its own first lengths[r] keys and values k[r], v[r] (H, T, Dh) into out[r];
    unless `weights` is empty, the weights averaged over heads into weights[r] (T,).

    The operator-by-operator step's attention on the CPU as well: over each row's real length, no mask, no padding
    (at 32 rows, two matrix products over the padded cache and a masked softmax took a fifth of the step)."""
    none = np.empty(0, np.float32)
    for r in range(q.shape[0]):
        _attend(q[r], k[r], v[r], lengths[r], out[r], weights[r] if weights.shape[0] > 0 else none)


@njit(fastmath=FAST, nogil=True, cache=True)
def attend_packed(qkv, starts, ns, H, out):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Self-attention of sentences packed token after token: the tokens starts[b]..starts[b] + ns[b] - 1 of qkv
    (N, 3 * D: each token's query, key and value) attend over their own sentence alone, into out (N, D).

    The encoder's attention (`encode`, and the operator-by-operator encoder on the CPU): no padding, no mask, and a
    sentence's numbers never depend on what it is batched with. Against padding the batch and SDPA with a mask:
    `bench/encoder_attention.py`."""
    D = qkv.shape[1] // 3
    Dh = D // H
    none = np.empty(0, np.float32)
    for b in range(starts.shape[0]):
        s0, n = starts[b], ns[b]
        k = np.empty((H, n, Dh), np.float32)
        v = np.empty((H, n, Dh), np.float32)
        for t in range(n):
            for hh in range(H):
                for d in range(Dh):
                    k[hh, t, d] = qkv[s0 + t, D + hh * Dh + d]
                    v[hh, t, d] = qkv[s0 + t, 2 * D + hh * Dh + d]
        for t in range(n):
            _attend(qkv[s0 + t, :D], k, v, n, out[s0 + t], none)


@njit(fastmath=FAST, nogil=True, cache=True)
def _attend_packed_units(qkv, starts, ns, H, out, u0, u1):  # type: ignore[no-untyped-def]  # pragma: no cover
    """`attend_packed`'s units u0..u1-1 alone: unit u is head u % H of sentence u // H."""
    D = qkv.shape[1] // 3
    Dh = D // H
    none = np.empty(0, np.float32)
    for b in range(starts.shape[0]):
        h0, h1 = max(u0 - b * H, 0), min(u1 - b * H, H)
        if h0 >= h1:
            continue
        s0, n = starts[b], ns[b]
        k = np.empty((H, n, Dh), np.float32)
        v = np.empty((H, n, Dh), np.float32)
        for t in range(n):
            for hh in range(H):  # (from 0: `_attend_heads`)
                if hh < h0 or hh >= h1:
                    continue
                for d in range(Dh):
                    k[hh, t, d] = qkv[s0 + t, D + hh * Dh + d]
                    v[hh, t, d] = qkv[s0 + t, 2 * D + hh * Dh + d]
        for t in range(n):
            _attend_heads(qkv[s0 + t, :D], k, v, n, out[s0 + t], none, h0, h1)


@njit(nogil=True, cache=True)
def _cols(n, part, parts):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Part `part` of `parts` of n columns (or attention units), as (start, end): starts on multiples of 16 (a
    float32 panel, `pack_panels`), so that each product output is computed as in the whole product
    (`_product_cols`)."""
    if parts == 1:
        return 0, n
    blocks = n // PANEL
    j0 = PANEL * (blocks * part // parts)
    j1 = n if part == parts - 1 else PANEL * (blocks * (part + 1) // parts)
    return j0, j1


@njit(nogil=True, cache=True)
def _sync(flags, part, parts, count):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """The parts of a step meet: part `part` says it reached its `count`-th meeting, and waits, spinning, until
    every other part has too. What a part wrote before is then seen by all (release and acquire). flags (parts + 1,)
    int64: each part's count, then a stop sign (nonzero: a part failed; nobody waits any more)."""
    if parts == 1:
        return
    _flag_store(flags, part, count)  # type: ignore[call-arg]
    for p in range(parts):
        while _flag_load(flags, p) < count and _flag_load(flags, parts) == 0:
            _pause()


@njit(fastmath=FAST, nogil=True, cache=True)
def _attend_units(q, kv, i, r0, lengths, self_t, a, align, part, parts):  # type: ignore[no-untyped-def]  # pragma: no cover
    """This part's share of the rows' attention (q (B, H * Dh) over kv[i, 0/1, r0 + r]) into a: units of one head
    of one row, or of whole rows when `align` takes the weights (summed over heads in order). self_t >= 0: the
    self-attention of the rows' new tokens, whose K/V (q's columns D..3D) go into the cache at each row's position
    first, and lengths are the positions + 1."""
    B = a.shape[0]
    H, Dh = kv.shape[3], kv.shape[5]
    D = H * Dh
    per = 1 if align.shape[0] > 0 else H  # units per row
    u0, u1 = _units(B * per, part, parts)
    none = np.empty(0, np.float32)
    for u in range(u0, u1):
        r = u // per
        h0 = 0 if per == 1 else u % per
        h1 = H if per == 1 else h0 + 1
        n = lengths[r]
        if self_t >= 0:
            t = n - 1
            for hh in range(H):  # (from 0: `_attend_heads`)
                if hh < h0 or hh >= h1:
                    continue
                for d in range(Dh):
                    kv[i, 0, r0 + r, hh, t, d] = q[r, D + hh * Dh + d]
                    kv[i, 1, r0 + r, hh, t, d] = q[r, 2 * D + hh * Dh + d]
        _attend_heads(q[r, :D], kv[i, 0, r0 + r], kv[i, 1, r0 + r], n, a[r], align[r] if per == 1 else none, h0, h1)


@njit(nogil=True, cache=True)
def _units(n, part, parts):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Part `part` of `parts` of n units of work, as (start, end)."""
    return n * part // parts, n * (part + 1) // parts


@njit(fastmath=FAST, nogil=True, cache=True)
def _then(y, x, hn, norm_w, norm_b, eps, pre):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """After a sublayer whose residual sum is y: the next sublayer's input into hn (this part's own copy) and the
    stream it adds to, returned. Pre-norm: the stream is y, the input y under the next norm (norm_w, norm_b);
    post-norm: both are y under the sublayer's own norm (norm_w, norm_b), copied into x as well."""
    _norm(y, norm_w, norm_b, eps, hn)
    if pre:
        return y
    _copy(x, hn)
    return x


@njit(fastmath=FAST, nogil=True, cache=True)
def step(tokens, r0, pos, src_mask, self_kv, cross_kv, table, table_scale, positions,  # type: ignore[no-untyped-def]
          emb_scale,
          norm_w, norm_b, eps, pre, final_w, final_b, act,
          w_qkv, s_qkv, b_qkv, q_qkv, c_qkv, w_o, s_o, b_o, q_o, c_o, w_cq, s_cq, b_cq, q_cq, c_cq,
          w_co, s_co, b_co, q_co, c_co, w_1, s_1, b_1, q_1, c_1, w_2, s_2, b_2, q_2, c_2,
          w_out, s_out, b_out, q_out, c_out, logits, align):  # pragma: no cover - compiled
    """Rows r0..r0+B-1 of the cache advance by one token each (tokens (B,)); logits (B, V) are written, `pos` moves
    on. Unless `align` is empty, the last layer's cross-attention weights averaged over heads are added into it
    (B, S). Each row is computed on its own, so runs of rows may go to threads of their own (`FusedStep`). The
    embedding table is float32, or int8 with a multiplier per row (`table_scale`; ones for float32). `step_parts`
    computes the same step cut in parts over threads."""
    B = tokens.shape[0]
    L, _, _, H, _, Dh = self_kv.shape
    D = H * Dh
    x = np.empty((B, D), np.float32)
    embed(x, tokens, table, table_scale, emb_scale, positions, pos[r0:])
    h, qkv, a, f, none, no_weights = _scratch(B, D, w_1.shape[1])
    lengths = np.empty(B, np.int64)
    for r in range(B):
        n = 0
        for s in range(src_mask.shape[1]):
            n += src_mask[r0 + r, s]
        lengths[r] = n
    for i in range(L):
        # self-attention: the new token's K/V go into the cache at each row's position
        _qkv(x, h, norm_w[i, 0], norm_b[i, 0], eps, pre, w_qkv[i], s_qkv[i], b_qkv[i], q_qkv[i], c_qkv[i], none,
             qkv)
        for r in range(B):
            t = pos[r0 + r]
            for hh in range(H):
                for d in range(Dh):
                    self_kv[i, 0, r0 + r, hh, t, d] = qkv[r, D + hh * Dh + d]
                    self_kv[i, 1, r0 + r, hh, t, d] = qkv[r, 2 * D + hh * Dh + d]
            _attend(qkv[r, :D], self_kv[i, 0, r0 + r], self_kv[i, 1, r0 + r], t + 1, a[r], no_weights)
        _product(a, w_o[i], s_o[i], b_o[i], q_o[i], c_o[i], 0, x, h)
        _next(x, h, norm_w[i], norm_b[i], 0, eps, pre)
        # cross-attention over each row's own source length
        q = np.empty((B, D), np.float32)
        _product(h, w_cq[i], s_cq[i], b_cq[i], q_cq[i], c_cq[i], 0, none, q)
        for r in range(B):
            weights = align[r] if i == L - 1 and align.shape[0] > 0 else no_weights
            _attend(q[r], cross_kv[i, 0, r0 + r], cross_kv[i, 1, r0 + r], lengths[r], a[r], weights)
        _product(a, w_co[i], s_co[i], b_co[i], q_co[i], c_co[i], 0, x, h)
        _next(x, h, norm_w[i], norm_b[i], 1, eps, pre)
        _feed_forward(x, h, f, w_1[i], s_1[i], b_1[i], q_1[i], c_1[i], w_2[i], s_2[i], b_2[i], q_2[i], c_2[i], act,
                      norm_w[i, 2], norm_b[i, 2], eps, pre)
    _last(x, h, final_w, final_b, eps, pre, w_out, s_out, b_out, q_out, c_out, logits)
    for r in range(B):
        pos[r0 + r] += 1


@njit(fastmath=FAST, nogil=True, cache=True)
def _meet_product(x, w, s, b, q, c, act, res, y, cols, flags, part, parts, met):  # type: ignore[no-untyped-def]  # noqa: E501  # pragma: no cover
    """`_product_cols` over this part's columns (start, end), then the parts meet: returns the meetings so far."""
    _product_cols(x, w, s, b, q, c, act, res, y, cols[0], cols[1])
    _sync(flags, part, parts, met + 1)
    return met + 1


@njit(fastmath=FAST, nogil=True, cache=True)
def _first_input(x, hn, norm_w, norm_b, eps, pre):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """The first layer's input into hn: x under the layer's first norm (pre-norm), or x itself."""
    if pre:
        _norm(x, norm_w, norm_b, eps, hn)
    else:
        _copy(hn, x)


@njit(nogil=True, cache=True)
def _meet(flags, part, parts, met):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """The parts meet once more (`_sync`): returns the meetings so far."""
    _sync(flags, part, parts, met + 1)
    return met + 1


@njit(fastmath=FAST, nogil=True, cache=True)
def _feed_forward_parts(hn, f, stream, y, x, w_1, s_1, b_1, q_1, c_1, act, w_2, s_2, b_2, q_2, c_2,  # type: ignore[no-untyped-def]
                        Fc, Dc, norm_w, norm_b, final_w, final_b, i, j, eps, pre, flags, part, parts,
                        met):  # pragma: no cover - compiled
    """Layer i's feed-forward sublayer in parts (its norm j), hn its input, y its residual sum: the stream after it
    and the meetings so far (`_layer_end`)."""
    met = _meet_product(hn, w_1, s_1, b_1, q_1, c_1, act, np.empty((0, 0), np.float32), f, Fc, flags, part, parts,
                        met)
    met = _meet_product(f, w_2, s_2, b_2, q_2, c_2, 0, stream, y, Dc, flags, part, parts, met)
    return _layer_end(y, x, hn, norm_w, norm_b, final_w, final_b, i, j, eps, pre), met


@njit(fastmath=FAST, nogil=True, cache=True)
def _layer_end(y, x, hn, norm_w, norm_b, final_w, final_b, i, j, eps, pre):  # type: ignore[no-untyped-def]  # pragma: no cover
    """`_then` after layer i's last sublayer, whose own norm is j: into the next layer, or, after the last, the
    stack's output input in hn (pre-norm: under the final norm)."""
    if i + 1 < norm_w.shape[0]:
        return _then(y, x, hn, norm_w[i + 1, 0] if pre else norm_w[i, j], norm_b[i + 1, 0] if pre else norm_b[i, j],
                     eps, pre)
    if pre:
        _norm(y, final_w, final_b, eps, hn)
    else:
        _norm(y, norm_w[i, j], norm_b[i, j], eps, hn)
    return y


@njit(fastmath=FAST, nogil=True, cache=True)
def step_parts(tokens, r0, pos, src_mask, self_kv, cross_kv, table, table_scale, positions,  # type: ignore[no-untyped-def]
               emb_scale, norm_w, norm_b, eps, pre, final_w, final_b, act,
               w_qkv, s_qkv, b_qkv, q_qkv, c_qkv, w_o, s_o, b_o, q_o, c_o, w_cq, s_cq, b_cq, q_cq, c_cq,
               w_co, s_co, b_co, q_co, c_co, w_1, s_1, b_1, q_1, c_1, w_2, s_2, b_2, q_2, c_2,
               w_out, s_out, b_out, q_out, c_out, logits, align, part, parts, flags, shared):  # pragma: no cover
    """`step` cut in `parts` parts, one per thread, each calling this at once with its own `part` and the same
    `flags` (int64 (parts + 1,), zeros) and `shared` (float32, `shared_size`): every product is cut by outputs and
    every attention by heads, the parts meeting after each (`_sync`); each output is computed as in `step`. (`step`
    itself stays apart: in one part this way took 5-10% longer, bounds known only at run time and all, ad hoc.)"""
    B = tokens.shape[0]
    L, _, _, H, _, Dh = self_kv.shape
    D = H * Dh
    F = w_1.shape[1]
    x = np.empty((B, D), np.float32)  # the stream (this part's own copy: the embeddings, post-norm's normed sums)
    hn = np.empty((B, D), np.float32)  # the next product's input (this part's own copy)
    embed(x, tokens, table, table_scale, emb_scale, positions, pos[r0:])
    # written by column (or head) share, read whole after a meeting
    qkv = shared[: B * 3 * D].reshape(B, 3 * D)
    a = shared[B * 3 * D : B * 4 * D].reshape(B, D)
    f = shared[B * 4 * D : B * (4 * D + F)].reshape(B, F)
    q = shared[B * (4 * D + F) : B * (5 * D + F)].reshape(B, D)
    sums = shared[B * (5 * D + F) : B * (7 * D + F)].reshape(2, B, D)  # residual sums, the two in turn
    none = np.empty((0, 0), np.float32)
    lengths = np.empty(B, np.int64)
    positions_now = np.empty(B, np.int64)
    for r in range(B):
        n = 0
        for s in range(src_mask.shape[1]):
            n += src_mask[r0 + r, s]
        lengths[r] = n
        positions_now[r] = pos[r0 + r] + 1
    D3 = _cols(3 * D, part, parts)
    Dc = _cols(D, part, parts)
    Fc = _cols(F, part, parts)
    Vc = _cols(w_out.shape[0], part, parts)
    met, turn, stream, meet = 0, 0, x, (flags, part, parts)  # meetings so far, the residual sums' turn
    _first_input(x, hn, norm_w[0, 0], norm_b[0, 0], eps, pre)
    for i in range(L):
        # self-attention: the new token's K/V go into the cache at each row's position
        met = _meet_product(hn, w_qkv[i], s_qkv[i], b_qkv[i], q_qkv[i], c_qkv[i], 0, none, qkv, D3, *meet, met)
        _attend_units(qkv, self_kv, i, r0, positions_now, 1, a, none, part, parts)
        met = _meet(*meet, met)
        y, turn = sums[turn], 1 - turn
        met = _meet_product(a, w_o[i], s_o[i], b_o[i], q_o[i], c_o[i], 0, stream, y, Dc, *meet, met)
        stream = _then(y, x, hn, norm_w[i, 1 if pre else 0], norm_b[i, 1 if pre else 0], eps, pre)
        # cross-attention over each row's own source length
        met = _meet_product(hn, w_cq[i], s_cq[i], b_cq[i], q_cq[i], c_cq[i], 0, none, q, Dc, *meet, met)
        _attend_units(q, cross_kv, i, r0, lengths, -1, a, align if i == L - 1 else none, part, parts)
        met = _meet(*meet, met)
        y, turn = sums[turn], 1 - turn
        met = _meet_product(a, w_co[i], s_co[i], b_co[i], q_co[i], c_co[i], 0, stream, y, Dc, *meet, met)
        stream = _then(y, x, hn, norm_w[i, 2 if pre else 1], norm_b[i, 2 if pre else 1], eps, pre)
        y, turn = sums[turn], 1 - turn
        stream, met = _feed_forward_parts(hn, f, stream, y, x, w_1[i], s_1[i], b_1[i], q_1[i], c_1[i], act, w_2[i],
                                          s_2[i], b_2[i], q_2[i], c_2[i], Fc, Dc, norm_w, norm_b, final_w, final_b, i,
                                          2, eps, pre, *meet, met)
    _product_cols(hn, w_out, s_out, b_out, q_out, c_out, 0, none, logits, Vc[0], Vc[1])
    if part == 0:
        for r in range(B):
            pos[r0 + r] += 1


# The control block of the threads that take the other parts of steps (`step_worker`, model.fused_step.Helpers):
# int64 slots, written by the thread that posts a step before it raises GO (release), read after (acquire).
GO, STOP, PARTS, IDS, LOGITS, POS, MASK, SELF_KV, CROSS_KV, ROWS, MAX_SRC, MAX_TGT, HEADS, SHARED, HOLD = range(15)
HELPER_SLOTS = 16  # then per helper thread w = 1..: its first row, rows, part, and the last GO done
R0, N, PART, DONE = range(4)
PER_HELPER = 4
_sched_yield = types.ExternalFunction("sched_yield", types.int32()) if _AHEAD is None else None


@intrinsic
def _pointer(typingctx, address, like):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """An address (int64) as a pointer to like's dtype, for `numba.carray`."""
    pointer = types.CPointer(like.dtype)  # type: ignore[no-untyped-call]

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.inttoptr(args[0], context.get_value_type(pointer))
    return pointer(address, like), codegen


@njit(nogil=True, cache=True)
def post(control):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Raise GO (release): what was written into control is the helpers' to take. Returns the new GO."""
    go = control[GO] + 1
    _flag_store(control, GO, go)  # type: ignore[call-arg]
    return go


@njit(nogil=True, cache=True)
def post_step(control, helpers, runs, ids, logits, pos, mask, self_kv, cross_kv, shared, args):  # type: ignore[no-untyped-def]  # noqa: E501  # pragma: no cover
    """Write a step of ids.shape[0] rows into control for the helpers and post it: runs 1, a step cut in
    helpers + 1 parts over the same rows (each helper its part, all of them `shared`); else `runs` runs of rows, the
    caller's the first, helper w's the (w + 1)-th (none past the last). Returns the new GO. Raises ValueError,
    posting nothing, where an array does not have the layout the helpers will read it with (`_check_posted`)."""
    _check_posted(ids, logits, pos, mask, self_kv, cross_kv, shared, args, runs == 1)
    B = ids.shape[0]
    control[IDS], control[LOGITS], control[SHARED] = ids.ctypes.data, logits.ctypes.data, shared.ctypes.data
    control[POS], control[MASK] = pos.ctypes.data, mask.ctypes.data
    control[SELF_KV], control[CROSS_KV] = self_kv.ctypes.data, cross_kv.ctypes.data
    control[ROWS], control[MAX_SRC], control[MAX_TGT], control[HEADS] = (self_kv.shape[2], cross_kv.shape[4],
                                                                          self_kv.shape[4], self_kv.shape[3])
    control[PARTS] = helpers + 1 if runs == 1 else 1
    for w in range(1, helpers + 1):
        at = HELPER_SLOTS + PER_HELPER * (w - 1)
        if runs == 1:
            control[at + R0], control[at + N], control[at + PART] = 0, B, w
        else:
            lo, hi = min(B, B * w // runs), min(B, B * (w + 1) // runs) if w < runs else B
            control[at + R0], control[at + N], control[at + PART] = lo, hi - lo, 0
    return post(control)


@njit(nogil=True, cache=True)
def _cache_fits(kv, L, rows, D):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Whether a cache buffer is (L, 2, rows, H, positions, D // H)."""
    return kv.shape[0] == L and kv.shape[1] == 2 and kv.shape[2] == rows and kv.shape[3] * kv.shape[5] == D


@njit(nogil=True, cache=True)
def _check_posted(ids, logits, pos, mask, self_kv, cross_kv, shared, args, cut):  # type: ignore[no-untyped-def]  # noqa: E501  # pragma: no cover
    """Helpers rebuild the posted arrays from their addresses (`carray`), C-contiguous, with the shapes that the
    cache and the weights `args` (`FusedStep`'s `StepWeights`) imply: anything else would be read as garbage, so it
    is refused here, before it is posted."""
    L, D, F, V = args.norm_w.shape[0], args.positions.shape[1], args.w_1.shape[1], args.w_out.shape[0]
    B, rows, S = ids.shape[0], pos.shape[0], mask.shape[1]
    for contiguous in (ids.flags.c_contiguous, logits.flags.c_contiguous, pos.flags.c_contiguous,
                       mask.flags.c_contiguous, self_kv.flags.c_contiguous, cross_kv.flags.c_contiguous,
                       shared.flags.c_contiguous):
        if not contiguous:
            raise ValueError("a posted step's array is not C-contiguous")
    if logits.shape[0] != B or logits.shape[1] != V or rows < B or mask.shape[0] != rows:
        raise ValueError("a posted step's ids, logits and rows disagree with the weights")
    if not (_cache_fits(self_kv, L, rows, D) and _cache_fits(cross_kv, L, rows, D)):
        raise ValueError("a posted step's cache disagrees with the weights")
    if cross_kv.shape[4] != S or (cut and shared.shape[0] < shared_size(B, D, F)):
        raise ValueError("a posted step's source mask or shared scratch is too small")


@njit(nogil=True, cache=True)
def wait_done(control, helpers, go):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Spin until every helper has finished step `go`."""
    for w in range(1, helpers + 1):
        while _flag_load(control, HELPER_SLOTS + PER_HELPER * (w - 1) + DONE) < go:  # type: ignore[call-arg]
            _pause()


@njit(nogil=True, cache=True)
def step_worker(control, w, rounds, flags, args):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Helper thread w's loop: take its share of every step posted in control (`post`), `step` with the weights
    and settings `args`, and mark it done; between steps, wait spinning, giving the core up at once to any other
    runnable thread (`sched_yield`), for `rounds` rounds of about 2-5 us. Returns 0 when that time ran out with no
    step posted, 1 when told to stop."""
    at = HELPER_SLOTS + PER_HELPER * (w - 1)
    f32, i64 = np.empty(0, np.float32), np.empty(0, np.int64)
    b8 = np.empty(0, np.bool_)
    seen = control[at + DONE]
    waited = 0
    while True:
        go = _flag_load(control, GO)  # type: ignore[call-arg, var-annotated]
        if go == seen:
            waited += 1
            if waited > rounds and _flag_load(control, HOLD) == 0:
                return 0
            for _ in range(32):
                _pause()
            _sched_yield()
            continue
        waited = 0
        seen = go
        if control[STOP] != 0:
            _flag_store(control, at + DONE, go)
            return 1
        rows, S, T, H = control[ROWS], control[MAX_SRC], control[MAX_TGT], control[HEADS]
        L, D, F, V = args.norm_w.shape[0], args.positions.shape[1], args.w_1.shape[1], args.w_out.shape[0]
        r0, n = control[at + R0], control[at + N]
        ids = carray(_pointer(control[IDS] + 8 * r0, i64), (n,))
        logits = carray(_pointer(control[LOGITS] + 4 * V * r0, f32), (n, V))
        pos = carray(_pointer(control[POS], i64), (rows,))
        mask = carray(_pointer(control[MASK], b8), (rows, S))
        self_kv = carray(_pointer(control[SELF_KV], f32), (L, 2, rows, H, T, D // H))
        cross_kv = carray(_pointer(control[CROSS_KV], f32), (L, 2, rows, H, S, D // H))
        parts = control[PARTS]
        if parts == 1:
            step(ids, r0, pos, mask, self_kv, cross_kv, *args[:], logits, np.empty((0, 0), np.float32))
        else:
            shared = carray(_pointer(control[SHARED], f32), (shared_size(n, D, F),))
            step_parts(ids, r0, pos, mask, self_kv, cross_kv, *args[:], logits, np.empty((0, 0), np.float32),
                       control[at + PART], parts, flags, shared)
        _flag_store(control, at + DONE, go)


@njit(nogil=True, cache=True)
def posted_step(ids, pos, mask, self_kv, cross_kv, args, logits, control, helpers, runs, flags,  # type: ignore[no-untyped-def]  # noqa: E501
                shared):  # pragma: no cover - compiled
    """One decoder step of rows 0..B-1 (ids (B,)) as `FusedStep` takes it, from compiled code. helpers 0: on this
    thread. Otherwise posted to the helper threads through control as `Helpers.run` posts it (runs 1: cut in
    helpers + 1 parts, with `flags` and `shared`; else runs of rows), whom the caller keeps from sleeping between
    steps (HOLD). False where a helper failed (the stop sign flags[-1])."""
    none = np.empty((0, 0), np.float32)
    if helpers == 0:
        step(ids, 0, pos, mask, self_kv, cross_kv, *args[:], logits, none)  # type: ignore[call-arg]
        return True
    flags[:] = 0
    go = post_step(control, helpers, runs, ids, logits, pos, mask, self_kv, cross_kv, shared, args)
    if runs == 1:
        step_parts(ids, 0, pos, mask, self_kv, cross_kv, *args[:], logits, none,  # type: ignore[call-arg]
                   0, helpers + 1, flags, shared)
    else:
        hi = ids.shape[0] // runs
        step(ids[:hi], 0, pos, mask, self_kv, cross_kv, *args[:], logits[:hi], none)  # type: ignore[call-arg]
    wait_done(control, helpers, go)
    return flags[flags.shape[0] - 1] == 0


@njit(nogil=True, cache=True)
def greedy_steps(most, ids, pos, mask, self_kv, cross_kv, args, logits, banned, eos, longs, cols,  # type: ignore[no-untyped-def]  # noqa: E501
                 history, max_new, out):  # pragma: no cover - compiled
    """Up to `most` decoder steps of plain greedy rows 0..B-1 on this thread, each a `step` and its tokens chosen and
    recorded as `choose_greedy` does, until a row ends its sentence (end of sentence, or its max_new tokens, counted
    in n_gen) after a step. ids (B,): the rows' next inputs, overwritten by each step's tokens, which also go into
    out[k] (most, B). The rows' last token, tokens generated and least new tokens are columns cols[0], cols[1] and
    cols[2] of `longs` (`DecodeBatch`'s row state, passed whole so that its columns' layout never makes another
    compiled variant). Returns the steps taken. (`greedy_steps_posted` posts the steps to helper threads; this one
    stays apart so that a process on one thread never compiles `step_parts`, whose compilation is long.)"""
    none = np.empty((0, 0), np.float32)
    k = 0
    while k < most:
        step(ids, 0, pos, mask, self_kv, cross_kv, *args[:], logits, none)  # type: ignore[call-arg]
        k += 1
        if _chosen(logits, banned, eos, longs, cols, history, max_new, ids, out[k - 1]):
            return k
    return k


@njit(nogil=True, cache=True)
def greedy_steps_posted(most, ids, pos, mask, self_kv, cross_kv, args, logits, banned, eos, longs,  # type: ignore[no-untyped-def]  # noqa: E501
                        cols, history, max_new, out, control, helpers, runs, flags,
                        shared):  # pragma: no cover - compiled
    """`greedy_steps` with each step a `posted_step` (helpers > 0); a helper that failed ends the loop after that
    step."""
    k = 0
    while k < most:
        if not posted_step(ids, pos, mask, self_kv, cross_kv, args, logits, control, helpers, runs, flags, shared):
            return k + 1
        k += 1
        if _chosen(logits, banned, eos, longs, cols, history, max_new, ids, out[k - 1]):
            return k
    return k


@njit(nogil=True, cache=True)
def _chosen(logits, banned, eos, longs, cols, history, max_new, ids, out):  # type: ignore[no-untyped-def]
    """A greedy step's tokens chosen and recorded (`choose_greedy`) into ids and out (B,); whether a row ended its
    sentence (`greedy_steps`)."""  # pragma: no cover - compiled
    B = ids.shape[0]
    last, n_gen, min_new = longs[:B, cols[0]], longs[:B, cols[1]], longs[:B, cols[2]]
    choose_greedy(logits, banned, eos, n_gen, min_new, history, last, ids)
    _copy(out, ids)
    for r in range(B):  # noqa: SIM110 - a loop, as numba compiles it
        if ids[r] == eos or n_gen[r] >= max_new[r]:
            return True
    return False


@njit(nogil=True, cache=True)
def banned_step(ids, pos, mask, self_kv, cross_kv, args, logits, banned, eos, longs, cols,  # type: ignore[no-untyped-def]  # noqa: E501
                control, helpers, runs, flags, shared):  # pragma: no cover - compiled
    """`posted_step` of rows 0..B-1 from their recorded tokens (`last`, copied into ids (B,)), then `ban_tokens` on
    its logits: the decoder's part of a beam search step (`model.beams.beam_steps`, with helpers only). False where
    a helper failed. The rows' last tokens, tokens generated and least new tokens: as in `greedy_steps`."""
    B = ids.shape[0]
    last, n_gen, min_new = longs[:B, cols[0]], longs[:B, cols[1]], longs[:B, cols[2]]
    for r in range(B):
        ids[r] = last[r]
    if not posted_step(ids, pos, mask, self_kv, cross_kv, args, logits, control, helpers, runs, flags, shared):
        return False
    ban_tokens(logits, banned, eos, n_gen, min_new)
    return True


@njit(nogil=True, cache=True)
def shared_size(rows: int, d_model: int, d_ff: int) -> int:  # pragma: no cover - compiled
    """The float32 elements of `step`'s `shared` for this many rows."""
    return rows * (7 * d_model + d_ff)


@njit(fastmath=FAST, nogil=True, cache=True)
def encode(x, starts, ns, H, norm_w, norm_b, eps, pre, final_w, final_b, act,  # type: ignore[no-untyped-def]
            w_qkv, s_qkv, b_qkv, q_qkv, c_qkv, w_o, s_o, b_o, q_o, c_o, w_1, s_1, b_1, q_1, c_1,
            w_2, s_2, b_2, q_2, c_2, w_kv, s_kv, b_kv, q_kv, c_kv, kv):  # pragma: no cover - compiled
    """x (N, D): the embedded tokens of sentences b = 0.. at rows starts[b]..starts[b] + ns[b] - 1. Every encoder
    layer, the final norm (pre-norm) and the cross-attention K/V product into kv (N, L * 2 * D). x is overwritten.
    `encode_parts` computes the same cut in parts over threads."""
    N, D = x.shape
    h, qkv, a, f, none, _ = _scratch(N, D, w_1.shape[1])
    for i in range(w_qkv.shape[0]):
        _qkv(x, h, norm_w[i, 0], norm_b[i, 0], eps, pre, w_qkv[i], s_qkv[i], b_qkv[i], q_qkv[i], c_qkv[i], none,
             qkv)
        attend_packed(qkv, starts, ns, H, a)
        _product(a, w_o[i], s_o[i], b_o[i], q_o[i], c_o[i], 0, x, h)
        _next(x, h, norm_w[i], norm_b[i], 0, eps, pre)
        _feed_forward(x, h, f, w_1[i], s_1[i], b_1[i], q_1[i], c_1[i], w_2[i], s_2[i], b_2[i], q_2[i], c_2[i], act,
                      norm_w[i, 1], norm_b[i, 1], eps, pre)
    _last(x, h, final_w, final_b, eps, pre, w_kv, s_kv, b_kv, q_kv, c_kv, kv)


@njit(fastmath=FAST, nogil=True, cache=True)
def encode_parts(x, starts, ns, H, norm_w, norm_b, eps, pre, final_w, final_b, act,  # type: ignore[no-untyped-def]
            w_qkv, s_qkv, b_qkv, q_qkv, c_qkv, w_o, s_o, b_o, q_o, c_o, w_1, s_1, b_1, q_1, c_1,
            w_2, s_2, b_2, q_2, c_2, w_kv, s_kv, b_kv, q_kv, c_kv, kv, part, parts, flags, shared):  # pragma: no cover
    """`encode` cut in `parts` parts as `step_parts` cuts a step (products by outputs, attention by heads of
    sentences; `shared` float32 of `encoder_shared_size`), each output computed as in `encode`; x is not written.
    (In one part this way took up to 1.5x as long as `encode`, int8, ad hoc: `encode` stays apart.)"""
    N, D = x.shape
    F = w_1.shape[1]
    L = w_qkv.shape[0]
    x = x.copy()  # the stream, each part's own
    hn = np.empty((N, D), np.float32)
    qkv = shared[: N * 3 * D].reshape(N, 3 * D)
    a = shared[N * 3 * D : N * 4 * D].reshape(N, D)
    f = shared[N * 4 * D : N * (4 * D + F)].reshape(N, F)
    sums = shared[N * (4 * D + F) : N * (6 * D + F)].reshape(2, N, D)
    none = np.empty((0, 0), np.float32)
    D3, Dc, Fc = _cols(3 * D, part, parts), _cols(D, part, parts), _cols(F, part, parts)
    KV = _cols(w_kv.shape[0], part, parts)
    units = _units(starts.shape[0] * H, part, parts)
    met, turn, stream, meet = 0, 0, x, (flags, part, parts)  # meetings so far, the residual sums' turn
    _first_input(x, hn, norm_w[0, 0], norm_b[0, 0], eps, pre)
    for i in range(L):
        met = _meet_product(hn, w_qkv[i], s_qkv[i], b_qkv[i], q_qkv[i], c_qkv[i], 0, none, qkv, D3, *meet, met)
        _attend_packed_units(qkv, starts, ns, H, a, units[0], units[1])
        met = _meet(*meet, met)
        y, turn = sums[turn], 1 - turn
        met = _meet_product(a, w_o[i], s_o[i], b_o[i], q_o[i], c_o[i], 0, stream, y, Dc, *meet, met)
        stream = _then(y, x, hn, norm_w[i, 1 if pre else 0], norm_b[i, 1 if pre else 0], eps, pre)
        y, turn = sums[turn], 1 - turn
        stream, met = _feed_forward_parts(hn, f, stream, y, x, w_1[i], s_1[i], b_1[i], q_1[i], c_1[i], act, w_2[i],
                                          s_2[i], b_2[i], q_2[i], c_2[i], Fc, Dc, norm_w, norm_b, final_w, final_b, i,
                                          1, eps, pre, *meet, met)
    _product_cols(hn, w_kv, s_kv, b_kv, q_kv, c_kv, 0, none, kv, KV[0], KV[1])


def encoder_shared_size(tokens: int, d_model: int, d_ff: int) -> int:
    """The float32 elements of `encode`'s `shared` for this many tokens."""
    return tokens * (6 * d_model + d_ff)


@njit(nogil=True, cache=True)
def ban_tokens(logits, banned, eos, n_gen, min_new):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """`DecodeBatch._process_host` for rows r = 0..B-1 of logits (B, V): banned tokens and, before a row's min_new
    tokens, the end of sentence become -inf (`choose_greedy`; beam search's short way, `model.beams`)."""
    for r in range(logits.shape[0]):
        for b in banned:
            logits[r, b] = -np.inf
        if n_gen[r] < min_new[r]:
            logits[r, eos] = -np.inf


@njit(nogil=True, cache=True)
def choose_greedy(logits, banned, eos, n_gen, min_new, history, last, tokens):  # type: ignore[no-untyped-def]
    """Plain greedy rows r = 0..B-1 of logits (B, V) choose their token, as `DecodeBatch._process_host`, numpy's
    argmax and `DecodeBatch.record_host` do one after another: banned tokens and, before a row's min_new tokens,
    the end of sentence become -inf; the first maximum is taken into tokens[r] and recorded (history, n_gen, last).
    """  # pragma: no cover - compiled
    B, V = logits.shape
    T = history.shape[1]
    ban_tokens(logits, banned, eos, n_gen, min_new)
    for r in range(B):
        row = logits[r]
        best = 0
        top = row[0]
        for v in range(1, V):
            if row[v] > top:
                top = row[v]
                best = v
        tokens[r] = best
        history[r, min(n_gen[r], T - 1)] = best
        n_gen[r] += 1
        last[r] = best
