"""Many models on one machine (TOLK_MAX_LOADED_MODELS): a model loads on its first request, at most N run at once,
the least recently used idle one makes room, an idle one unloads after TOLK_UNLOAD_AFTER, and nothing is lost."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from model.checkpoint import load
from model.search import generate
from server.app import create_app
from tests.helpers import metric, relabelled, server_settings

PAIRS = [("en", "pt"), ("pt", "en"), ("en", "es")]


@pytest.fixture(scope="module")
def model_dirs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    directory = tmp_path_factory.mktemp("on-demand")
    return [relabelled(tiny_model_dir, directory, source, target) for source, target in PAIRS]


@pytest.fixture
def client(model_dirs: list[Path], request: pytest.FixtureRequest) -> Iterator[TestClient]:
    changes: dict[str, Any] = {"max_loaded_models": 2, "scheduler_process": False, **getattr(request, "param", {})}
    settings = server_settings(model_dirs[0], **changes).model_copy(update={"models": model_dirs})
    with TestClient(create_app(settings)) as c:
        yield c


def loaded(client: TestClient) -> set[str]:
    return {m["name"] for m in client.get("/models").json() if m["loaded"]}


def loads(client: TestClient, name: str) -> float:
    return metric(client, f'tolk_model_load_seconds_count{{model="{name}"}}')


def translate(client: TestClient, source: str, target: str, text: str = "Open the file.") -> str:
    r = client.post("/translate", json={"q": text, "source": source, "target": target})
    assert r.status_code == 200, r.text
    return str(r.json()["translatedText"])


def test_models_load_on_first_use_within_the_budget(client: TestClient, tiny_model_dir: Path) -> None:
    assert client.get("/ready").status_code == 200 and loaded(client) == set()
    engine = load(tiny_model_dir, device="cpu")
    (hyps,) = generate(engine.net, [engine.tokenizer.encode("Open the file.")], engine.generation)
    assert translate(client, "en", "pt") == engine.tokenizer.decode(hyps[0].tokens)
    assert loaded(client) == {"tiny-en-pt"} and loads(client, "tiny-en-pt") == 1
    translate(client, "pt", "en")
    translate(client, "en", "pt")  # en-pt is now the most recently used, pt-en the least
    assert loaded(client) == {"tiny-en-pt", "tiny-pt-en"}
    translate(client, "en", "es")  # a third: the least recently used idle one makes room
    assert loaded(client) == {"tiny-en-pt", "tiny-en-es"}
    assert metric(client, 'tolk_model_unloads_total{model="tiny-pt-en"}') == 1
    translate(client, "pt", "en")  # and loads again when asked for
    assert loaded(client) == {"tiny-pt-en", "tiny-en-es"} and loads(client, "tiny-pt-en") == 2


def test_a_request_that_waited_for_a_load_says_so_in_its_timing(client: TestClient) -> None:
    """Server-Timing names the load a request waited for, plain or streamed; a request to a loaded model has none."""
    body = {"q": "Open the file.", "source": "en", "target": "pt"}
    first = client.post("/translate", json=body)
    timing = first.headers.get("server-timing", "")
    assert first.status_code == 200 and timing.startswith("load;dur=") and 'desc="model loaded on demand"' in timing
    assert float(timing.split("dur=")[1].split(";")[0]) > 0
    assert "server-timing" not in client.post("/translate", json=body).headers
    streamed = client.post("/translate/stream", json={**body, "source": "pt", "target": "en"})
    assert streamed.status_code == 200 and streamed.headers["server-timing"].startswith("load;dur=")
    assert "server-timing" not in client.post("/translate/stream", json=body).headers


def test_concurrent_requests_share_one_load_and_all_are_answered(client: TestClient) -> None:
    texts = [f"Save the file number {i}." for i in range(12)]
    with ThreadPoolExecutor(len(texts)) as pool:
        answers = list(pool.map(lambda t: translate(client, "en", "es", t), texts))
    assert len(answers) == len(texts) and all(answers)
    assert loads(client, "tiny-en-es") == 1 and loaded(client) == {"tiny-en-es"}


@pytest.mark.parametrize("client", [{"unload_after": 0.2, "watchdog_interval": 0.1}], indirect=True)
def test_an_idle_model_unloads_after_its_time(client: TestClient) -> None:
    translate(client, "en", "pt")
    assert loaded(client) == {"tiny-en-pt"}
    deadline = time.monotonic() + 10
    while loaded(client) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert loaded(client) == set()
    assert translate(client, "en", "pt")  # and comes back on the next request


@pytest.mark.parametrize("client", [{"max_loaded_models": 1, "scheduler_process": True}], indirect=True)
def test_unloading_ends_the_models_process(client: TestClient) -> None:
    """As users run it, each model's batcher in a process of its own: unloading stops that process."""
    first = translate(client, "en", "pt")
    registry = client.app.state.registry  # type: ignore[attr-defined]
    process = registry.by_name("tiny-en-pt").scheduler.transport.process
    assert process is not None and process.is_alive()
    translate(client, "pt", "en")
    assert loaded(client) == {"tiny-pt-en"} and not process.is_alive()
    assert translate(client, "en", "pt") == first and loaded(client) == {"tiny-en-pt"}
