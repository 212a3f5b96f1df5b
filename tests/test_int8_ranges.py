"""int8 with fixed input ranges (model/calibrate.py): a row's translation does not depend on what shares its batch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from model import calibrate, checkpoint
from model.generation import GenerationConfig
from model.projection import Projection
from model.search import generate
from tests.helpers import MIXED, assert_requests_under_load_equal_each_alone, quantized
from tests.tiny import corpus_lines


def calibrated_copy(model_dir: Path, destination: Path) -> Path:
    """The model directory with an int8.json measured on generated sentences, as `python -m model.calibrate` does."""
    shutil.copytree(model_dir, destination)
    lm = checkpoint.load(destination, device="cpu")
    sources = [lm.tokenizer.encode(s) for s in corpus_lines(64, seed=7)]
    ranges = calibrate.measure(lm.net, sources, GenerationConfig(max_new_tokens=24))
    (destination / calibrate.RANGES_FILE).write_text(json.dumps({"ranges": ranges}))
    return destination


@pytest.mark.parametrize("activation", [None, "relu"])
def test_a_row_with_a_fixed_range_is_its_own(activation: str | None) -> None:
    """Rows of very different sizes: with a fixed input range each row's product is exactly what it is alone; with
    the per-call scale (dynamic int8) the small rows change with the large one beside them."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    x = torch.randn(5, 64) * torch.tensor([0.05, 1.0, 3.0, 0.5, 8.0])[:, None]
    dynamic = Projection([quantized(linear)], activation)
    fixed = Projection([quantized(linear)], activation)
    fixed.set_range(float(x.min()), float(x.max()))
    for proj, independent in ((fixed, True), (dynamic, False)):
        together = proj(x)
        alone = torch.cat([proj(x[i : i + 1]) for i in range(len(x))])
        assert torch.equal(alone, together) is independent
    reference = linear(x) if activation is None else torch.relu(linear(x))
    assert (fixed(x) - reference).abs().max() < 0.05 * reference.abs().max()  # still the same product


def test_calibrated_int8_decodes_alone_as_in_any_batch(tiny_model_dir: Path, tmp_path: Path) -> None:
    directory = calibrated_copy(tiny_model_dir, tmp_path / "model")
    lm = checkpoint.load(directory, device="cpu", dtype="int8")
    assert all(p.static is not None for p in lm.net.projections().values())
    dynamic = checkpoint.load(directory, device="cpu", dtype="int8", int8="dynamic")
    assert all(p.static is None for p in dynamic.net.projections().values())
    sources = [lm.tokenizer.encode(s) for s in MIXED]
    fused = lm.net.fused  # None without numba (the GPU script's bare machine)
    tokens = []
    # Bit for bit within each step: the fused one at every row count, then the operator-by-operator one. The two
    # round differently in the last bit (the server picks by row count, `FusedStep.max_rows`): same tokens.
    for max_rows in (64, 0) if fused is not None else (0,):
        if fused is not None:
            fused.max_rows = max_rows
        for config in (GenerationConfig(max_new_tokens=16), GenerationConfig(beam_size=3, max_new_tokens=16)):
            together = generate(lm.net, sources, config)
            alone = [generate(lm.net, [s], config)[0] for s in sources]
            assert [[(h.tokens, h.score) for h in hyps] for hyps in together] == \
                   [[(h.tokens, h.score) for h in hyps] for hyps in alone]
            tokens.append([[h.tokens for h in hyps] for hyps in together])
    assert tokens[:2] == tokens[-2:]


def test_ranges_that_do_not_fit_the_network_are_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    directory = calibrated_copy(tiny_model_dir, tmp_path / "model")
    path = directory / calibrate.RANGES_FILE
    ranges = json.loads(path.read_text())["ranges"]
    del ranges["out"]
    path.write_text(json.dumps({"ranges": ranges}))
    with pytest.raises(ValueError, match=r"missing \['out'\]"):
        checkpoint.load(directory, device="cpu", dtype="int8")
    assert checkpoint.load(directory, device="cpu", dtype="float32").net.out.static is None  # read for int8 only


def test_calibrated_int8_requests_under_load_equal_each_alone(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The server's CPU default precision, with ranges."""
    assert_requests_under_load_equal_each_alone(calibrated_copy(tiny_model_dir, tmp_path / "model"), "int8")
