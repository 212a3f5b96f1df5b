"""Alignment from cross-attention: each output token's most attended source token, kept through beams and batches."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from model import checkpoint
from model.decode import DecodeBatch
from model.events import Hypothesis
from model.generation import GenerationConfig
from model.search import generate

SOURCES = ["Open the file.", "Save changes before closing the settings window.", "Error", "Click here to continue."]
CONFIGS = {
    "greedy": GenerationConfig(max_new_tokens=24, alignment=True),
    "beam": GenerationConfig(beam_size=3, num_hypotheses=2, max_new_tokens=24, alignment=True),
    "sampling": GenerationConfig(do_sample=True, seed=3, max_new_tokens=24, alignment=True),
}


@pytest.fixture(scope="module")
def sources(tiny_loaded: checkpoint.LoadedModel) -> list[list[int]]:
    return [tiny_loaded.tokenizer.encode(s) for s in SOURCES]


def reference_weights(loaded: checkpoint.LoadedModel, src: list[int], tokens: list[int]) -> torch.Tensor:
    """The last decoder layer's cross-attention weights averaged over heads (T, S), from the training modules run
    on the whole target at once: row t is the step that chose tokens[t]."""
    model = loaded.model
    seen: dict[str, Any] = {}
    attn = model.decoder[-1].cross_attn
    handle = attn.register_forward_hook(lambda _m, args, _out: seen.update(args=args))
    try:
        with torch.no_grad():
            model(torch.tensor([src]), torch.tensor([[model.cfg.decoder_start_id, *tokens]]))
    finally:
        handle.remove()
    x, memory = seen["args"][0], seen["args"][1]
    q, (k, _) = attn.heads(attn.q_proj(x)), attn.project_kv(memory)  # (1, H, T+1, Dh), (1, H, S, Dh)
    weights = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).softmax(-1).mean(1)[0]  # (T+1, S)
    return weights[: len(tokens)]


def assert_most_attended(loaded: checkpoint.LoadedModel, src: list[int], hyp: Hypothesis) -> None:
    assert hyp.alignment is not None and len(hyp.alignment) == len(hyp.tokens)
    weights = reference_weights(loaded, src, hyp.tokens)
    for t, s in enumerate(hyp.alignment):
        assert 0 <= s < len(src)
        assert weights[t, s] >= weights[t].max() - 1e-5, (t, s, weights[t])  # an argmax (ties within float noise)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("graphs", [False, True], ids=["step", "fixed-step"])
def test_alignment_is_the_most_attended_source_token(tiny_loaded: checkpoint.LoadedModel, sources: list[list[int]],
                                                     name: str, graphs: bool) -> None:
    """Every hypothesis of the n-best list (beams reordered on the way) against the modules' own attention."""
    config = CONFIGS[name]
    batch = DecodeBatch(tiny_loaded.net, 8, max(map(len, sources)), 24, graphs=graphs) if graphs else None
    with torch.inference_mode():
        results = generate(tiny_loaded.net, sources, config, max_rows=8, batch=batch)
    for src, hyps in zip(sources, results, strict=True):
        for hyp in hyps:
            assert_most_attended(tiny_loaded, src, hyp)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_asking_for_alignment_changes_no_token_or_score(tiny_loaded: checkpoint.LoadedModel, sources: list[list[int]],
                                                        name: str) -> None:
    """Rows with and without alignment share batches; every row decodes as it does when nobody asks for it."""
    config = CONFIGS[name]
    plain = config.update(alignment=False)
    with torch.inference_mode():
        before = generate(tiny_loaded.net, sources, plain, max_rows=6)
        configs = [config if i % 2 else plain for i in range(len(sources))]
        mixed = generate(tiny_loaded.net, sources, configs, max_rows=6)
    for i, (a, b) in enumerate(zip(before, mixed, strict=True)):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-6)
        assert all((h.alignment is not None) == bool(i % 2) for h in b)
