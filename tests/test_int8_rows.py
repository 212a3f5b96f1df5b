"""int8 with a scale per input row (model.projection.Rows8): CTranslate2's int8 arithmetic, and a row's translation
that does not depend on its batch, for models without measured input ranges."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("numba", reason="int8 with a scale per row runs numba's products")

from model import checkpoint  # noqa: E402
from model.generation import GenerationConfig  # noqa: E402
from model.kernels import INT8_DOT, _byte_dots, _int_dots, _product, quantize_rows, weight_sums  # noqa: E402
from model.projection import Rows8  # noqa: E402
from model.search import generate  # noqa: E402
from tests.test_int8_ranges import MIXED  # noqa: E402
from tests.test_server_batching import assert_requests_under_load_equal_each_alone  # noqa: E402


def ctranslate2_int8(x: np.ndarray, w: np.ndarray, bias: np.ndarray, saturate: bool = False) -> np.ndarray:
    """CTranslate2's int8 product written out with numpy, operation by operation (src/cpu/kernels.cc,
    src/ops/dequantize_cpu.cc): weights per output row, each input row with its own scale, shifted into a byte.
    saturate: the products of neighbouring k added in pairs and saturated to int16, as AVX2's `vpmaddubsw` does
    where CTranslate2 runs without VNNI; otherwise the exact sums it has with VNNI."""
    q, w_scale = quantize_rows(w)
    amax = np.abs(x).max(1)
    a = np.where(amax != 0, np.float32(127) / np.where(amax != 0, amax, 1), 1).astype(np.float32)
    shifted = np.round(x * a[:, None] + np.float32(128)).astype(np.int64)  # float32, then half to even
    products = shifted[:, None, :] * q.astype(np.int64)[None]  # (B, N, K)
    pairs = products.reshape(*products.shape[:2], -1, 2).sum(-1)
    sums = (np.clip(pairs, -32768, 32767) if saturate else pairs).sum(-1) - 128 * q.astype(np.int64).sum(1)
    inverse = np.float32(1) / a
    return (sums.astype(np.float32) * inverse[:, None]) / w_scale[None, :] + bias


def product(x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    q, scale = quantize_rows(w)
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    _product(x, q, scale, bias, Rows8.QUANT, weight_sums(q), 0, np.empty((0, 0), np.float32), y)
    return y


@pytest.mark.parametrize(("rows", "inputs", "outputs"), [(1, 256, 37), (5, 64, 8), (3, 1024, 41), (2, 48, 5)])
def test_a_row_product_is_ctranslate2s_int8_arithmetic(rows: int, inputs: int, outputs: int) -> None:
    """Bit for bit, with the byte products (K a multiple of 32, AVX2) and with the pair sums of other K."""
    rng = np.random.default_rng(rows * inputs)
    x = (rng.standard_normal((rows, inputs)) * rng.uniform(0.1, 20, (rows, 1))).astype(np.float32)
    x[0, :] = 0.0 if rows > 1 else x[0, :]  # a row of zeros keeps scale 1
    w = (rng.standard_normal((outputs, inputs)) * 0.05).astype(np.float32)
    bias = rng.standard_normal(outputs).astype(np.float32)
    assert np.array_equal(product(x, w, bias), ctranslate2_int8(x, w, bias))


def test_no_pair_of_products_saturates() -> None:
    """Inputs and weights of one sign, where shifting the input into bytes would make AVX2 saturate pairs of
    products (CTranslate2 without VNNI): the sums stay exact."""
    rng = np.random.default_rng(3)
    x = rng.uniform(0.5, 1.0, (2, 64)).astype(np.float32)
    w = rng.uniform(0.5, 1.0, (6, 64)).astype(np.float32)
    bias = np.zeros(6, np.float32)
    got = product(x, w, bias)
    assert np.array_equal(got, ctranslate2_int8(x, w, bias))
    assert not np.allclose(got, ctranslate2_int8(x, w, bias, saturate=True), rtol=1e-3)


@pytest.mark.skipif(not INT8_DOT, reason="AVX2's byte products are used only where numba compiles for AVX2")
def test_byte_products_of_signed_inputs_are_exact() -> None:
    rng = np.random.default_rng(5)
    xq = rng.integers(-127, 128, (7, 96)).astype(np.int8)
    w = rng.integers(-127, 128, (13, 96)).astype(np.int8)
    xq[0], w[0], w[1] = 127, 127, -127  # the largest pairs: 2 * 127 * 127
    avx2, plain = np.empty((7, 13), np.int32), np.empty((7, 13), np.int32)
    _byte_dots(xq, w, avx2)
    _int_dots(xq, w, plain)
    assert np.array_equal(avx2, plain)
    assert np.array_equal(plain, xq.astype(np.int64) @ w.astype(np.int64).T)


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


def test_a_row_is_the_same_alone_and_in_any_batch(tiny_model_dir: Path) -> None:
    """Bit for bit, greedy and beam, in the fused step at every row count and operator by operator; the two ways
    round norms and attention differently in the last bit, and give the same tokens."""
    lm = checkpoint.load(tiny_model_dir, device="cpu", dtype="int8", int8="rows")
    float32 = checkpoint.load(tiny_model_dir, device="cpu", dtype="float32", keep_modules=False)
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
        x = torch.randn(4, p.rows8.q.shape[1] if p.rows8 is not None else 0)
        expected = reference(x)
        assert (p(x) - expected).abs().max() <= 0.03 * expected.abs().max(), name

def test_int8_rows_requests_under_load_equal_each_alone(tiny_model_dir: Path) -> None:
    """The server's CPU default for a model without int8.json (an import)."""
    assert_requests_under_load_equal_each_alone(tiny_model_dir, "int8")


def test_a_product_cut_over_threads_equals_it_uncut(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 52)
    rows8 = Rows8(linear.weight, linear.bias, "relu")
    x = torch.randn(3, 5, 64) * 4
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        uncut = rows8(x)
        monkeypatch.setattr(Rows8, "SPLIT_MIN_MACS", 1)
        for n in (2, 3):
            torch.set_num_threads(n)
            assert torch.equal(rows8(x), uncut)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(uncut, torch.from_numpy(product(x.view(15, 64).numpy(), linear.weight.detach().numpy(),
                                                       linear.bias.detach().numpy())).relu().view(3, 5, 52))
