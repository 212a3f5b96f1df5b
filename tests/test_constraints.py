"""Lexically constrained decoding: every constraint appears, and rows without constraints are untouched."""

from __future__ import annotations

import pytest

from model import checkpoint
from model.constraints import Constraints, select_beams
from model.decode import DecodeBatch
from model.events import FinishEvent, TokenEvent
from model.generation import GenerationConfig
from model.search import generate, step

SOURCES = ["Open the file.", "Save changes before closing the settings window.", "Error", "Click here to continue."]
TERMS = ["arquivo", "configurações", "salvar"]


@pytest.fixture(scope="module")
def loaded(tiny_loaded: checkpoint.LoadedModel) -> checkpoint.LoadedModel:
    return tiny_loaded


@pytest.fixture(scope="module")
def sources(loaded: checkpoint.LoadedModel) -> list[list[int]]:
    return [loaded.tokenizer.encode(s) for s in SOURCES]


@pytest.fixture(scope="module")
def terms(loaded: checkpoint.LoadedModel) -> list[list[int]]:
    return [loaded.tokenizer.target.encode(t) for t in TERMS]  # target pieces, no end-of-sentence


def contains(tokens: list[int], term: list[int]) -> bool:
    return any(tokens[i:i + len(term)] == term for i in range(len(tokens) - len(term) + 1))


def single(terms: list[list[int]]) -> list[list[list[int]]]:
    """Constraints of one alternative each."""
    return [[t] for t in terms]


CONFIGS = [
    GenerationConfig(max_new_tokens=24),
    GenerationConfig(beam_size=4, num_hypotheses=2, max_new_tokens=24),
    GenerationConfig(do_sample=True, seed=5, max_new_tokens=24),
]


@pytest.mark.parametrize("config", CONFIGS, ids=["greedy", "beam", "sampling"])
def test_every_constraint_appears_in_every_output(loaded: checkpoint.LoadedModel, sources: list[list[int]],
                                                   terms: list[list[int]], config: GenerationConfig) -> None:
    wanted = [terms[: 1 + i % len(terms)] for i in range(len(sources))]
    found = generate(loaded.net, sources, config, constraints=[single(w) for w in wanted])
    for hyps, mine in zip(found, wanted, strict=True):
        for h in hyps:
            assert all(contains(h.tokens, t) for t in mine), (h.tokens, mine)


@pytest.mark.parametrize("config", CONFIGS, ids=["greedy", "beam", "sampling"])
def test_constraints_fit_a_tight_length_budget(loaded: checkpoint.LoadedModel, sources: list[list[int]],
                                               terms: list[list[int]], config: GenerationConfig) -> None:
    owed = sum(len(t) for t in terms)
    tight = config.update(max_new_tokens=owed + 1)
    for hyps in generate(loaded.net, sources, tight, constraints=[single(terms)] * len(sources)):
        assert all(contains(hyps[0].tokens, t) for t in terms)
        assert len(hyps[0].tokens) <= owed + 1


@pytest.mark.parametrize("config", CONFIGS, ids=["greedy", "beam", "sampling"])
def test_rows_without_constraints_decode_as_alone_beside_constrained_rows(
    loaded: checkpoint.LoadedModel, sources: list[list[int]], terms: list[list[int]], config: GenerationConfig
) -> None:
    wanted = [single(terms) if i % 2 else None for i in range(len(sources))]
    together = generate(loaded.net, sources, config, constraints=wanted)
    alone = generate(loaded.net, sources, config)
    for i in range(0, len(sources), 2):
        assert [h.tokens for h in together[i]] == [h.tokens for h in alone[i]]
        assert [h.score for h in together[i]] == pytest.approx([h.score for h in alone[i]], abs=1e-4)


@pytest.mark.parametrize("config", CONFIGS[:2], ids=["greedy", "beam"])
def test_a_constraint_the_model_already_writes_changes_nothing(
    loaded: checkpoint.LoadedModel, sources: list[list[int]], config: GenerationConfig
) -> None:
    free = generate(loaded.net, sources, config)
    own = [[[h[0].tokens[:2]]] for h in free]  # the start of each output, as a constraint
    forced = generate(loaded.net, sources, config, constraints=own)
    assert [h[0].tokens for h in forced] == [h[0].tokens for h in free]


def test_greedy_constrained_rows_stream_the_tokens_they_finish_with(
    loaded: checkpoint.LoadedModel, sources: list[list[int]], terms: list[list[int]]
) -> None:
    batch = DecodeBatch(loaded.net, rows=8, max_src=32, max_tgt=24)
    config = GenerationConfig(max_new_tokens=24)
    batch.admit([((0, i), s, config) for i, s in enumerate(sources)], [single(terms)] * len(sources))
    streamed: dict[int, list[int]] = {i: [] for i in range(len(sources))}
    final: dict[int, list[int]] = {}
    while len(batch):
        for e in step(batch):
            if isinstance(e, TokenEvent):
                streamed[e.sentence].append(e.token)
            elif isinstance(e, FinishEvent):
                final[e.sentence] = e.hypotheses[0].tokens
    assert streamed == final
    assert all(contains(final[i], t) for i in final for t in terms)


def test_bad_constraints_are_refused_before_anything_is_encoded(loaded: checkpoint.LoadedModel,
                                                                sources: list[list[int]]) -> None:
    batch = DecodeBatch(loaded.net, rows=4, max_src=32, max_tgt=8)
    config = GenerationConfig(max_new_tokens=8)
    for bad in ([[]], [[[]]], [[[loaded.net.cfg.eos_id]]], [[[loaded.net.cfg.tgt_vocab_size]]], [[[-1]]]):
        with pytest.raises(ValueError, match="constraint"):
            batch.admit([((0, 0), sources[0], config)], [bad])
    with pytest.raises(ValueError, match="per item"):
        batch.admit([((0, 0), sources[0], config)], [])
    assert len(batch) == 0 and batch.n == 0


def test_progress_through_constraints() -> None:
    c = Constraints([[[5, 6, 7]], [[9]]])
    p = c.start()
    assert c.owed(p) == 4 and c.next_tokens(p) == [5, 9]
    p = c.advance(p, 5)
    assert c.next_tokens(p) == [6] and c.written(p) == 1
    p = c.advance(p, 9)  # left half written: not met, but 9 meets the other
    assert p.met == (False, True) and c.owed(p) == 3 and c.written(p) == 1
    for t in (5, 6, 7):
        p = c.advance(p, t)
    assert c.satisfied(p) and c.owed(p) == 0


def test_any_alternative_meets_a_constraint() -> None:
    c = Constraints([[[5, 6], [8, 6], [5, 6, 4]]])
    assert c.owed(c.start()) == 2 and c.next_tokens(c.start()) == [5, 8]
    assert c.satisfied(c.advance(c.advance(c.start(), 8), 6))
    started = c.advance(c.start(), 5)
    assert c.satisfied(c.advance(started, 6))  # the shorter of two alternatives that begin alike
    assert not c.satisfied(c.advance(started, 4))


def test_greedy_choice_continues_starts_and_forces() -> None:
    c = Constraints([[[5, 6]], [[9]]])
    p = c.start()
    eos = 2

    def choose(q: object, token: int, starts: dict[int, float], budget: int = 10) -> int:
        assert isinstance(q, type(p))
        return c.choose(q, token, 0.0, starts, budget, eos)[0]

    assert choose(p, 4, {5: -10.0, 9: -20.0}) == 4  # far from the model's choice
    assert choose(p, 4, {5: -10.0, 9: -1.0}) == 9  # close to it
    assert choose(p, 9, {5: -10.0, 9: 0.0}) == 9  # the model's own choice
    assert choose(p, 4, {5: -10.0, 9: -20.0}, budget=3) == 5  # only just fits
    assert choose(c.advance(p, 5), 4, {6: -30.0}) == 6  # started: continued
    token, q = c.choose(p, eos, 0.0, {5: -10.0, 9: -20.0}, 10, eos)
    assert token == 5 and q.ending  # the model wanted to end: the constraint it likes best, then the end
    q = c.advance(c.advance(c.advance(q, 5), 6), 9)
    assert c.satisfied(q) and c.pending(q) and c.choose(q, 4, 0.0, {}, 10, eos)[0] == eos


def test_a_greedy_row_starts_a_term_where_it_attends_to_the_terms_words() -> None:
    c = Constraints([[[5, 6]], [[9]]], sources=[[3, 4], [7]])
    p, eos = c.start(), 2
    far = {5: -7.0, 9: -20.0}  # the model prefers its own word by 7 nats: too far without alignment
    assert c.choose(p, 4, 0.0, far, 10, eos)[0] == 4
    assert c.choose(p, 4, 0.0, far, 10, eos, looking=[3, 4])[0] == 5  # two steps on the term's words
    assert c.choose(p, 4, 0.0, far, 10, eos, looking=[2, 3])[0] == 4  # one step: an article before the noun
    assert c.choose(p, 4, 0.0, far, 10, eos, looking=[7, 7])[0] == 9  # on the other term's words: that term
    assert c.choose(p, 4, 0.0, {5: -40.0, 9: -20.0}, 10, eos, looking=[3, 3])[0] == 5  # however far the model is
    unknown = Constraints([[[5, 6]], [[9]]])
    assert unknown.choose(unknown.start(), 4, 0.0, far, 10, eos, looking=[3, 4])[0] == 4  # sources not known


def test_rows_with_term_positions_meet_their_constraints_and_leave_others_alone(
    loaded: checkpoint.LoadedModel, sources: list[list[int]], terms: list[list[int]]
) -> None:
    """Term positions (each term said to translate the source's first tokens) change where terms start, never
    whether they are met, nor any row without constraints."""
    config = CONFIGS[0]
    wanted = [single(terms) if i % 2 else None for i in range(len(sources))]
    where = [[[0, 1, 2]] * len(terms) if i % 2 else None for i in range(len(sources))]
    together = generate(loaded.net, sources, config, constraints=wanted, constraint_sources=where)
    alone = generate(loaded.net, sources, config)
    for i, hyps in enumerate(together):
        if i % 2:
            assert all(contains(hyps[0].tokens, t) for t in terms)
        else:
            assert hyps[0].tokens == alone[i][0].tokens


def test_beam_selection_never_ends_unmet_and_keeps_the_most_advanced() -> None:
    c = Constraints([[[7]]])
    eos = 2
    start = c.start()
    options = [[(eos, -0.1), (3, -1.0), (4, -1.2), (7, -5.0)], [(3, -0.5), (4, -0.6), (7, -6.0)]]
    picks, ended = select_beams(c, 2, [0.0, -0.2], [start, start], options, eos, budget=10)
    assert ended == []  # the end-of-sentence is not taken with the constraint unmet
    assert {(x.beam, x.token) for x in picks} == {(1, 3), (0, 7)}  # the best, and the best that wrote the term
    met = c.advance(start, 7)
    picks, ended = select_beams(c, 2, [0.0, -0.2], [met, start], options, eos, budget=0)
    assert ended == [(0, -0.1)]
    assert all(c.satisfied(x.progress) for x in picks)  # no budget left: only beams that owe nothing go on
