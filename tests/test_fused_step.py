"""The fused CPU decode step (model/fused_step.py) against the operator-by-operator step it stands in for."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("numba", reason="the fused step needs numba (the GPU script's bare machine lacks it)")

from model import (  # noqa: E402
    calibrate,
    checkpoint,
    fused_step,
    search,
)
from model import fused_encoder as fused_encoder_module  # noqa: E402
from model.checkpoint import LoadedModel, quantize_int8, release_linear_weights  # noqa: E402
from model.decode import DecodeBatch  # noqa: E402
from model.frozen import FrozenTransformer, freeze  # noqa: E402
from model.fused_step import FusedStep, _weights  # noqa: E402
from model.generation import GenerationConfig  # noqa: E402
from model.kernels import (  # noqa: E402
    GO,
    HELPER_SLOTS,
    HOLD,
    INT8_DOT,
    _product,
    _product_cols,
    _rows1,
    _rows2,
    embed,
    pack_panels,
    pack_weights,
    post_step,
    shared_size,
    wait_done,
    weight_sums,
)
from model.projection import Projection  # noqa: E402
from model.search import generate  # noqa: E402
from tests.helpers import SOURCE_IDS, nets, quantized, released_decodes_as_kept
from tests.tiny import tiny_config, tiny_model  # noqa: E402


def steps(net: FrozenTransformer, count: int) -> list[torch.Tensor]:
    """Logits of `count` greedy steps with rows admitted at different times (rows at different positions, sources
    of different lengths), and the cache's K/V at the end."""
    batch = DecodeBatch(net, 8, 12, 16)
    config = GenerationConfig(max_new_tokens=16, min_new_tokens=16)
    out = []
    with torch.inference_mode():
        batch.admit([((0, i), SOURCE_IDS[i], config) for i in range(3)])
        for n in range(count):
            if n == 2:
                batch.admit([((0, i), SOURCE_IDS[i], config) for i in range(3, 5)])
            logits, _ = batch.forward()
            out.append(logits.clone())
            batch.record(logits.argmax(-1))
        # each row's K/V as far as it has written them (beyond, the buffers are left as allocated)
        pos = batch.cache.pos[:5].tolist()
        out.append(torch.cat([batch.cache.self_kv[:, :, r, :, :n].flatten() for r, n in enumerate(pos)]))
    return out


@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize(("norm", "activation", "eps"), [("pre", "relu", 1e-5), ("post", "gelu", 1e-5),
                                                         ("post", "swish", 1e-5), ("pre", "gelu", 1.0)])
def test_fused_step_equals_the_operator_step(dtype: str, norm: str, activation: str, eps: float) -> None:
    fused, plain = nets(dtype, norm=norm, activation=activation, layer_norm_eps=eps)
    # int8: a value a rounding step away from a quantization boundary may land on the other side
    tol = 1e-4 if dtype == "float32" else 2e-2
    for a, b in zip(steps(fused, 6), steps(plain, 6), strict=True):
        assert a.shape == b.shape and torch.equal(a.isinf(), b.isinf())  # tokens never generated: -inf in both
        real = ~b.isinf()
        assert (a[real] - b[real]).abs().max() <= tol * b[real].abs().max()


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_fused_greedy_and_beam_give_the_operator_steps_tokens(dtype: str) -> None:
    fused, plain = nets(dtype, norm="pre", activation="relu")
    for config in (GenerationConfig(max_new_tokens=12), GenerationConfig(max_new_tokens=12, beam_size=3)):
        with torch.inference_mode():
            a, b = generate(fused, SOURCE_IDS, config, max_rows=8), generate(plain, SOURCE_IDS, config, max_rows=8)
        assert [h[0].tokens for h in a] == [h[0].tokens for h in b]


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_a_row_is_the_same_alone_and_in_any_batch(dtype: str) -> None:
    """int8 sums are exact integers in any order, float32 ones are summed in order whatever the rows beside them
    (`model.kernels._panel_rows`), and each row's other arithmetic is its own: bit for bit equal."""
    fused, _ = nets(dtype, norm="pre", activation="relu")
    config = GenerationConfig(max_new_tokens=12)
    with torch.inference_mode():
        together = generate(fused, SOURCE_IDS, config, max_rows=8)
        alone = [generate(fused, [s], config, max_rows=1)[0] for s in SOURCE_IDS]
    assert [(h[0].tokens, h[0].score) for h in together] == [(h[0].tokens, h[0].score) for h in alone]


@pytest.mark.parametrize("dtype", ["float32", "int8", "rows8"])
def test_a_step_cut_over_threads_equals_the_step_in_one_run(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step of 7 rows on two threads, run three ways: in one run; in two runs of rows at once, rows 0-2 and 3-6
    (`split_min_rows` 3; rows pair up differently in the float32 products than in one run); in two parts of every
    product and attention (`parts_max_rows`), the second on a helper thread, or on the pool's when alignment is
    asked for. Logits, alignment weights and cache bit for bit equal, step after step; the helper's control block
    shows the cut it was given."""
    if dtype == "rows8":
        net = freeze(tiny_model(tiny_config()), rows8=True)
    else:
        net = nets(dtype, norm="pre", activation="relu")[0]
    fused = net.fused
    assert fused is not None and fused.ready()
    sources = [*SOURCE_IDS, [3, 4, 5, 2], [9, 2]]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for alignment in (False, True):
            runs = []
            for split, parts in ((10**6, 0), (3, 0), (10**6, 7)):
                monkeypatch.setattr(fused, "split_min_rows", split)
                monkeypatch.setattr(fused, "parts_max_rows", parts)
                batch = DecodeBatch(net, 8, 12, 16)
                config = GenerationConfig(max_new_tokens=16, min_new_tokens=16, alignment=alignment)
                out = []
                posted = fused.hot.control[GO] if fused.hot is not None else 0
                with torch.inference_mode():
                    batch.admit([((0, i), s, config) for i, s in enumerate(sources)])
                    for _ in range(5):
                        logits, align = batch.forward()
                        out += [logits.clone()] + ([align] if alignment else [])
                        batch.record(logits.argmax(-1))
                    out.append(batch.cache.self_kv[:, :, :7, :, :5].clone())
                runs.append(out)
                helped = fused.hot.control[GO] - posted if fused.hot is not None else 0
                assert helped == (5 if (split, alignment) == (3, False) or parts and not alignment else 0)
                if helped:  # the helper's share: rows 3-6 in one part, or part 1 of 2 of all 7 rows
                    at = HELPER_SLOTS
                    assert list(fused.hot.control[at:at + 3]) == ([3, 4, 0] if split == 3 else [0, 7, 1])
            assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[1], strict=True))
            assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[2], strict=True))
            if alignment:  # the weights were written: tokens look at other source positions than the first
                assert any(bool(a.any()) for a in runs[2][1:-1:2])
    finally:
        torch.set_num_threads(threads)


def test_a_one_row_step_in_parts_equals_it_in_one_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy decoding one sentence at a time on two threads, the step's products and attention cut in two parts:
    the same tokens and scores as in one run."""
    fused_net = nets("float32", norm="post", activation="gelu")[0]
    fused = fused_net.fused
    assert fused is not None
    config = GenerationConfig(max_new_tokens=12, scores=True)
    threads = torch.get_num_threads()
    results = []
    try:
        for parts in (0, 7):
            monkeypatch.setattr(fused, "parts_max_rows", parts)
            torch.set_num_threads(2)
            with torch.inference_mode():
                results.append([(h[0].tokens, h[0].score) for s in SOURCE_IDS
                                for h in generate(fused_net, [s], config, max_rows=1)])
    finally:
        torch.set_num_threads(threads)
    assert fused.hot is not None and fused.hot.control[GO] > 0
    assert results[0] == results[1]


def test_generate_from_threads_at_once_decodes_as_one_after_another() -> None:
    """Calls from two threads at once on two torch threads take turns (`FrozenTransformer.decoding`), with the same
    hypotheses as one after another: two callers posting steps to the fused step's helper thread at once had both
    wait for ever."""
    net = nets("float32", norm="pre", activation="relu")[0]
    configs = [GenerationConfig(max_new_tokens=16), GenerationConfig(beam_size=3, max_new_tokens=16)]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        expected = [[(h.tokens, h.score) for h in generate(net, [s], c, max_rows=3)[0]] for c in configs
                    for s in SOURCE_IDS]
        got: dict[int, list[tuple[list[int], float]]] = {}

        def work(c: int) -> None:
            for _ in range(5):
                for i, s in enumerate(SOURCE_IDS):
                    got[c * len(SOURCE_IDS) + i] = [(h.tokens, h.score) for h in generate(net, [s], configs[c],
                                                                                      max_rows=3)[0]]

        callers = [threading.Thread(target=work, args=(c,), daemon=True) for c in range(2)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(timeout=120)
        assert not any(caller.is_alive() for caller in callers), "the calls did not end"
    finally:
        torch.set_num_threads(threads)
    assert net.fused is not None and net.fused.hot is not None and net.fused.hot.control[GO] > 0  # helped
    assert [got[i] for i in range(len(expected))] == expected


@pytest.mark.parametrize(("outputs", "act"), [(100, 0), (64, 1), (37, 2), (200, 0)])
def test_a_float32_product_in_panels_is_each_rows_own(outputs: int, act: int) -> None:
    """float32 weights packed in panels (`pack_panels`; 100, 37 and 200 outputs leave rows outside any panel; 200
    takes the kernels of 4 panels a call for 1 to 4 rows): the product equals float64's within float32 rounding, and
    each output is bit for bit the same whichever rows share the call and however the columns are cut (in multiples
    of 16, as `_cols` cuts them over threads)."""
    rng = np.random.default_rng(outputs)
    w = rng.normal(0, 1, (outputs, 48)).astype(np.float32)
    bias = rng.normal(0, 1, outputs).astype(np.float32)
    x = rng.normal(0, 1, (9, 48)).astype(np.float32)
    packed, ones, off, none = pack_panels(w), np.ones(outputs, np.float32), np.zeros(4, np.float32), np.empty((0, 0))
    assert not np.array_equal(packed, w) and np.array_equal(np.sort(packed, None), np.sort(w, None))

    def product(rows: np.ndarray, j0: int = 0, j1: int = outputs) -> np.ndarray:
        y = np.zeros((rows.shape[0], outputs), np.float32)
        _product_cols(rows, packed, ones, bias, off, weight_sums(w), act, none.astype(np.float32), y, j0, j1)
        return y

    whole = product(x)
    sums = x.astype(np.float64) @ w.T.astype(np.float64) + bias
    expected = {0: sums, 1: np.maximum(sums, 0), 2: 0.5 * sums * (1 + np.vectorize(math.erf)(sums / math.sqrt(2)))}
    assert np.abs(whole - expected[act]).max() <= 1e-5 * np.abs(expected[act]).max()
    for rows in ([4], [0, 1], [2, 3, 5], [8, 7, 6, 5, 4], list(range(9))):
        assert np.array_equal(product(x[rows]), whole[rows])
    cut = np.concatenate([product(x, 0, 16)[:, :16], product(x, 16, outputs)[:, 16:]], axis=1)
    assert np.array_equal(cut, whole)


@pytest.mark.parametrize(("inputs", "terms"), [(64, 48), (1024, 256)])
def test_int8_product_equals_fbgemm_with_a_fixed_range(inputs: int, terms: int) -> None:
    """The same integer sums and scaling as fbgemm's product, saturating values outside the range alike."""
    torch.manual_seed(0)
    linear = quantized(nn.Linear(inputs, terms))
    x = torch.randn(5, inputs) * torch.tensor([0.05, 1.0, 3.0, 0.5, 8.0])[:, None]
    reference = Projection([linear])
    reference.set_range(float(x.min()) * 0.7, float(x.max()) * 0.7)  # the largest row saturates
    got = _weights([linear])
    assert got is not None and reference.static is not None
    scale, zero_point = reference.static
    y = np.empty((5, terms), np.float32)
    quant = np.array([1 / scale, scale, zero_point, 1], np.float32)
    w, scale, bias = got
    _product(x.numpy(), pack_weights(w), scale, bias, quant, weight_sums(w), 0, np.empty((0, 0), np.float32), y)
    expected = reference(x)
    assert (torch.from_numpy(y) - expected).abs().max() <= 1e-6 * expected.abs().max()


@pytest.mark.skipif(not INT8_DOT, reason="AVX2's byte products are used only where numba compiles for AVX2")
@pytest.mark.parametrize(("rows", "inputs", "outputs"), [(1, 32, 37), (1, 256, 8), (3, 64, 4), (8, 1024, 41)])
def test_int8_byte_products_give_the_exact_sums_of_the_float_way(rows: int, inputs: int, outputs: int) -> None:
    """With AVX2 an int8 product is dot(bytes, weights) - zero point * the weight row's sum (`_rows_u8`); without,
    float32 sums of (x - zero point) * w (`_rows1`, `_rows2`). The same integers, so the same outputs, for every
    input row, output count (whole groups of four and the rest) and zero point."""
    rng = np.random.default_rng(rows * inputs)
    w = rng.integers(-127, 128, (outputs, inputs)).astype(np.int8)
    scale = rng.uniform(0.001, 0.02, outputs).astype(np.float32)
    bias = rng.normal(0, 1, outputs).astype(np.float32)
    for zero_point in (0.0, 61.0, 127.0):
        quant = np.array([127 / 8, 8 / 127, zero_point, 1], np.float32)  # a range of 8 in 127 steps
        lo = -zero_point / quant[0]  # inputs within it (the range `Projection.set_range` measures), none saturating
        x = rng.uniform(lo, lo + 8, (rows, inputs)).astype(np.float32)
        y = np.empty((rows, outputs), np.float32)
        _product(x, pack_weights(w), scale, bias, quant, weight_sums(w), 1, np.empty((0, 0), np.float32), y)
        q = np.clip(np.round(x * quant[0]) + zero_point, 0, 255).astype(np.float32) - zero_point
        expected = np.empty_like(y)
        # ReLU, as act=1 above
        (_rows1 if rows == 1 else _rows2)(q, w, scale, bias, quant[1], 1, expected, 0, w.shape[0])
        assert np.abs(y - expected).max() <= 1e-6 * np.abs(expected).max()


def test_calibration_and_dynamic_int8_keep_the_operator_step() -> None:
    """Calibrating observes every product's inputs, and int8 without fixed ranges scales per call: neither is the
    fused step's arithmetic, so the network steps operator by operator then."""
    model = quantize_int8(tiny_model(tiny_config()))
    net = freeze(model)
    assert isinstance(net.fused, FusedStep) and not net.fused.ready()  # int8 without ranges
    float_net = freeze(tiny_model(tiny_config()))
    assert float_net.fused is not None and float_net.fused.ready()
    for p in float_net.projections().values():
        p.observed = torch.full((2,), math.inf)
    float_net.products_changed()
    assert not float_net.fused.ready()


@pytest.mark.parametrize("dtype", ["float32", "int8", "rows8"])
def test_large_models_decode_fused_with_their_weights_once(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights above MAX_WEIGHT_BYTES: the fused step takes steps of up to `max_rows_large` rows a thread while the
    operator step keeps its weights; once they are released (`release_operator_decoder`, as loading with
    keep_modules=False does) it takes every step, with the operator step's tokens, and the operator step refuses
    to run rather than read weights that are gone. int8 with neither input ranges nor a scale per row keeps the
    operator step's weights."""
    if dtype != "float32" and not INT8_DOT:
        pytest.skip("large int8 models keep the operator step without AVX2's byte products")
    monkeypatch.setattr(fused_step, "MAX_WEIGHT_BYTES", 1000)
    if dtype == "int8":
        net, plain = nets("int8", norm="pre", activation="relu")
        dynamic = freeze(quantize_int8(tiny_model(tiny_config())))
        assert dynamic.fused is not None and not dynamic.fused.ready() and not dynamic.release_operator_decoder()
    else:
        model = tiny_model(tiny_config())
        rows8 = dtype == "rows8"
        net, plain = freeze(model, rows8=rows8), freeze(model, fused=False, rows8=rows8)
        assert freeze(model, fused=False).release_operator_decoder() is False
    fused = net.fused
    assert fused is not None and fused.large and fused.ready()
    threads = torch.get_num_threads()
    assert fused.takes(FusedStep.max_rows_large * threads) and not fused.takes(FusedStep.max_rows_large * threads + 1)
    assert net.release_operator_decoder() and not net.operator_decoder and fused.takes(1000) and fused.ready()
    released_decodes_as_kept(net, plain, (GenerationConfig(max_new_tokens=12), GenerationConfig(
        max_new_tokens=12, beam_size=3), GenerationConfig(max_new_tokens=12, alignment=True)))


TEXTS = ["Open the file.", "Save changes before closing.", "Disk full.", "Select all copy paste undo.",
         "The file could not be opened.", "Click here to continue."]


def cut(model_dir: Path, dtype: str, parts: int,
        monkeypatch: pytest.MonkeyPatch) -> tuple[LoadedModel, FrozenTransformer, FusedStep]:
    """The tiny model with its fused step, whose steps of up to `parts` rows are cut in parts over the threads and
    larger ones (from 4 rows) into runs of rows."""
    loaded = checkpoint.load(model_dir, device="cpu", dtype=dtype)
    fused = loaded.net.fused
    assert fused is not None and fused.ready()
    monkeypatch.setattr(fused, "parts_max_rows", parts)
    monkeypatch.setattr(fused, "split_min_rows", 2)
    return loaded, loaded.net, fused


_STEPS = search.steps


def stepping(monkeypatch: pytest.MonkeyPatch, at_once: bool) -> list[Any]:
    """Make `generate` take its steps several at once where it may (`search.steps`) or one by one (`search.step`);
    every event goes into the list returned."""
    events: list[Any] = []

    def recorded(batch: DecodeBatch, most: int) -> list[Any]:
        out = _STEPS(batch, most) if at_once else search.step(batch)
        events.extend(out)
        return out

    monkeypatch.setattr(search, "steps", recorded)
    return events


def both_ways(run: Callable[[bool], list[Any]], threads: int, fused: FusedStep,
             taken: list[int]) -> tuple[list[Any], list[Any], int]:
    """`run` one by one, then at once, on this many torch threads; also how many steps the helper had been posted
    before the second (none may run at once in the first: `taken` stays empty)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        one_by_one = run(False)
        assert not taken
        posted = fused.hot.control[GO] if fused.hot is not None else 0
        return one_by_one, run(True), posted
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize(("threads", "parts"), [(1, 7), (2, 7), (2, 0)])
def test_greedy_steps_at_once_give_the_events_of_steps_one_by_one(tiny_model_dir: Path, dtype: str, threads: int,
                                                                   parts: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain greedy steps run at once in one compiled call (`search.steps`, `kernels.greedy_steps`) against the same
    steps one by one: the same events in the same order (every token, every ending, end of sentence and length),
    with more sources than rows (admission between runs), minimum and maximum lengths that differ by row, and the
    step on one thread, cut in parts on two, or in runs of rows on two. The runs did happen, several steps each,
    and afterwards the helpers are no longer held awake."""
    loaded, net, fused = cut(tiny_model_dir, dtype, parts, monkeypatch)
    texts = [*TEXTS, "Print.", "Close all windows now."]
    sources = [loaded.tokenizer.encode(t) for t in texts]
    configs = [GenerationConfig(max_new_tokens=(5, 40, 9, 40)[i % 4], min_new_tokens=(0, 0, 0, 12)[i % 4],
                                scores=False) for i in range(len(texts))]
    taken: list[int] = []
    greedy_steps = DecodeBatch.greedy_steps

    def counted(batch: DecodeBatch, most: int) -> np.ndarray | None:
        out = greedy_steps(batch, most)
        if out is not None:
            taken.append(out.shape[0])
        return out

    def run(at_once: bool) -> list[Any]:
        events = stepping(monkeypatch, at_once)
        with torch.inference_mode():
            hyps = search.generate(net, sources, configs, max_rows=4)
        return [events, [(h[0].tokens, h[0].finish_reason) for h in hyps]]

    monkeypatch.setattr(DecodeBatch, "greedy_steps", counted)
    one_by_one, at_once, posted = both_ways(run, threads, fused, taken)
    assert at_once[1] == one_by_one[1]
    assert [repr(e) for e in at_once[0]] == [repr(e) for e in one_by_one[0]]  # (repr: NaN log-probs compare unequal)
    assert {reason for _, reason in at_once[1]} == {"eos", "length"}
    assert len(taken) >= 3 and max(taken) > 4
    if threads > 1:  # the helper took its share of steps run at once, and is held no longer
        assert fused.hot is not None and fused.hot.control[GO] - posted > len(taken)
        assert fused.hot.control[HOLD] == 0


@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize(("threads", "parts"), [(1, 7), (2, 7), (2, 0)])
def test_beam_steps_in_one_loop_give_the_events_of_steps_one_by_one(tiny_model_dir: Path, dtype: str, threads: int,
                                                                    parts: int,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain beam searches stepped in one loop, the decoder steps posted from compiled code (`beams.beam_steps`),
    against the same steps one by one: the same events in the same order, every hypothesis with its score, with
    beams of 2 (4 when nothing else decodes), two hypotheses asked, lengths that differ and a length penalty, more
    sources than rows, cut in parts on two threads; on one thread, and in runs of rows on two, the loop is not
    taken. The loops took several steps each; the helpers are held no longer."""
    loaded, net, fused = cut(tiny_model_dir, dtype, parts, monkeypatch)
    texts = TEXTS
    sources = [loaded.tokenizer.encode(t) for t in texts]
    configs = [GenerationConfig(beam_size=2, num_hypotheses=(1, 2)[i % 2], max_new_tokens=(6, 40, 30)[i % 3],
                                length_penalty=(1.0, 0.6)[i % 2], scores=False) for i in range(len(texts))]
    alone = GenerationConfig(beam_size=4, num_hypotheses=3, max_new_tokens=30, scores=False)
    taken: list[int] = []
    original = search.beam_steps

    def counted(*args: Any) -> Any:
        out = original(*args)
        if out is not None:
            taken.append(out[1])
        return out

    def run(at_once: bool) -> list[Any]:
        events = stepping(monkeypatch, at_once)
        with torch.inference_mode():
            hyps = search.generate(net, sources, configs, max_rows=4)
            hyps += search.generate(net, sources[:2], alone, max_rows=4)
        return [repr(events), repr(hyps)]  # (repr: NaN log-probs compare unequal)

    monkeypatch.setattr(search, "beam_steps", counted)
    one_by_one, at_once, posted = both_ways(run, threads, fused, taken)
    assert at_once == one_by_one
    assert "'length'" in at_once[1] and "'eos'" in at_once[1]
    if not parts or threads == 1:  # one thread, or runs of rows: left to steps one by one (`beam_steps`)
        assert not taken
        return
    assert len(taken) >= 4 and max(taken) > 4
    if threads > 1:  # the helper took its share of steps posted from compiled code, and is held no longer
        assert fused.hot is not None and fused.hot.control[GO] - posted > len(taken)
        assert fused.hot.control[HOLD] == 0


@pytest.mark.parametrize("fused", [True, False])
def test_the_plain_greedy_step_gives_the_general_steps_tokens(tiny_loaded: LoadedModel, fused: bool,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The short way of plain greedy steps (`DecodeBatch.forward(choose=True)`: one compiled call after the fused
    step, numpy around the operator step) against the general one on the trained tiny model: the same tokens and
    endings, with rows joining and leaving, a banned token the model would pick, minimum lengths beyond where
    sentences end, scored sequences (the same log-probs both ways), and a sequence with a repetition penalty that
    sends the steps it shares the general way."""
    net = tiny_loaded.net
    assert net.fused is not None and net.fused.ready()
    if not fused:
        monkeypatch.setattr(net, "fused", None)
    texts = ["Open the file.", "Save changes before closing.", "Disk full.", "Select all copy paste undo.",
             "The file could not be opened.", "Click here to continue."]
    sources = [tiny_loaded.tokenizer.encode(t) for t in texts]
    free = GenerationConfig(max_new_tokens=24, scores=False)
    with torch.inference_mode():
        natural = [h[0].tokens for h in generate(net, sources, free)]
    common = max({t for tokens in natural for t in tokens}, key=lambda t: sum(x.count(t) for x in natural))

    def decode(configs: list[GenerationConfig]) -> list[tuple[list[int], str, float | None]]:
        batch = DecodeBatch(net, 4, max(map(len, sources)), 40)
        batch.banned = torch.cat([batch.banned, torch.tensor([common])])
        batch.banned_host = batch.banned.numpy()
        with torch.inference_mode():
            return [(h[0].tokens, h[0].finish_reason, h[0].score if c.scores else None)
                    for h, c in zip(generate(net, sources * 2, configs, batch=batch), configs, strict=True)]

    banned = decode([free] * len(sources) * 2)[: len(sources)]  # where each sentence ends without `common`
    configs = [free.update(max_new_tokens=40, min_new_tokens=len(tokens) + 2) if i % 2 and reason == "eos" else free
               for i, (tokens, reason, _) in enumerate(banned)] * 2
    configs[2] = configs[2].update(scores=True)
    configs[3] = configs[3].update(scores=True)
    configs[7] = configs[7].update(repetition_penalty=1.3)  # while it decodes, no step is plain
    assert any(c.min_new_tokens for c in configs)
    ran = []
    forward, admit = DecodeBatch.forward, DecodeBatch.admit

    def counted(batch: DecodeBatch, choose: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = forward(batch, choose)
        ran.append(batch.plain)
        return out

    def never_plain(batch: DecodeBatch, *args: Any) -> None:
        admit(batch, *args)
        for seq in batch.seqs.values():
            seq.plain = False

    monkeypatch.setattr(DecodeBatch, "forward", counted)
    short = decode(configs)
    assert any(ran) and not all(ran), "both ways ran"
    monkeypatch.setattr(DecodeBatch, "admit", never_plain)
    ran.clear()
    assert short == decode(configs)
    assert ran and not any(ran), "the general way alone"
    assert any(common in tokens for tokens in natural) and all(common not in tokens for tokens, _, _ in short)
    assert all(len(tokens) >= c.min_new_tokens for (tokens, _, _), c in zip(short, configs, strict=True))
    assert all(math.isfinite(score) for _, _, score in short[2:4])


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_steps_never_read_the_cache_beyond_each_rows_length(dtype: str) -> None:
    """The CPU cache's K/V buffers are left as allocated (KVCache zeroed=False): the fused and the operator step
    read each row's keys up to its own length only. With NaN everywhere beforehand, greedy and beam search (rows
    reordered, joining and leaving, 1 to 8 at a time) give the tokens and scores of a zeroed cache; the masked
    fixed-shape step gets a zeroed cache."""
    fused, plain = nets(dtype, norm="pre", activation="relu")
    for net in (fused, plain):
        assert net.by_length and not bool(net.new_cache(2, 4, 4, fixed=True).self_kv.any())
        for config in (GenerationConfig(max_new_tokens=10), GenerationConfig(max_new_tokens=10, beam_size=2)):
            runs = []
            for poison in (False, True):
                batch = DecodeBatch(net, 8, 12, 16)
                if poison:
                    batch.cache.self_kv.fill_(math.nan)
                    batch.cache.cross_kv.fill_(math.nan)
                with torch.inference_mode():
                    runs.append([(h[0].tokens, h[0].score) for h in generate(net, SOURCE_IDS * 2, config, batch=batch)])
            assert runs[0] == runs[1]


def test_warming_the_parts_compiles_them_and_starts_no_thread() -> None:
    """`warm_parts` (the server's schedulers on more than one thread) runs `step_parts`, `encode_parts` and a helper's
    loop told to stop at once; no helper thread is started until a step is cut."""
    net = nets("int8", norm="pre", activation="relu")[0]
    assert net.fused is not None
    before = set(threading.enumerate())  # (an earlier test's helpers may end meanwhile: only new ones count)
    net.warm_parts()
    assert net.fused.hot is None and not set(threading.enumerate()) - before


@pytest.mark.parametrize("dtype", ["float32", "rows8", "int8"])
def test_tied_tables_are_read_from_the_packed_output_projection(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tied output projection is the target embedding table, number for number: the fused step reads the table
    from the projection's packed weights (a vocabulary of 99 pieces: panels and the rows after the last whole panel)
    and, once the operator step's weights are released, so do the encoder's and decoder's lookups, and the modules'
    tables go: the same logits bit for bit as from the table's own copy, the same rows, the same tokens. int8 with
    input ranges (float32 tables, int8 projection) keeps its tables."""
    if dtype != "float32" and not INT8_DOT:
        pytest.skip("large int8 models keep the operator step without AVX2's byte products")
    monkeypatch.setattr(fused_step, "MAX_WEIGHT_BYTES", 1000)
    cfg = tiny_config(vocab_size=99)
    rows8 = dtype == "rows8"
    if dtype == "int8":
        model = tiny_model(cfg)
        ranges = calibrate.measure(freeze(model, fused=False), SOURCE_IDS, GenerationConfig(max_new_tokens=12))
        model = quantize_int8(model)
        net, plain = freeze(model), freeze(model, fused=False)
        calibrate.apply(net, ranges)
        calibrate.apply(plain, ranges)
    else:
        model = tiny_model(cfg)
        net, plain = freeze(model, rows8=rows8), freeze(model, fused=False, rows8=rows8)
    fused = net.fused
    assert fused is not None and fused.large and fused.tied == (dtype != "int8")
    if dtype == "int8":
        assert net.release_operator_decoder() and isinstance(net.src_table, torch.Tensor)
        return
    assert fused.arrays["table"].ndim == 1  # flat: read through the panels
    own = freeze(model, rows8=rows8)  # the same step reading the table's own (V, D) copy
    assert own.fused is not None
    table = plain.tgt_table
    own.fused.arrays["table"] = table.q.numpy() if rows8 else table.numpy()  # type: ignore[union-attr]
    own.fused.arrays["table_scale"] = (table.row_scale.numpy() if rows8  # type: ignore[union-attr]
                                       else np.ones(99, np.float32))
    own.fused.changed()
    for a, b in zip(steps(net, 6), steps(own, 6), strict=True):
        assert torch.equal(a, b)
    rows = [np.empty((99, 32), np.float32) for _ in range(2)]  # every piece, panels and the rows after them
    for x, step in zip(rows, (net.fused, own.fused), strict=True):
        a = step.arrays
        embed(x, np.arange(99), a["table"], a["table_scale"], np.float32(1.0), np.zeros((1, 32), np.float32),
              np.zeros(99, np.int64))
    assert np.array_equal(rows[0], rows[1])
    ids = torch.arange(99).view(9, 11)
    assert net.release_operator_decoder() and net.src_table is net.tgt_table
    zero = torch.zeros(11, 32)
    assert torch.equal(net.embed(net.src_table, ids, zero), plain.embed(plain.src_table, ids, zero))
    release_linear_weights(model, net)
    assert model.src_embed.weight.numel() == 0 and model.tgt_embed.weight.numel() == 0
    for config in (GenerationConfig(max_new_tokens=12), GenerationConfig(max_new_tokens=12, beam_size=3)):
        with torch.inference_mode():
            a, b = generate(net, SOURCE_IDS, config, max_rows=12), generate(plain, SOURCE_IDS, config, max_rows=12)
        assert [h[0].tokens for h in a] == [h[0].tokens for h in b]


def test_a_helper_that_fails_before_its_first_step_fails_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A helper thread whose loop raises before it takes any step (a typing error in a new compiled signature, say)
    makes the caller's step raise, instead of leaving it spinning for a part that will never be done."""
    net, _ = nets("float32", norm="pre", activation="relu")
    fused = net.fused
    assert fused is not None

    def broken(*args: Any) -> int:
        raise ValueError("no such signature")

    monkeypatch.setattr(fused_step, "step_worker", broken)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            steps(net, 1)
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome.append(e)

    try:
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(60)
    finally:
        torch.set_num_threads(threads)
    assert not thread.is_alive(), "the step waited for a helper that had failed"
    assert isinstance(outcome[0], RuntimeError) and isinstance(outcome[0].__cause__, ValueError)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize("fused_encoder", [True, False])
def test_a_lean_load_never_packs_what_the_fused_parts_take(tiny_model_dir: Path, dtype: str, fused_encoder: bool,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading to decode (keep_modules=False) builds the network with its operator products deferred
    (`freeze(defer=True)`): where the fused step takes every step (a large model) the operator decoder's products
    are released without ever being packed, what still runs (the operator encoder, where no fused one takes its
    place) is packed while loading, the decoder modules' weights go as the fused step packs its copy, and the tokens
    are those of a network loaded whole."""
    if dtype == "int8" and not INT8_DOT:
        pytest.skip("large int8 models keep the operator step without AVX2's byte products")
    monkeypatch.setattr(fused_step, "MAX_WEIGHT_BYTES", 1000)
    if not fused_encoder:
        monkeypatch.setattr(fused_encoder_module, "MAX_WEIGHT_BYTES", 1000)
    packed: list[Projection] = []
    pack = Projection._pack
    monkeypatch.setattr(Projection, "_pack", lambda self, *args: (packed.append(self), pack(self, *args))[1])
    lean = checkpoint.load(tiny_model_dir, device="cpu", dtype=dtype, int8="rows", keep_modules=False)
    net = lean.net
    assert not net.operator_decoder and net.operator_encoder != fused_encoder
    assert net.fused is not None and net.fused.consumed  # the decoder modules' weights went as the step packed them
    products = net.projections()
    assert all(p.pending is None for p in products.values())
    decoder = [p for name, p in products.items() if name.startswith("decoder.") or name == "out"]
    encoder = [p for name, p in products.items() if name.startswith("encoder.") or name == "cross_kv"]
    assert decoder and all(p.released and not any(p is q for q in packed) for p in decoder)
    assert encoder and all(any(p is q for q in packed) != fused_encoder for p in encoder)
    full = checkpoint.load(tiny_model_dir, device="cpu", dtype=dtype, int8="rows")
    sources = [full.tokenizer.encode(t) for t in ("Open the file.", "Save changes before closing.", "Disk full.")]
    for config in (GenerationConfig(max_new_tokens=12), GenerationConfig(max_new_tokens=12, beam_size=3)):
        a, b = generate(lean.net, sources, config), generate(full.net, sources, config)
        assert [h[0].tokens for h in a] == [h[0].tokens for h in b]  # (scores: the two steps' float rounding)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_steps_write_into_the_caches_buffers_and_decode_step_returns_its_own(dtype: str) -> None:
    """A batch's steps hand back logits in the cache's scratch buffer (no (rows, V) array a step: glibc mapped one
    anew every step under `runtime.settle_heap`'s threshold), while `decode_step` without `out` returns a tensor of
    its own each call, so a caller that keeps one step's logits (tests/test_model.py stacks them) keeps them."""
    fused, _ = nets(dtype, norm="pre", activation="relu")
    batch = DecodeBatch(fused, 8, 12, 16)
    config = GenerationConfig(max_new_tokens=16, min_new_tokens=16)
    with torch.inference_mode():
        batch.admit([((0, i), SOURCE_IDS[i], config) for i in range(3)])
        first, _ = batch.forward()
        kept = first.clone()
        batch.record(first.argmax(-1))
        second, _ = batch.forward()
        kept_with_cache = batch.cache.scratch("logits", 3, fused.cfg.tgt_vocab_size)
        assert second.data_ptr() == first.data_ptr() == kept_with_cache.data_ptr()
        assert not torch.equal(second, kept)  # the next step's numbers, in the same memory
        cache = fused.new_cache(2, 12, 8)
        cache.admit(0, *fused.encode_cross(torch.tensor([SOURCE_IDS[0], SOURCE_IDS[3] + [0, 0]])))
        a = fused.decode_step(torch.tensor([1, 1]), cache)
        b = fused.decode_step(torch.tensor([5, 6]), cache)
        assert a.data_ptr() != b.data_ptr() and not torch.equal(a, b)


def test_a_step_whose_arrays_the_helpers_would_misread_is_refused_before_it_is_posted() -> None:
    """The helpers rebuild a posted step's arrays from raw addresses with the shapes the weights imply: logits of
    another width, or a cache that is a strided view, would be read as garbage, so `post_step` refuses them with
    ValueError before anything is posted; the same step with its own arrays is then posted as before."""
    net, _ = nets("float32", norm="pre", activation="relu")
    fused = net.fused
    assert fused is not None and fused.ready() and fused.args is not None
    batch = DecodeBatch(net, 8, 12, 16)
    config = GenerationConfig(max_new_tokens=4)
    with torch.inference_mode():
        batch.admit([((0, i), s, config) for i, s in enumerate(SOURCE_IDS[:3])])
    pos, mask, self_kv, cross_kv = batch.cache.host_views()
    hot = fused._helpers(2)
    ids, V = np.zeros(3, np.int64), fused.args.w_out.shape[0]
    shared = np.empty(shared_size(3, fused.args.positions.shape[1], fused.args.w_1.shape[1]), np.float32)
    strided = np.zeros((*self_kv.shape[:-1], self_kv.shape[-1] * 2), np.float32)[..., ::2]
    wrong = [(np.zeros((3, V + 1), np.float32), self_kv), (np.zeros((3, V), np.float32), strided)]
    for logits, kv in wrong:
        go = hot.control[GO]
        with pytest.raises(ValueError, match="posted step"):
            post_step(hot.control, 1, 2, ids, logits, pos, mask, kv, cross_kv, shared, fused.args)
        assert hot.control[GO] == go  # nothing posted
    go = hot.control[GO]
    hot.hold(True)  # the helper may have gone to sleep meanwhile (compiling the above): woken and kept awake
    try:
        # runs of rows (2): the helper's rows 1-2 on their own; the caller's row 0 is left alone here
        assert post_step(hot.control, 1, 2, ids, np.zeros((3, V), np.float32), pos, mask, self_kv, cross_kv, shared,
                         fused.args) == go + 1
        wait_done(hot.control, 1, go + 1)
    finally:
        hot.hold(False)
    hot.stop()
    fused.hot = None
