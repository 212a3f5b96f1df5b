"""The CPU decode step of a few rows as one compiled loop nest (numba), without PyTorch's cost per operator.

A one-row step of a small model is mostly fixed costs: about 330 PyTorch operator calls, and fbgemm's int8 product
takes 25-40 us a call however small it is (docs/benchmarks.md). Here the whole decoder step (embedding, every
layer's norms, products, attention over each row's own length, the output projection) is one numba function over
the cache buffers, so a step costs its arithmetic and the reading of its weights. Its pieces, and how products are
computed, are in model/kernels.py.

Rows are computed one by one with the same order of operations whatever the batch, so a row's numbers are its own.
With more than one torch thread a step is cut, one share per thread, run at once: a step of many int8 rows into runs
of rows; a float32 step, or one of few int8 rows, into parts of every product (by outputs) and attention (by heads),
where each thread reads its share of the weights alone. Either way each output is computed as in one run. The other
shares go to helper threads that wait for steps spinning (`Helpers`). Used for up to `FusedStep.max_rows` rows per
torch thread, where it is faster than the operator-by-operator step; calibration keeps that step
(`FrozenTransformer.decode_step`). The shares need the other cores idle: torch's OpenMP threads spin after each
parallel operator for as long as libgomp's GOMP_SPINCOUNT says (model/runtime.py lowers its default).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np
import torch
from torch import Tensor

from model.kernels import (
    ACTIVATIONS,
    DONE,
    EXACT_SUM_TERMS,
    GO,
    HELPER_SLOTS,
    HOLD,
    INT8_DOT,
    PER_HELPER,
    STOP,
    banned_step,
    choose_greedy,
    greedy_steps,
    greedy_steps_posted,
    pack_weights,
    packed_layout,
    post,
    post_step,
    quantize_rows,
    shared_size,
    step_parts,
    step_worker,
    wait_done,
    weight_sums,
)
from model.kernels import step as _step
from model.native import Bound
from model.projection import Int8Table, PackedTable, Rows8, stacked_bias
from model.torch_ops import QuantizedLinear, int8_weight_bias

if TYPE_CHECKING:
    from model.cache import KVCache
    from model.frozen import FrozenTransformer
    from model.layers import DecoderLayer
    from model.projection import Projection
    from model.transformer import Transformer


def _weights(linears: Sequence[torch.nn.Module],
             rows8: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The stacked weight (N, K) as float32 or int8, a scale per output and the bias; None if not supported.
    rows8: float32 linears quantized per output row, as `model.projection.Rows8` quantizes them."""
    if rows8 and all(isinstance(m, torch.nn.Linear) and m.weight.dtype == torch.float32 for m in linears):
        w, scale = quantize_rows(torch.cat([cast(torch.nn.Linear, m).weight.detach() for m in linears]).numpy())
    elif all(isinstance(m, QuantizedLinear) for m in linears):
        parts = [int8_weight_bias(m)[0] for m in linears]  # type: ignore[arg-type]
        if not all(_zero_point_zero(p) for p in parts) or parts[0].shape[1] > EXACT_SUM_TERMS:
            return None
        w = torch.cat([p.int_repr() for p in parts]).numpy()
        scale = np.concatenate([np.full(p.shape[0], p.q_scale(), np.float32) if p.qscheme() == torch.per_tensor_affine
                                else p.q_per_channel_scales().float().numpy() for p in parts])
    elif all(isinstance(m, torch.nn.Linear) and m.weight.dtype == torch.float32 for m in linears):
        dense = [cast(torch.nn.Linear, m).weight.detach() for m in linears]
        w = (dense[0] if len(dense) == 1 else torch.cat(dense)).numpy()  # one map: the module's own memory
        scale = np.ones(w.shape[0], np.float32)
    else:
        return None
    bias = stacked_bias(linears)  # type: ignore[arg-type]
    b = bias.detach().float().numpy() if bias is not None else np.zeros(w.shape[0], np.float32)
    return np.ascontiguousarray(w), scale, np.ascontiguousarray(b, np.float32)


def _zero_point_zero(weight: Tensor) -> bool:
    """An int8 weight quantized per tensor, or per output channel, around zero: a scale per output is all it takes."""
    if weight.qscheme() == torch.per_tensor_affine:
        return int(weight.q_zero_point()) == 0
    return (weight.qscheme() == torch.per_channel_affine and weight.q_per_channel_axis() == 0
            and not bool(weight.q_per_channel_zero_points().any()))


def input_ranges(projections: dict[str, Projection], per_layer: Sequence[str], layers: int,
                 last: str) -> dict[str, np.ndarray] | None:
    """The products' fixed input ranges as the compiled functions read them: per product name (`name.i` for each
    layer, then `last` alone), rows of (1 / input scale, input scale, zero point, on), (layers, 4) or (4,). None
    while int8 has no fixed ranges or a product is being calibrated (the operator path observes inputs)."""
    quant: dict[str, np.ndarray] = {}
    for name in (*per_layer, last):
        rows = []
        for i in range(layers if name != last else 1):
            p = projections[f"{name}.{i}" if name != last else last]
            if p.observed is not None or (p.int8 is not None and p.static is None):
                return None
            if p.per_row:
                rows.append(list(Rows8.QUANT))
                continue
            scale, zp = p.static if p.static is not None else (1.0, 0)
            rows.append([1.0 / scale, scale, zp, 1.0 if p.static is not None else 0.0])
        quant[name] = np.array(rows if name != last else rows[0], np.float32)
    return quant


PRODUCTS = ("qkv", "o", "cross_q", "cross_o", "fc1", "fc2")


class StepWeights(NamedTuple):
    """`model.kernels.step`'s arguments after the cache's, by name: the helper threads read their shapes by name
    (`step_worker`), so no reordering here can shift what they read. Each product (`PRODUCTS`, then the output
    projection) is its weights, scales, bias, fixed input range and column sums (`_weights`, `input_ranges`)."""

    table: np.ndarray
    table_scale: np.ndarray
    positions: np.ndarray
    emb_scale: np.float32
    norm_w: np.ndarray
    norm_b: np.ndarray
    eps: np.float32
    pre: bool
    final_w: np.ndarray
    final_b: np.ndarray
    act: int
    w_qkv: np.ndarray
    s_qkv: np.ndarray
    b_qkv: np.ndarray
    q_qkv: np.ndarray
    c_qkv: np.ndarray
    w_o: np.ndarray
    s_o: np.ndarray
    b_o: np.ndarray
    q_o: np.ndarray
    c_o: np.ndarray
    w_cq: np.ndarray
    s_cq: np.ndarray
    b_cq: np.ndarray
    q_cq: np.ndarray
    c_cq: np.ndarray
    w_co: np.ndarray
    s_co: np.ndarray
    b_co: np.ndarray
    q_co: np.ndarray
    c_co: np.ndarray
    w_1: np.ndarray
    s_1: np.ndarray
    b_1: np.ndarray
    q_1: np.ndarray
    c_1: np.ndarray
    w_2: np.ndarray
    s_2: np.ndarray
    b_2: np.ndarray
    q_2: np.ndarray
    c_2: np.ndarray
    w_out: np.ndarray
    s_out: np.ndarray
    b_out: np.ndarray
    q_out: np.ndarray
    c_out: np.ndarray
# Models whose decoder and output weights take more bytes than this (`FusedStep.large`) kept the operator step: before
# the products were panels, reading the weights was the step's cost there and the operator step split it better over
# the threads (on the OPUS-MT geometry in float32, 208 MB a step: 1.13x the fused step with 2 threads), and the fused
# step's own copy adds as much memory again. Now they get a fused step for steps of up to `max_rows_large` rows a
# thread: with the products in panels walked a chunk of weights at a time (`model.kernels.CHUNK_BYTES`), on that
# geometry, 2 threads, ad hoc, float32 was 1.71x the operator step at 1 row, 1.39x at 4, 1.23x at 8, level at 32 and
# 0.91x at 128; int8 with a scale per row 1.7-2.1x at 1 row, 0.88-0.90x at 8, 1.06x at 16, 1.27x at 64, 1.26-1.29x
# at 128. Where the modules' weights are released (`checkpoint.load(keep_modules=False)`: the server) it takes every
# step and the operator step's copies go (`FrozenTransformer.release_operator_decoder`), so the weights stay once.
# The shipped models take 16 MB (float32) and 4 MB (int8) and are faster fused at every size measured.
MAX_WEIGHT_BYTES = 32 << 20
_pool: ThreadPoolExecutor | None = None  # the threads that take the other parts of a cut call (`at_once`)


def at_once(calls: Sequence[Callable[[], None]]) -> None:
    """Run the calls at once: the first on this thread, each other on a pool thread (the compiled functions release
    the GIL). Returns when all are done; raises what any raised. The fused step's runs of rows, and the fused
    encoder's runs of sentences (model/fused_encoder.py)."""
    global _pool
    if len(calls) > 1 and _pool is None:
        _pool = ThreadPoolExecutor(thread_name_prefix="tolk-parts")
    waits = [_pool.submit(call) for call in calls[1:]] if _pool is not None and len(calls) > 1 else []
    calls[0]()
    for wait in waits:
        wait.result()


_forks = 0  # how many times this process was forked into: a child has none of its parent's helper threads


def _forked() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_forked)


class Helpers:
    """Threads that take the other parts of fused steps (model.kernels.step_worker), one per torch thread but the
    caller's. A step is posted through an int64 control block (addresses, sizes, each helper's share), the helpers
    take it at once and the caller waits for them spinning: about 1 us a step, where a thread pool took 30-50 us to
    wake a sleeping thread on this VM. Between steps a helper waits spinning, giving its core up to any other
    runnable thread at once, for about `rounds` x 2-5 us; then it sleeps until the next step wakes it."""

    rounds = 200

    def __init__(self, args: StepWeights, helpers: int) -> None:
        self.args, self.helpers, self.forks = args, helpers, _forks
        self.control = np.zeros(HELPER_SLOTS + PER_HELPER * helpers, np.int64)
        self.flags = np.zeros(helpers + 2, np.int64)  # each part's meetings, the stop sign (`_sync`)
        self.sleeping = [False] * helpers
        self.wake = threading.Condition()
        self.failed: BaseException | None = None
        self.threads = [threading.Thread(target=self._serve, args=(w,), name=f"tolk-step-{w}", daemon=True)
                        for w in range(1, helpers + 1)]
        for thread in self.threads:
            thread.start()

    def _serve(self, w: int) -> None:
        at = HELPER_SLOTS + PER_HELPER * (w - 1)
        while True:
            try:
                stopped = step_worker(self.control, w, self.rounds, self.flags, self.args)
            except BaseException as e:  # noqa: BLE001 - handed to the caller, which raises it
                self.failed = e
                self.flags[-1] = 1  # nobody waits for this part any more
                self.control[at + DONE] = self.control[GO]
                return
            if stopped:
                return
            with self.wake:
                self.sleeping[w - 1] = True
                while self.control[GO] == self.control[at + DONE] and self.control[HOLD] == 0:
                    self.wake.wait()
                self.sleeping[w - 1] = False

    def run(self, ids: np.ndarray, views: tuple[np.ndarray, ...], logits: np.ndarray, runs: int,
            mine: Callable[[int, int, np.ndarray, np.ndarray], None]) -> None:
        """One step of ids.shape[0] rows: `runs` 1, cut into parts of every product; else into `runs` runs of rows.
        `mine(hi, parts, flags, shared)` computes the caller's share: part 0 of `parts`, or rows 0..hi-1."""
        B = ids.shape[0]
        d_model, d_ff = self.args.positions.shape[1], self.args.w_1.shape[1]
        shared = np.empty(shared_size(B, d_model, d_ff) if runs == 1 else 0, np.float32)  # (runs of rows: unused)
        self.flags[:] = 0
        if self.failed is not None:  # (checked after the reset: a helper failing from now on raises its stop sign)
            raise RuntimeError("a fused step's helper thread failed") from self.failed
        with self.wake:
            go = post_step(self.control, self.helpers, runs, ids, logits, *views, shared,  # type: ignore[call-arg]
                           self.args)
            if any(self.sleeping):
                self.wake.notify_all()
        try:
            parts, rows = (self.helpers + 1, B) if runs == 1 else (1, B // runs)
            mine(rows, parts, self.flags, shared)
        except BaseException:
            self.flags[-1] = 1
            raise
        finally:
            wait_done(self.control, self.helpers, go)
        if self.failed is not None:
            raise RuntimeError("a fused step's helper thread failed") from self.failed

    def hold(self, on: bool) -> None:
        """From `on` until it is called again with False, helpers wait for the next step spinning however long it
        takes, and a sleeping one wakes to wait so: steps posted from compiled code (`kernels.greedy_steps`), which
        cannot wake a sleeping thread, find every helper awake."""
        with self.wake:
            self.control[HOLD] = 1 if on else 0
            if on and any(self.sleeping):
                self.wake.notify_all()

    def stop(self) -> None:
        with self.wake:
            self.control[STOP] = 1
            post(self.control)
            self.wake.notify_all()
        for thread in self.threads:
            thread.join()


class FusedStep:
    """The decode step of up to `max_rows` rows per torch thread on the CPU as one compiled function (`_step`)."""

    # Up to this many rows per torch thread the fused step takes a step, where it was measured faster than the
    # operator-by-operator one (docs/benchmarks.md). A step of at least 2 x `split_min_rows` rows is cut into runs of
    # rows, one per torch thread, run at once (the compiled step releases the GIL; each row is computed on its own,
    # so the numbers do not depend on the cut). int8 without AVX2 (`max_rows`): 1.1-1.5x at 8 rows, 0.8-1.0x at 16.
    # int8 through AVX2's byte products, one thread: 4.7x at 1 row, 1.08x at 64, 0.97x at 128; two threads, cut:
    # 1.55x at 32, 1.26x at 128. float32 with its products in panels (`model.kernels._panel_rows`, 2026-11-27, an
    # AVX-512 EPYC): one thread 1.17x at 64 rows, 1.06x at 128; two threads, cut in parts, 1.21x at 64, 1.10x at 128
    # (it had been 16 rows a thread, 1.01x at 32 with one thread, before the panels).
    max_rows = 16
    max_rows_int8_dot = 64
    max_rows_float32 = 64
    split_min_rows = 4
    # With more than one torch thread, a step of up to this many rows is cut instead into parts of every product (by
    # outputs) and attention (by heads), one per thread (model.kernels.step_parts): each thread reads its share of the
    # weights alone. int8 ones of up to 7 rows: 1.04-1.2x at 1-4, where runs of rows gain nothing; from 8 int8 rows
    # runs of rows are faster (0.38 against 0.53 ms at 8; bench/fused_step.py, docs/benchmarks.md). float32 the same
    # where the weights stay in cache (the shipped model's 16 MB, 2026-11-27, AVX-512 EPYC, two threads, ad hoc): runs
    # of rows 0.60-0.67x parts at 2-6 rows, 1.10x at 8, 1.21-1.27x at 12-128. Large float32 weights (`large`: an
    # OPUS-MT model's 208 MB a step) are read from memory by every run, so their steps are always cut in parts: runs
    # were 0.68-0.90x at 4-32 rows, 1.06x at 64. Large int8 weights (OPUS-MT's, 52 MB) likewise up to 15 rows:
    # runs 0.82x parts at 8 rows, 0.87-0.97x at 10-14, 0.98x at 16, 1.02-1.09x at 20-24, 1.12-1.33x at 32-128.
    parts_max_rows = 7
    parts_max_rows_large_float32 = 1 << 30
    parts_max_rows_large_int8 = 15
    max_rows_large = 8  # weights above MAX_WEIGHT_BYTES, while the operator step keeps its own
    _one, _none = np.zeros(2, np.int64), np.empty(0, np.float32)  # a step in one part: no flags, no shared arrays

    def __init__(self, arrays: dict[str, np.ndarray], projections: dict[str, Projection], net: FrozenTransformer,
                 pre: bool, act: int, eps: float) -> None:
        self.arrays, self.projections, self.net = arrays, projections, net
        if arrays["w_qkv"].dtype == np.int8 and INT8_DOT:
            self.max_rows = self.max_rows_int8_dot
        if arrays["w_qkv"].dtype == np.float32:
            self.max_rows = self.max_rows_float32
        self.pre, self.act, self.eps = pre, act, eps
        self.usable: bool | None = None  # read from the products when first asked (`ready`)
        self.args: StepWeights | None = None  # `_step`'s arguments after the cache's, while usable
        self.bound: tuple[Bound, Bound] | None = None  # `_step` and `step_parts` with `args` bound (`native.Bound`)
        self.bound_greedy = Bound(greedy_steps, 6, (None,))  # `greedy_steps` with `args` (set with them)
        self.bound_posted = Bound(greedy_steps_posted, 6, (None,))  # `greedy_steps_posted` likewise
        self.bound_banned = Bound(banned_step, 5, (None,))  # `banned_step` with `args` (set with them)
        self.hot: Helpers | None = None  # the threads that take the other parts of a step, made when first needed
        self.large = False  # weights above MAX_WEIGHT_BYTES (`max_rows_large`)
        self.every_step = False  # takes steps of any size: the operator step's weights are gone
        self.tied = False  # the output projection's weights are the target embedding table's (`share_table`)
        self.consumed = False  # built handing the decoder modules' weights to `build`'s `drop`: must take every step

    @classmethod
    def build(cls, model: Transformer, net: FrozenTransformer,
              drop: Callable[[list[torch.nn.Module]], None] | None = None) -> FusedStep | None:
        """From the modules (float32 or int8), before their weights are released; None where not supported.

        `drop` (a decoding process's load, `checkpoint.release_linears`): where the weights are large and float32
        modules (the step then takes every step, `FrozenTransformer.release_operator_decoder`), each product's
        modules are handed to it as soon as the step has packed its copy, so that the two copies of the decoder are
        never held whole at once (`consumed`)."""
        cfg = net.cfg
        if net.device.type != "cpu" or net.tgt_table.dtype != torch.float32 or cfg.activation not in ACTIVATIONS:
            return None
        itemsize = 1 if isinstance(model.out_proj, QuantizedLinear) or net.rows8 else 4
        D, F, L = cfg.d_model, cfg.d_ff, cfg.decoder_layers
        large = (L * (6 * D * D + 2 * D * F) + cfg.tgt_vocab_size * D) * itemsize > MAX_WEIGHT_BYTES
        if large and itemsize == 1 and not INT8_DOT:  # int8 in float arithmetic: not measured at these sizes
            return None
        arrays: dict[str, np.ndarray] = {}
        decoder = cast("list[DecoderLayer]", list(model.decoder))
        linears = [{"qkv": [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj],
                    "o": [layer.self_attn.out_proj], "cross_q": [layer.cross_attn.q_proj],
                    "cross_o": [layer.cross_attn.out_proj], "fc1": [layer.ff.fc1], "fc2": [layer.ff.fc2]}
                   for layer in decoder]
        dense = all(type(m) is torch.nn.Linear and m.weight.dtype == torch.float32
                    for products in linears for group in products.values() for m in group)
        drop = drop if large and dense else None  # (dense float32 modules: every product below is supported)
        for name in PRODUCTS:
            per_layer = [_weights(products[name], net.rows8) for products in linears]
            if any(got is None for got in per_layer):
                return None
            for key, part in zip(("w", "s", "b"), zip(*per_layer, strict=True), strict=True):
                arrays[f"{key}_{name}"] = np.ascontiguousarray(np.stack(part))
            arrays[f"c_{name}"] = weight_sums(arrays[f"w_{name}"])
            arrays[f"w_{name}"] = pack_weights(arrays[f"w_{name}"])  # as the products read them
            if drop is not None:  # (packed copies of the modules' numbers): the modules' weights go
                drop([m for products in linears for m in products[name]])
        out = _weights([model.out_proj], net.rows8)
        if out is None:
            return None
        arrays["w_out"], arrays["s_out"], b_out = out
        if model.out_bias is not None:
            b_out = b_out + model.out_bias.detach().float().numpy()
        arrays["b_out"] = b_out.astype(np.float32)
        table = net.tgt_table
        if isinstance(table, Int8Table):
            arrays["table"], arrays["table_scale"] = table.q.numpy(), table.row_scale.numpy()
        else:  # (a network being built: its table is not yet a `PackedTable`, which comes from this step)
            arrays["table"], arrays["table_scale"] = cast(Tensor, table).numpy(), np.ones(table.shape[0], np.float32)
        # the output projection is the table, number for number (float32, or the same int8 rows and multipliers)
        tied = (cfg.tie_output and arrays["table"].dtype == arrays["w_out"].dtype
                and np.array_equal(arrays["table"], arrays["w_out"])
                and np.array_equal(arrays["table_scale"], arrays["s_out"]))
        arrays["c_out"] = weight_sums(arrays["w_out"])
        arrays["w_out"] = pack_weights(arrays["w_out"])  # (after the comparison with the table)
        if tied:  # the step reads the table in the packed projection (flat: `kernels._table_row`), so may others
            w = arrays["w_out"]
            arrays["table"] = w if packed_layout(w.dtype, w.shape[1]) is None else w.reshape(-1)
            arrays["table_scale"] = arrays["s_out"]
        norms = [[layer.self_res.norm, layer.cross_res.norm, layer.ff_res.norm] for layer in decoder]
        arrays["norm_w"] = np.stack([[n.weight.detach().numpy() for n in ns] for ns in norms]).astype(np.float32)
        arrays["norm_b"] = np.stack([[n.bias.detach().numpy() for n in ns] for ns in norms]).astype(np.float32)
        final = cast(torch.nn.LayerNorm, model.decoder_norm)
        pre = cfg.norm == "pre"
        arrays["final_w"] = final.weight.detach().numpy().copy() if pre else np.ones(D, np.float32)
        arrays["final_b"] = final.bias.detach().numpy().copy() if pre else np.zeros(D, np.float32)
        arrays["positions"] = net.positions.numpy()
        named = net.projections()
        projections = {f"{name}.{i}": named[f"decoder.{i}.{name}"] for i in range(cfg.decoder_layers)
                       for name in PRODUCTS} | {"out": named["out"]}
        step = cls(arrays, projections, net, pre, ACTIVATIONS[cfg.activation], cfg.layer_norm_eps)
        step.tied, step.consumed = tied, drop is not None
        if large:
            step.large, step.max_rows = True, cls.max_rows_large
            step.parts_max_rows = cls.parts_max_rows_large_float32 if itemsize == 4 else cls.parts_max_rows_large_int8
        step.warm()
        return step

    def warm(self) -> None:
        """Compile `_step` for these weights' types now (or load it from numba's cache on disk), on a one-row
        dummy cache, so that loading a model, not its first request, waits for it."""
        a, L = self.arrays, self.net.cfg.decoder_layers
        H, Dh = self.net.cfg.n_heads, self.net.cfg.head_dim
        off = {name: np.zeros((L, 4), np.float32) for name in PRODUCTS} | {"out": np.zeros(4, np.float32)}
        _step(np.zeros(1, np.int64), 0, np.zeros(1, np.int64), np.ones((1, 1), np.bool_),
              np.zeros((L, 2, 1, H, 2, Dh), np.float32), np.zeros((L, 2, 1, H, 1, Dh), np.float32),
              *self._args(off, np.float32(1.0)), np.empty((1, a["w_out"].shape[0]), np.float32),
              np.zeros((1, 1), np.float32))
        # greedy steps at once (`greedy`) too: with an empty cache about as long again, at load rather than at the
        # first request (no step is taken: at most 0 steps)
        greedy_steps(*self._dummy_steps(off, 0), *self._dummy_longs(), np.zeros((1, 2), np.int64),  # type: ignore[call-arg]
                     np.zeros(1, np.int64), np.empty((0, 1), np.int64))

    def _dummy_steps(self, off: dict[str, np.ndarray], most: int) -> tuple[Any, ...]:
        """`greedy_steps`'s first arguments (up to eos) on a one-row dummy cache, for the warm-ups."""
        L, H, Dh = self.net.cfg.decoder_layers, self.net.cfg.n_heads, self.net.cfg.head_dim
        return (most, np.zeros(1, np.int64), np.zeros(1, np.int64), np.ones((1, 1), np.bool_),
                np.zeros((L, 2, 1, H, 2, Dh), np.float32), np.zeros((L, 2, 1, H, 1, Dh), np.float32),
                self._args(off, np.float32(1.0)), np.empty((1, self.arrays["w_out"].shape[0]), np.float32),
                np.zeros(1, np.int64), 0)

    @staticmethod
    def _dummy_longs() -> tuple[np.ndarray, np.ndarray]:
        """A one-row row state and its columns (`RowState.host_longs`), for the warm-ups."""
        return np.zeros((1, 5), np.int64), np.array([0, 1, 3], np.int64)

    def warm_parts(self) -> None:
        """Compile (or load) what a step cut over threads runs, `step_parts` and the helpers' loop, now: about as long
        again as `warm` with an empty cache, so only where more than one torch thread will decode
        (`FrozenTransformer.warm_parts`); elsewhere the first such step compiles them."""
        a, L = self.arrays, self.net.cfg.decoder_layers
        H, Dh = self.net.cfg.n_heads, self.net.cfg.head_dim
        off = {name: np.zeros((L, 4), np.float32) for name in PRODUCTS} | {"out": np.zeros(4, np.float32)}
        args = self._args(off, np.float32(1.0))
        step_parts(np.zeros(1, np.int64), 0, np.zeros(1, np.int64), np.ones((1, 1), np.bool_),
                   np.zeros((L, 2, 1, H, 2, Dh), np.float32), np.zeros((L, 2, 1, H, 1, Dh), np.float32), *args,
                   np.empty((1, a["w_out"].shape[0]), np.float32), np.zeros((1, 1), np.float32), 0, 1,
                   np.zeros(2, np.int64), self._shared(1))
        control = np.zeros(HELPER_SLOTS + PER_HELPER, np.int64)
        control[GO], control[STOP] = 1, 1  # a helper told to stop at once: it returns before any step
        step_worker(control, 1, 0, np.zeros(3, np.int64), args)
        # steps posted from compiled code (`greedy`, `banned_step`): no step posted (at most 0 steps; no helpers)
        posted = (np.zeros(HELPER_SLOTS + PER_HELPER, np.int64), 0, 1, np.zeros(2, np.int64), self._shared(1))
        greedy_steps_posted(*self._dummy_steps(off, 0), *self._dummy_longs(),  # type: ignore[call-arg]
                            np.zeros((1, 2), np.int64), np.zeros(1, np.int64), np.empty((0, 1), np.int64), *posted)
        banned_step(*self._dummy_steps(off, 0)[1:], *self._dummy_longs(), *posted)  # type: ignore[call-arg]

    def share_table(self) -> PackedTable | None:
        """Where the output projection is the target embedding table (`tied`), the table as the step reads it, in
        the projection's packed weights (`PackedTable`), for the network's other lookups, so that its own copy can
        go (`FrozenTransformer.release_operator_decoder`); None where they are not the same numbers."""
        if not self.tied:
            return None
        w, scale = self.arrays["w_out"], self.arrays["s_out"]
        return PackedTable(w, packed_layout(w.dtype, w.shape[1]), None if w.dtype == np.float32 else scale)

    def changed(self) -> None:
        """The products' input ranges or calibration state changed: read them again before the next step."""
        self.usable, self.args, self.bound = None, None, None

    def _quant(self) -> dict[str, np.ndarray] | None:
        return input_ranges(self.projections, PRODUCTS, self.net.cfg.decoder_layers, "out")

    def takes(self, rows: int) -> bool:
        """Whether a step of this many rows is the fused step's (and it can run: `ready`)."""
        return (self.every_step or rows <= self.max_rows * torch.get_num_threads()) and self.ready()

    def ready(self) -> bool:
        if self.usable is None:
            quant = self._quant()
            self.args = self._args(quant, np.float32(self.net.scale)) if quant is not None else None
            self.usable = self.args is not None
            if self.args is not None:  # after the step's ids, first row and the cache's four views (`host_views`)
                self.bound = (Bound(_step, 6, self.args), Bound(step_parts, 6, self.args))
                self.bound_greedy = Bound(greedy_steps, 6, (self.args,))
                self.bound_posted = Bound(greedy_steps_posted, 6, (self.args,))
                self.bound_banned = Bound(banned_step, 5, (self.args,))
        return self.usable

    def _args(self, quant: dict[str, np.ndarray], emb_scale: np.float32) -> StepWeights:
        """`_step`'s arguments after the cache's: the weights, settings and input ranges, built once."""
        a = self.arrays
        products = [x for name in (*PRODUCTS, "out")
                    for x in (a[f"w_{name}"], a[f"s_{name}"], a[f"b_{name}"], quant[name], a[f"c_{name}"])]
        return StepWeights(a["table"], a["table_scale"], a["positions"], emb_scale, a["norm_w"], a["norm_b"],
                           np.float32(self.eps), self.pre, a["final_w"], a["final_b"], self.act, *products)

    def __call__(self, tokens: Tensor, cache: KVCache, align: list[Tensor] | None = None,
                 out: Tensor | None = None) -> Tensor:
        """Rows 0..B-1 advance by one token each: tokens (B,) -> logits (B, V); the cache's positions move on.

        `align` gets the last layer's cross-attention weights averaged over heads (B, S), as `decode_step`'s. `out`:
        a contiguous float32 (B, V) to write the logits into (`KVCache.scratch`), else they are a new tensor.
        """
        if self.args is None:
            raise RuntimeError("the fused step runs only once ready() says so")
        B = tokens.shape[0]
        logits = torch.empty(B, self.arrays["w_out"].shape[0]) if out is None else out
        weights = torch.zeros(B, cache.max_src) if align is not None else torch.empty(0, 0)
        views = cache.host_views()
        # tokens: a column of the row state (strided); one contiguous layout keeps to one compiled signature
        ids, host, align_out = np.ascontiguousarray(tokens.numpy()), logits.numpy(), weights.numpy()
        threads = torch.get_num_threads()
        parts, runs = self._plan(B, threads)
        cuts = [B * i // runs for i in range(runs + 1)]
        if align is None and (parts or runs > 1):
            self._helpers(threads).run(ids, views, host, 1 if parts else runs, functools.partial(
                self._run, ids, views, host, align_out, 0))
        elif parts:
            flags, shared = np.zeros(threads + 1, np.int64), self._shared(B)
            at_once([functools.partial(self._run, ids, views, host, align_out, 0, B, threads, flags, shared, part)
                     for part in range(threads)])
        else:
            at_once([functools.partial(self._run, ids, views, host, align_out, lo, hi, 1, self._one, self._none)
                     for lo, hi in zip(cuts[:-1], cuts[1:], strict=True)])
        cache.advance(B, on_device=False)
        if align is not None:
            align.append(weights[:, : cache.s_hi])
        return logits

    def _plan(self, B: int, threads: int) -> tuple[bool, int]:
        """How a step of B rows is cut over this many torch threads: in parts of every product (True), else into
        this many runs of rows, each on a thread of its own (1: the step on this thread alone)."""
        runs = max(1, min(threads, B // self.split_min_rows))
        return threads > 1 and self.parts_max_rows >= B, runs

    def greedy(self, tokens: Tensor, cache: KVCache, logits: Tensor, banned: np.ndarray, eos: int, longs: np.ndarray,
               cols: np.ndarray, history: np.ndarray, max_new: np.ndarray, most: int) -> np.ndarray:
        """Up to `most` steps of rows 0..B-1, every one plain greedy, in one compiled call
        (`model.kernels.greedy_steps`, or `greedy_steps_posted` with helper threads), until a row ends its sentence:
        each step as `__call__` takes it, its tokens chosen and recorded as `choose` does (`longs`, `cols`: the row
        state and its columns of last tokens, tokens generated and least new tokens). Returns the tokens (steps, B);
        the cache's positions move on.

        A step of one row on the shipped model is about 0.12 ms; the Python around each (the search's loop, the
        step's and the choice's calls) cost 0.07 ms more (ad hoc, 2 threads, Zen 5)."""
        B = tokens.shape[0]
        ids = np.array(tokens.numpy(), np.int64)  # a copy: the steps overwrite it with their tokens
        out = np.empty((most, B), np.int64)
        pos, mask, self_kv, cross_kv = cache.host_views()
        with self.posting(B) as (hot, posted):
            if hot is None:
                k = self.bound_greedy(most, ids, pos, mask, self_kv, cross_kv, logits.numpy(), banned, eos, longs,
                                      cols, history, max_new, out)
            else:
                k = self.bound_posted(most, ids, pos, mask, self_kv, cross_kv, logits.numpy(), banned, eos, longs,
                                      cols, history, max_new, out, *posted)
        cache.advance(B, on_device=False, steps=k)
        return out[:k]

    @contextlib.contextmanager
    def posting(self, B: int) -> Iterator[tuple[Helpers | None, tuple[Any, ...]]]:
        """For steps of B rows posted from compiled code (`kernels.posted_step`) while this lasts: the helper threads
        (None: the steps run on this thread) and the step's arguments after the logits (control, helpers, runs,
        flags, shared), cut as `__call__` cuts a step. The helpers are held awake throughout (`Helpers.hold`);
        raises if one of them failed."""
        if self.args is None:
            raise RuntimeError("the fused step runs only once ready() says so")
        threads = torch.get_num_threads()
        parts, runs = self._plan(B, threads)
        if not parts and runs == 1:  # (one thread, or rows too few to cut into runs: the step on this thread)
            yield None, (self._one, 0, 1, self._one, self._none)
            return
        hot = self._helpers(threads)
        if hot.failed is not None:
            raise RuntimeError("a fused step's helper thread failed") from hot.failed
        hot.hold(True)
        try:
            yield hot, (hot.control, threads - 1, 1 if parts else runs, hot.flags,
                        self._shared(B) if parts else self._none)
        finally:
            hot.hold(False)
        if hot.failed is not None:
            raise RuntimeError("a fused step's helper thread failed") from hot.failed

    def banned_step(self, ids: np.ndarray, cache: KVCache, logits: np.ndarray, banned: np.ndarray, eos: int,
                    longs: np.ndarray, cols: np.ndarray, posted: tuple[Any, ...]) -> None:
        """Within `posting`, with helper threads: one step of rows 0..B-1 from their recorded tokens (ids (B,) is
        scratch; `longs`, `cols` as in `greedy`), its logits (B, V) written and banned tokens set to -inf as
        `kernels.ban_tokens` does (`kernels.banned_step`); the cache's positions move on."""
        pos, mask, self_kv, cross_kv = cache.host_views()
        if not self.bound_banned(ids, pos, mask, self_kv, cross_kv, logits, banned, eos, longs, cols, *posted):
            failed = self.hot.failed if self.hot is not None else None
            raise RuntimeError("a fused step's helper thread failed") from failed
        cache.advance(ids.shape[0], on_device=False)

    def _run(self, ids: np.ndarray, views: tuple[np.ndarray, ...], logits: np.ndarray, align: np.ndarray, lo: int,
             hi: int, parts: int, flags: np.ndarray, shared: np.ndarray, part: int = 0) -> None:
        """Rows lo..hi-1 of the step (`parts` 1: flags and shared unused), or part `part` of `parts` of it."""
        rows = align[lo:hi] if align.shape[0] else align
        assert self.bound is not None
        if parts == 1:
            self.bound[0](ids[lo:hi], lo, *views, logits[lo:hi], rows)
        else:
            self.bound[1](ids[lo:hi], lo, *views, logits[lo:hi], rows, part, parts, flags, shared)

    def _helpers(self, threads: int) -> Helpers:
        """The helper threads for this many torch threads and the current weights and settings."""
        hot = self.hot
        if hot is None or hot.helpers != threads - 1 or hot.args is not self.args or hot.forks != _forks:
            if hot is not None and hot.forks == _forks:
                hot.stop()
            assert self.args is not None
            self.hot = hot = Helpers(self.args, threads - 1)
            weakref.finalize(self, hot.stop)
        return hot

    def _shared(self, rows: int) -> np.ndarray:
        """`_step`'s working arrays written by every part, for this many rows."""
        cfg = self.net.cfg
        return np.empty(shared_size(rows, cfg.d_model, cfg.d_ff), np.float32)

    @staticmethod
    def choose(logits: np.ndarray, banned: np.ndarray, eos: int, n_gen: np.ndarray, min_new: np.ndarray,
               history: np.ndarray, last: np.ndarray) -> np.ndarray:
        """Plain greedy rows' tokens from this step's logits (B, V), chosen and recorded in one compiled call
        (`model.kernels.choose_greedy`; `DecodeBatch.greedy_step`)."""
        tokens = np.empty(logits.shape[0], np.int64)
        choose_greedy(logits, banned, eos, n_gen, min_new, history, last, tokens)
        return tokens
