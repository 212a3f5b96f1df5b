"""The decode step replayed as CUDA graphs (model.graphs) decodes exactly as the ordinary step.

On the CPU the same fixed-shape step runs eagerly, so these tests check its masks, positions and bucketing of rows
everywhere; on a CUDA device they check the recorded graphs themselves.
"""

from __future__ import annotations

import pytest
import torch

from model import checkpoint
from model.decode import DecodeBatch
from model.frozen import freeze
from model.generation import GenerationConfig
from model.graphs import buckets
from model.search import generate
from tests.tiny import tiny_config, tiny_model

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="needs a CUDA device"))]


def sources(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [[*torch.randint(4, 96, (int(torch.randint(1, 14, (1,), generator=g)),), generator=g).tolist(), 2]
            for _ in range(n)]


def test_buckets() -> None:
    assert buckets(1) == [1]
    assert buckets(6) == [1, 2, 4, 6]
    assert buckets(64) == [1, 2, 4, 8, 16, 32, 64]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_graphed_step_equals_ordinary_step(device: str, norm: str) -> None:
    """Greedy and beam search through the fixed-shape step give the ordinary step's tokens and scores, with rows
    joining and leaving (more sources than rows) and row counts that are not buckets."""
    net = freeze(tiny_model(tiny_config(norm=norm), seed=1).to(device).eval())
    src = sources(23)
    for config in (GenerationConfig(max_new_tokens=12, min_new_tokens=5), GenerationConfig(beam_size=3,
                                                                                            max_new_tokens=10)):
        plain = generate(net, src, config, max_rows=10)
        batch = DecodeBatch(net, 10, max(len(s) for s in src), 12, graphs=True)
        assert batch.graphed is not None and bool(batch.graphed.recorded) == (device == "cuda")
        graphed = generate(net, src, config, batch=batch)
        assert [[h.tokens for h in hyps] for hyps in graphed] == [[h.tokens for h in hyps] for hyps in plain]
        for g, p in zip(graphed, plain, strict=True):
            assert g[0].score == pytest.approx(p[0].score, abs=1e-4)
        again = generate(net, src[:3], config, batch=batch)  # the batch (and its graphs) is reused
        assert [h[0].tokens for h in again] == [h[0].tokens for h in plain[:3]]


def test_generate_refuses_a_batch_too_small(tiny_loaded: checkpoint.LoadedModel) -> None:
    net = tiny_loaded.net
    batch = DecodeBatch(net, 4, 3, 8)
    with pytest.raises(ValueError, match="hold the longest source"):
        generate(net, [[5, 6, 7, 8, 2]], GenerationConfig(max_new_tokens=8), batch=batch)
