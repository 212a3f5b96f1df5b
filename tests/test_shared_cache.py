"""The translation cache in Redis (TOLK_CACHE_URL): two replicas share it, a replica answers another's sentence
exactly as a decode would (whole and streamed), a better entry is never replaced by a lesser one, and Redis away
costs decoding, never a request. Uses a real redis-server, started here (.ci/run installs Debian's)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from model.events import FinishEvent, Hypothesis
from model.generation import GenerationConfig
from server.cache import cache_key
from server.shared_cache import RedisCache, decode, encode, model_fingerprint
from tests.helpers import HIT, app_client, free_port, metric, stream_with, translate_with

pytestmark = [pytest.mark.slow,  # a real redis-server
              pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (Debian's "
                                 "redis-server package; .ci/run installs it)")]

ERROR = 'tolk_translation_cache_total{model="tiny-en-pt",result="error"}'


@pytest.fixture
def replicas(tiny_model_dir: Path, redis_url: str) -> Iterator[tuple[TestClient, TestClient]]:
    redis.Redis.from_url(redis_url).flushdb()
    with app_client(tiny_model_dir, cache_url=redis_url) as a, app_client(tiny_model_dir, cache_url=redis_url) as b:
        yield a, b


@pytest.fixture(scope="module")
def uncached(tiny_model_dir: Path) -> Iterator[TestClient]:
    with app_client(tiny_model_dir) as c:
        yield c


def test_a_replica_answers_what_another_decoded(replicas: tuple[TestClient, TestClient],
                                                uncached: TestClient) -> None:
    a, b = replicas
    texts, options = ["Open the settings window.", "The disk is full."], {"max_new_tokens": 12, "return_scores": True}
    decoded = translate_with(a, texts, **options)
    hits = metric(b, HIT)
    assert translate_with(b, texts, **options) == decoded == translate_with(uncached, texts, **options)
    assert metric(b, HIT) == hits + 2


@pytest.mark.parametrize("options", [{"max_new_tokens": 9}, {"beam_size": 2, "max_new_tokens": 9}])
def test_a_streamed_repeat_from_another_replica_sends_the_events_of_a_decode(
        replicas: tuple[TestClient, TestClient], uncached: TestClient, options: dict[str, Any]) -> None:
    a, b = replicas
    text = "Save the file before closing."
    translate_with(a, text, **options)  # kept without token log-probs: not enough to stream greedy tokens
    decoded = stream_with(a, text, **options)
    hits = metric(b, HIT)
    assert stream_with(b, text, **options) == decoded == stream_with(uncached, text, **options)
    assert metric(b, HIT) == hits + 1


def entry_event(tokens: list[int], score: float) -> FinishEvent:
    return FinishEvent(0, 0, [Hypothesis(tokens, score, "eos")], "eos")


def test_an_entry_is_never_replaced_by_one_that_answers_less(tiny_model_dir: Path, redis_url: str) -> None:
    cache = RedisCache(redis_url, "m", model_fingerprint(tiny_model_dir), ttl=60)
    key = cache_key([5, 6, 2], GenerationConfig())
    assert key is not None
    cache.put(key, entry_event([7, 8], -1.5), [-1.0, -0.5])  # rank 2: streams
    cache.put(key, entry_event([7, 8], float("nan")), None)  # rank 0: would answer less
    [entry] = cache.lookup([key], stream=True, scores=[True]).values()
    assert entry.logprobs == (-1.0, -0.5) and entry.rank == 2
    other = RedisCache(redis_url, "m", "another-model", ttl=60)  # other weights: other entries
    assert other.lookup([key], stream=False, scores=[False]) == {}
    assert decode(encode(entry).encode()) == entry


def test_redis_away_costs_decoding_not_requests(tiny_model_dir: Path) -> None:
    with app_client(tiny_model_dir, cache_url=f"redis://127.0.0.1:{free_port()}/0") as client:
        errors = metric(client, ERROR)
        first = translate_with(client, "Open the file.", max_new_tokens=8)
        assert translate_with(client, "Open the file.", max_new_tokens=8) == first
        assert metric(client, ERROR) == errors + 2  # both lookups failed, and said so
