"""The translation cache: a repeated sentence is answered without decoding, exactly as a decoded one (whole and
streamed, greedy and beam), mixed requests keep their order, sampling always decodes, and 0 turns it off."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from model.checkpoint import LoadedModel
from model.events import FinishEvent, Hypothesis, TokenEvent
from model.generation import GenerationConfig
from server.cache import TranslationCache, cache_key
from server.scheduler import Scheduler
from tests.helpers import HIT, app_client, batch_of, metric, scheduler_of, stream_with, translate_with

MISS = 'tolk_translation_cache_total{model="tiny-en-pt",result="miss"}'


@pytest.fixture(scope="module")
def cached(tiny_model_dir: Path) -> Iterator[TestClient]:
    with app_client(tiny_model_dir, translation_cache_entries=100) as c:
        yield c


@pytest.fixture(scope="module")
def uncached(tiny_model_dir: Path) -> Iterator[TestClient]:
    with app_client(tiny_model_dir) as c:  # the tests' settings: no cache
        yield c


def decode_steps(client: TestClient) -> int:
    """Decode steps the batcher has run so far (`count_steps`)."""
    batch = batch_of(scheduler_of(client))
    assert batch is not None
    return int(getattr(batch, "steps", 0))


@pytest.fixture(autouse=True)
def count_steps(cached: TestClient) -> Iterator[None]:
    batch = batch_of(scheduler_of(cached))
    assert batch is not None
    forward, greedy_steps = batch.forward, batch.greedy_steps

    def counted(choose: bool = False) -> Any:
        batch.steps = getattr(batch, "steps", 0) + 1  # type: ignore[attr-defined]
        return forward(choose)

    def counted_at_once(most: int) -> Any:  # steps run at once (`model.search.steps`) call no forward
        out = greedy_steps(most)
        if out is not None:
            batch.steps = getattr(batch, "steps", 0) + len(out)  # type: ignore[attr-defined]
        return out

    batch.forward = counted  # type: ignore[method-assign]
    batch.greedy_steps = counted_at_once  # type: ignore[method-assign]
    yield
    batch.forward, batch.greedy_steps = forward, greedy_steps  # type: ignore[method-assign]


def test_a_repeat_is_answered_without_decoding_and_equals_the_decode(cached: TestClient,
                                                                     uncached: TestClient) -> None:
    text, options = "Open the settings window.", {"max_new_tokens": 12, "return_scores": True}
    first = translate_with(cached, text, **options)
    steps, hits = decode_steps(cached), metric(cached, HIT)
    again = translate_with(cached, text, **options)
    assert again == first == translate_with(uncached, text, **options)  # text, scores and token counts alike
    assert decode_steps(cached) == steps  # nothing was decoded
    assert metric(cached, HIT) == hits + 1


@pytest.mark.parametrize("options", [{"max_new_tokens": 9}, {"beam_size": 3, "max_new_tokens": 9}])
def test_a_streamed_repeat_sends_the_events_of_a_decode(cached: TestClient, uncached: TestClient,
                                                        options: dict[str, Any]) -> None:
    text = f"Save the file before closing {options.get('beam_size', 1)}."
    whole = translate_with(cached, text, **options)  # decoded without streaming first: no token log-probs kept
    decoded = stream_with(cached, text, **options)  # so this one decodes (greedy) and keeps them
    steps = decode_steps(cached)
    replayed = stream_with(cached, text, **options)
    assert replayed == decoded == stream_with(uncached, text, **options)  # tokens, ids, log-probs, done events
    assert decode_steps(cached) == steps
    assert replayed[-1][1]["translatedText"] == whole["translatedText"]
    tokens = [d["token"] for e, d in replayed if e == "token"]
    assert "".join(t["text"] for t in tokens) == whole["translatedText"]
    if "beam_size" not in options:  # greedy: every token with its id and log-probability, as decoded
        assert tokens and all(isinstance(t["logprob"], float) and isinstance(t["id"], int) for t in tokens)


def test_a_request_mixing_repeats_and_new_sentences_keeps_its_order(cached: TestClient,
                                                                    uncached: TestClient) -> None:
    translate_with(cached, ["Close the window.", "Print the page."])
    mixed = ["Print the page.", "Undo the last change.", "Close the window.", "Print the page. Close the window."]
    assert translate_with(cached, mixed) == translate_with(uncached, mixed)
    streamed = stream_with(cached, "Close the window. Delete the old copy. Print the page.")
    assert streamed == stream_with(uncached, "Close the window. Delete the old copy. Print the page.")


def test_sampling_always_decodes(cached: TestClient) -> None:
    options = {"do_sample": True, "seed": 5, "max_new_tokens": 6}
    hits, misses = metric(cached, HIT), metric(cached, MISS)
    first = translate_with(cached, "Open the file now.", **options)
    steps = decode_steps(cached)
    assert translate_with(cached, "Open the file now.", **options) == first  # the seed makes it the same ...
    assert decode_steps(cached) > steps  # ... but it was decoded again
    assert (metric(cached, HIT), metric(cached, MISS)) == (hits, misses)  # and never looked up


def test_other_settings_are_other_entries(cached: TestClient) -> None:
    translate_with(cached, "Rename the folder.", max_new_tokens=10)
    steps = decode_steps(cached)
    translate_with(cached, "Rename the folder.", max_new_tokens=3)
    assert decode_steps(cached) > steps


def test_the_cache_is_bounded_and_can_be_off() -> None:
    config = GenerationConfig()
    finish = FinishEvent(0, 0, [Hypothesis([5, 6], -1.0, "eos")], "eos")
    lru = TranslationCache(1)  # 64 tokens; each entry holds 7: source 2, translation 2, log-probs 2, and 1
    for i in range(10):
        lru.put(cache_key([i, 2], config), finish, [-0.5, -0.5])
    assert len(lru) == 9 and lru.get(cache_key([0, 2], config), stream=False) is None  # the oldest went
    assert lru.get(cache_key([1, 2], config), stream=False) is not None
    long = FinishEvent(0, 0, [Hypothesis(list(range(100)), -1.0, "eos")], "eos")
    lru.put(cache_key([3, 3], config), long, None)  # bigger than the whole cache: not kept, nothing evicted
    assert lru.get(cache_key([3, 3], config), stream=False) is None and len(lru) == 9
    hit = lru.get(cache_key([9, 2], config), stream=True)
    assert hit is not None and hit.events(7, 1, stream=True) == [TokenEvent(7, 1, 5, -0.5), TokenEvent(7, 1, 6, -0.5),
                                                                  FinishEvent(7, 1, finish.hypotheses, "eos")]
    lru.put(cache_key([9, 2], config), finish, None)  # a decode without streaming never drops the log-probs
    assert lru.get(cache_key([9, 2], config), stream=True) is not None
    off = TranslationCache(0)
    off.put(cache_key([1, 2], config), finish, None)
    assert off.get(cache_key([1, 2], config), stream=False) is None
    assert cache_key([1, 2], GenerationConfig(do_sample=True)) is None


def test_scheduler_of_the_uncached_server_keeps_nothing(uncached: TestClient) -> None:
    translate_with(uncached, "Open the file.")
    scheduler: Scheduler = scheduler_of(uncached)
    assert len(scheduler.cache) == 0 and not scheduler.cache.enabled


def test_a_sentence_repeated_within_a_request_is_decoded_once(cached: TestClient, uncached: TestClient,
                                                              tiny_loaded: LoadedModel) -> None:
    admitted = 'tolk_input_tokens_total{model="tiny-en-pt"}'
    texts = ["Replace all matches.", "Replace all matches.", "Find the next word.", "Replace all matches."]
    before = metric(cached, admitted)
    assert translate_with(cached, texts) == translate_with(uncached, texts)
    once = sum(len(tiny_loaded.tokenizer.encode(t)) for t in set(texts))
    assert metric(cached, admitted) - before == once  # two sentences admitted, not four
    text = "Go back. Go back. Stop here. Go back."
    assert stream_with(cached, text) == stream_with(uncached, text)


def test_requests_with_and_without_scores_share_entries(cached: TestClient, uncached: TestClient) -> None:
    text = "Empty the trash now."
    stream_with(cached, text)  # decoded with every token's log-probability: answers anything
    steps = decode_steps(cached)
    assert translate_with(cached, text) == translate_with(uncached, text)
    assert translate_with(cached, text, return_scores=True) == translate_with(uncached, text, return_scores=True)
    assert decode_steps(cached) == steps
    other = "Rename the old file."
    translate_with(cached, other)  # decoded without scores (nobody reads them)
    steps = decode_steps(cached)
    assert translate_with(cached, other, return_scores=True) == translate_with(uncached, other, return_scores=True)
    assert decode_steps(cached) > steps  # the entry had no scores: decoded again, and kept with them
    steps = decode_steps(cached)
    translate_with(cached, other)
    translate_with(cached, other, return_scores=True)
    assert decode_steps(cached) == steps
