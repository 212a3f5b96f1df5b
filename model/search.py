"""Greedy decoding, beam search and sampling over many sources: plain functions over DecodeBatch's step."""

from __future__ import annotations

from collections.abc import Hashable
from collections.abc import Sequence as Seq

from model.batch import DecodeBatch, FinishEvent, Hypothesis
from model.generation import GenerationConfig
from model.transformer import Transformer


def generate(
    model: Transformer,
    sources: Seq[list[int]],
    config: GenerationConfig | Seq[GenerationConfig],
    max_rows: int = 64,
) -> list[list[Hypothesis]]:
    """Translate token-id sources; returns the n-best hypotheses of each, best first.

    Sources join the batch as soon as rows are free (continuous batching), so this is also the offline
    engine. `config` is one setting for all sources, or one per source.
    """
    configs = [config] * len(sources) if isinstance(config, GenerationConfig) else list(config)
    if len(configs) != len(sources):
        raise ValueError("need one GenerationConfig per source")
    widest = max((c.beam_size for c in configs), default=1)
    rows = max(max_rows, widest)
    max_src = max((len(s) for s in sources), default=1)
    max_tgt = max((c.max_new_tokens for c in configs), default=1)
    batch = DecodeBatch(model, rows, max_src, max_tgt)
    results: dict[Hashable, list[Hypothesis]] = {}
    waiting = list(range(len(sources)))
    while waiting or len(batch):
        admit: list[int] = []
        free = batch.free_rows
        while waiting and configs[waiting[0]].beam_size <= free:
            free -= configs[waiting[0]].beam_size
            admit.append(waiting.pop(0))
        batch.admit([(i, list(sources[i]), configs[i]) for i in admit])
        for event in batch.step():
            if isinstance(event, FinishEvent):
                results[event.key] = event.hypotheses
    return [results[i] for i in range(len(sources))]


def greedy(model: Transformer, sources: Seq[list[int]], max_new_tokens: int = 256) -> list[list[int]]:
    """Most likely token at each step."""
    config = GenerationConfig(max_new_tokens=max_new_tokens)
    return [h[0].tokens for h in generate(model, sources, config)]


def beam_search(
    model: Transformer, sources: Seq[list[int]], beam_size: int = 4, num_hypotheses: int = 1, **settings: float
) -> list[list[Hypothesis]]:
    """n-best lists by beam search."""
    config = GenerationConfig(beam_size=beam_size, num_hypotheses=num_hypotheses).update(**settings)
    return generate(model, sources, config)


def sample(model: Transformer, sources: Seq[list[int]], seed: int, **settings: float) -> list[list[int]]:
    """Random sampling, reproducible by seed."""
    config = GenerationConfig(do_sample=True, seed=seed).update(**settings)
    return [h[0].tokens for h in generate(model, sources, config)]
