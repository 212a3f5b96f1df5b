"""`bench/train_step.py` and `bench/train_memory.py` build `tolk train`'s own Trainer: when its signature changed,
both broke at start without a test noticing. Here each runs a step or two of a tiny model and writes its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import write_corpus

pytestmark = pytest.mark.slow  # training steps through the bench scripts

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("compare, modes", [("step", ["plain", "step"]), ("autocast", ["float32", "bfloat16"])])
def test_the_training_step_benchmark_runs_on_a_model_directory(tiny_model_dir: Path, tmp_path: Path, compare: str,
                                                               modes: list[str]) -> None:
    corpus, out = write_corpus(tmp_path / "corpus"), tmp_path / "result.json"
    subprocess.run([sys.executable, str(ROOT / "bench/train_step.py"), "--compare", compare, "--corpus", str(corpus),
                    "--model", str(tiny_model_dir), "--rounds", "1", "-n", "2", "--max-tokens", "256",
                    "--out", str(out)], check=True, timeout=240, capture_output=True)
    result = json.loads(out.read_text())
    assert [row["mode"] for row in result["rows"]] == modes
    assert result["micro_batches"] == 2 and result["tokens_per_micro_batch"] > 0
    assert all(row["seconds_per_micro_batch"] > 0 and len(row["rounds"]) == 1 for row in result["rows"])
    first, second = (row["rounds"][0] for row in result["rows"])
    assert result["speedup_median"] == pytest.approx(first / second)


def test_the_training_memory_benchmark_runs_on_a_model_directory(tiny_model_dir: Path, tmp_path: Path) -> None:
    corpus, out = write_corpus(tmp_path / "corpus"), tmp_path / "result.json"
    subprocess.run([sys.executable, str(ROOT / "bench/train_memory.py"), "--corpus", str(corpus),
                    "--model", str(tiny_model_dir), "-n", "2", "--out", str(out)],
                   check=True, timeout=240, capture_output=True)
    result = json.loads(out.read_text())
    assert result["steps"] == 2
    # the resident set before the first step and after each, per mode
    assert sorted(result["rss_mb_after_step"]) == ["no-trim", "trim"]
    assert all(len(rss) == 3 and min(rss) > 0 for rss in result["rss_mb_after_step"].values())
