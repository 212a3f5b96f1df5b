"""Process-wide settings are the server's to make at its start (model/runtime.py), not a side effect of importing."""

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


def test_importing_and_loading_change_no_process_setting() -> None:
    plain = imported("import os, model, torch, model.checkpoint, model.runtime as r; "
                     "print(os.environ.get('GOMP_SPINCOUNT'), r._heap_managed)")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.split() == ["None", "False"] and "RuntimeWarning" not in plain.stderr


def test_configure_sets_the_spin_count_and_warns_when_torch_came_first() -> None:
    first = imported("from model import runtime; runtime.configure(); import torch, os; "
                     "print(os.environ['GOMP_SPINCOUNT'], runtime._heap_managed)")
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["10000", "True"] and "RuntimeWarning" not in first.stderr
    late = imported("import torch; from model import runtime; runtime.configure()")
    assert late.returncode == 0 and "RuntimeWarning" in late.stderr and "GOMP_SPINCOUNT" in late.stderr
    chosen = imported("from model import runtime; runtime.configure(); import os; print(os.environ['GOMP_SPINCOUNT'])",
                      GOMP_SPINCOUNT="500")
    assert chosen.stdout.strip() == "500" and "RuntimeWarning" not in chosen.stderr


def test_the_server_makes_its_settings_before_torch_loads() -> None:
    """`tolk` runs `runtime.configure` before its parser imports the recipes (and torch)."""
    code = ("import sys, os; from server import cli; sys.argv = ['tolk', '--help']\n"
            "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, os.environ.get('GOMP_SPINCOUNT'))")
    run = imported(code)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[-2:] == ["True", "10000"] and "RuntimeWarning" not in run.stderr
