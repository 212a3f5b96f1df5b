"""model/__init__.py sets libgomp's spin count before torch loads it, and warns when torch was loaded first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**clean, **env})


def test_torch_loaded_before_model_warns_and_the_spin_count_is_set_otherwise() -> None:
    first = imported("import model, torch, os; print(os.environ['GOMP_SPINCOUNT'])")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "10000" and "RuntimeWarning" not in first.stderr
    late = imported("import torch, model")
    assert late.returncode == 0 and "RuntimeWarning" in late.stderr and "GOMP_SPINCOUNT" in late.stderr
    chosen = imported("import torch, model, os; print(os.environ['GOMP_SPINCOUNT'])", GOMP_SPINCOUNT="500")
    assert chosen.stdout.strip() == "500" and "RuntimeWarning" not in chosen.stderr
