"""int8 with a scale per input row (model.projection.Rows8): a row's translation that does not depend on its batch,
for models without measured input ranges, in the fused step and operator by operator alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("numba", reason="int8 with a scale per row runs numba's products")

from model import checkpoint  # noqa: E402
from model.generation import GenerationConfig  # noqa: E402
from model.kernels import (  # noqa: E402
    INT8_DOT,
    _byte_dots,
    _int_dots,
    _product,
    pack_byte_panels,
    pack_weights,
    quantize_rows,
    weight_sums,
)
from model.projection import Int8Table, Rows8  # noqa: E402
from model.search import generate  # noqa: E402
from tests.helpers import MIXED, assert_requests_under_load_equal_each_alone


def written_out(x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """The arithmetic of int8 with a scale per row, one numpy operation at a time (float32 where the products
    round): weights per output row, each input row to 7 bits around its own largest value, exact sums."""
    q, scale = quantize_rows(w)
    amax = np.abs(x).max(1)
    a = np.where(amax != 0, np.float32(63) / np.where(amax != 0, amax, 1), 1).astype(np.float32)[:, None]
    xq = np.rint(x * a).astype(np.int64)  # float32 product, then half to even
    sums = xq @ q.astype(np.int64).T
    return (sums.astype(np.float32) * scale) / a + bias


def fused_product(x: np.ndarray, w: np.ndarray, bias: np.ndarray, act: int = 0) -> np.ndarray:
    q, scale = quantize_rows(w)
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    _product(x, pack_weights(q), scale, bias, Rows8.QUANT, weight_sums(q), act, np.empty((0, 0), np.float32), y)
    return y


@pytest.mark.parametrize(("rows", "inputs", "outputs"), [(1, 256, 37), (5, 64, 8), (3, 1024, 41), (2, 48, 5)])
def test_the_fused_and_the_operator_product_are_one_arithmetic(rows: int, inputs: int, outputs: int) -> None:
    """Bit for bit: the fused step's product (byte products for K a multiple of 32 with AVX2, int32 sums for other
    K), `Rows8` through fbgemm, and the arithmetic written out with numpy."""
    rng = np.random.default_rng(rows * inputs)
    x = (rng.standard_normal((rows, inputs)) * rng.uniform(0.1, 20, (rows, 1))).astype(np.float32)
    x[-1, :] = 0.0 if rows > 1 else x[-1, :]  # a row of zeros keeps scale 1
    w = (rng.standard_normal((outputs, inputs)) * 0.05).astype(np.float32)
    bias = rng.standard_normal(outputs).astype(np.float32)
    expected = written_out(x, w, bias)
    assert np.array_equal(fused_product(x, w, bias), expected)
    assert np.array_equal(Rows8(torch.from_numpy(w), torch.from_numpy(bias), None)(torch.from_numpy(x)).numpy(),
                          expected)
    relu = np.maximum(expected, 0)  # and with the activation applied in the same pass
    assert np.array_equal(fused_product(x, w, bias, act=1), relu)
    assert np.array_equal(Rows8(torch.from_numpy(w), torch.from_numpy(bias), "relu")(torch.from_numpy(x)).numpy(),
                          relu)
    assert np.abs(expected - (x @ w.T + bias)).max() <= 0.05 * np.abs(x @ w.T).max()  # still the product


@pytest.mark.skipif(not INT8_DOT, reason="AVX2's byte products are used only where numba compiles for AVX2")
@pytest.mark.parametrize(("rows", "outputs"), [(7, 13), (1, 40), (2, 8), (3, 24), (5, 3)])
def test_byte_products_of_7_bit_inputs_are_exact(rows: int, outputs: int) -> None:
    """Byte panels of 8 outputs (`pack_byte_panels`), taken four, three, two or one rows and one, two or four
    panels at a time, and the rows outside any panel: exact sums, whatever the rows and columns beside them."""
    rng = np.random.default_rng(rows * outputs)
    xq = rng.integers(0, 128, (rows, 96)).astype(np.uint8)
    w = rng.integers(-127, 128, (outputs, 96)).astype(np.int8)
    xq[0], w[0], w[-1] = 127, 127, -127  # the largest pairs of products: 2 * 127 * 127, still within int16
    packed = pack_byte_panels(w)
    assert outputs < 8 or not np.array_equal(packed, w)
    avx2, plain = np.empty((rows, outputs), np.int32), np.empty((rows, outputs), np.int32)
    _byte_dots(xq, packed, avx2)
    _int_dots(xq, w, plain, 0, w.shape[0])
    assert np.array_equal(avx2, plain)
    assert np.array_equal(plain, xq.astype(np.int64) @ w.astype(np.int64).T)
    for r in range(rows):  # each row alone
        alone = np.empty((1, outputs), np.int32)
        _byte_dots(xq[r:r + 1].copy(), packed, alone)
        assert np.array_equal(alone[0], plain[r])


def test_int8_without_ranges_takes_a_scale_per_row(tiny_model_dir: Path) -> None:
    lm = checkpoint.load(tiny_model_dir, device="cpu", dtype="int8")
    assert lm.int8 == "rows" and all(p.rows8 is not None for p in lm.net.projections().values())
    assert lm.net.fused is not None and lm.net.fused.ready() and lm.net.fused_encoder is not None
    dynamic = checkpoint.load(tiny_model_dir, device="cpu", dtype="int8", int8="dynamic")
    assert dynamic.int8 == "dynamic" and all(p.rows8 is None and p.int8 is not None
                                             for p in dynamic.net.projections().values())
    with pytest.raises(ValueError, match="int8.json"):
        checkpoint.load(tiny_model_dir, device="cpu", dtype="int8", int8="ranges")
    with pytest.raises(ValueError, match="int8 must be"):
        checkpoint.load(tiny_model_dir, device="cpu", dtype="int8", int8="per-row")


def test_int8_rows_keeps_the_embedding_tables_in_int8(tiny_model_dir: Path) -> None:
    """Looked up as int8 x the row's multiplier, by the operator step and the fused one alike; the modules' float32
    tables go with the linear weights (keep_modules=False), and the translations are those of the kept modules."""
    kept = checkpoint.load(tiny_model_dir, device="cpu", dtype="int8", int8="rows")
    lean = checkpoint.load(tiny_model_dir, device="cpu", dtype="int8", int8="rows", keep_modules=False)
    table = lean.net.tgt_table
    assert isinstance(table, Int8Table) and table.q.dtype == torch.int8
    assert lean.model.tgt_embed.weight.numel() == 0 and lean.model.src_embed.weight.numel() == 0
    q, scale = quantize_rows(kept.model.tgt_embed.weight.detach().numpy())
    ids = torch.tensor([[3, 7], [0, 11]])
    assert torch.equal(table.rows(ids), torch.from_numpy(q)[ids].float() * torch.from_numpy(scale)[ids][..., None])
    sources = [lean.tokenizer.encode(s) for s in MIXED]
    fused = lean.net.fused
    assert fused is not None
    config = GenerationConfig(max_new_tokens=16)
    runs = []
    for max_rows in (64, 0):  # the fused step's lookup and the operator step's
        fused.max_rows = max_rows
        with torch.inference_mode():
            runs.append([h[0].tokens for h in generate(lean.net, sources, config)])
    with torch.inference_mode():
        assert runs[0] == runs[1] == [h[0].tokens for h in generate(kept.net, sources, config)]


def test_a_row_is_the_same_alone_and_in_any_batch(tiny_model_dir: Path) -> None:
    """Bit for bit, greedy and beam, in the fused step at every row count and operator by operator; the two ways
    round norms and attention differently in the last bit, and give the same tokens."""
    lm = checkpoint.load(tiny_model_dir, device="cpu", dtype="int8", int8="rows")
    float32 = checkpoint.load(tiny_model_dir, device="cpu", dtype="float32")  # its products kept: the references
    sources = [lm.tokenizer.encode(s) for s in MIXED]
    fused = lm.net.fused
    assert fused is not None
    tokens = []
    for max_rows in (64, 0):
        fused.max_rows = max_rows
        for config in (GenerationConfig(max_new_tokens=16), GenerationConfig(beam_size=3, max_new_tokens=16)):
            with torch.inference_mode():
                together = generate(lm.net, sources, config)
                alone = [generate(lm.net, [s], config)[0] for s in sources]
            assert [[(h.tokens, h.score) for h in hyps] for hyps in together] == \
                [[(h.tokens, h.score) for h in hyps] for hyps in alone]
            tokens.append([hyps[0].tokens for hyps in together])
    assert tokens[:2] == tokens[2:]
    torch.manual_seed(0)  # and every product is still its float32 product, to int8's precision
    for name, p in lm.net.projections().items():
        reference = float32.net.projections()[name]
        assert p.rows8 is not None
        x = torch.randn(4, lm.net.cfg.d_ff if name.endswith("fc2") else lm.net.cfg.d_model)
        expected = reference(x)
        assert (p(x) - expected).abs().max() <= 0.03 * expected.abs().max(), name


def test_int8_rows_requests_under_load_equal_each_alone(tiny_model_dir: Path) -> None:
    """The server's CPU default for a model without int8.json (an import)."""
    assert_requests_under_load_equal_each_alone(tiny_model_dir, "int8")

