"""Shared fixtures: one tiny trained model directory per test session; figures that tests report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("GOMP_SPINCOUNT", "10000")  # as model/__init__.py sets it, before torch loads libgomp
import torch  # noqa: E402

# The suite runs the kernels through numba's JIT, whatever extension this machine has built
# (model/native.py; tests/test_native.py builds its own)
os.environ.setdefault("TOLK_KERNELS", "jit")

from model import checkpoint  # noqa: E402
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
