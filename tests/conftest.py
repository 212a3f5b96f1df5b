"""Shared fixtures: one tiny trained model directory per test session, a scheduler to look inside, a Redis
server; figures that tests report. Helpers that are not fixtures live in tests/helpers.py."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("GOMP_SPINCOUNT", "10000")  # as the server sets it (model/runtime.py), before torch loads libgomp
import torch  # noqa: E402

# The suite runs the kernels through numba's JIT, whatever extension this machine has built
# (model/native.py; tests/test_native.py builds its own)
os.environ.setdefault("TOLK_KERNELS", "jit")

from fastapi.testclient import TestClient  # noqa: E402

from model import checkpoint  # noqa: E402
from server.app import create_app  # noqa: E402
from server.scheduler import Scheduler  # noqa: E402
from tests.helpers import free_port, server_settings, thread_scheduler  # noqa: E402
from tests.tiny import make_model_dir  # noqa: E402

torch.set_num_threads(1)  # tiny models gain nothing from threads, and lose much when a core is busy

FIGURES = pytest.StashKey[dict[str, object]]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[FIGURES] = {}


@pytest.fixture(scope="session")
def figures(pytestconfig: pytest.Config) -> dict[str, object]:
    """Numbers a test wants on record (cases a fuzz test tried, a soak test's rates): name -> JSON-able value.

    They are printed at the end of the run, and written as JSON to the file $TOLK_TEST_FIGURES names, if any.
    """
    return pytestconfig.stash[FIGURES]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    figures = config.stash.get(FIGURES, {})
    if figures:
        terminalreporter.section("figures")
        for name, value in sorted(figures.items()):
            if isinstance(value, dict) and all(isinstance(v, dict) for v in value.values()):  # a table: a line a row
                for row, cells in value.items():
                    terminalreporter.write_line(f"{name} {row}: {json.dumps(cells, default=str)}")
            else:
                terminalreporter.write_line(f"{name}: {json.dumps(value, default=str)}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("TOLK_TEST_FIGURES")
    if path:
        figures = session.config.stash.get(FIGURES, {})
        Path(path).write_text(json.dumps(figures, indent=2, sort_keys=True, default=str) + "\n")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete model directory (en -> pt, copy task) built once per session."""
    return make_model_dir(tmp_path_factory.mktemp("models") / "tiny-en-pt")


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_dir: Path) -> checkpoint.LoadedModel:
    return checkpoint.load(tiny_model_dir, device="cpu")


@pytest.fixture(scope="session")
def served(tiny_model_dir: Path) -> Iterator[TestClient]:
    """The default test app with its batcher in a child process, as users run it, started once for the session and
    shared by the tests that only read: they translate, ask and get refused, and change no setting, key or file."""
    with TestClient(create_app(server_settings(tiny_model_dir, scheduler_process=True))) as client:
        yield client


@pytest.fixture
def scheduler(tiny_loaded: checkpoint.LoadedModel, tiny_model_dir: Path) -> Iterator[Scheduler]:
    """A started scheduler of 8 rows whose batcher is a thread of this process (tests/test_faults.py and
    tests/test_encode_ahead.py look inside it); one request may take every row, as the faults need a full batch."""
    settings = server_settings(tiny_model_dir, max_batch_rows=8, max_request_rows=8, scheduler_process=False)
    s = thread_scheduler(tiny_loaded, settings)
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A redis-server of this module's own on a free port (the modules that use it skip without one)."""
    import redis  # only the Redis tests need the client

    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", str(tmp_path_factory.mktemp("redis"))],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                server.kill()
                raise
            time.sleep(0.05)
    yield url
    server.terminate()
    server.wait(10)
