"""Shared fixtures: one tiny trained model directory per test session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model import checkpoint
from tests.tiny import make_model_dir

torch.set_num_threads(1)  # tiny models gain nothing from threads, and lose much when a core is busy


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete model directory (en -> pt, copy task) built once per session."""
    return make_model_dir(tmp_path_factory.mktemp("models") / "tiny-en-pt")


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_dir: Path) -> checkpoint.LoadedModel:
    return checkpoint.load(tiny_model_dir, device="cpu")
