"""Kernels compiled ahead (model/native.py, model/native_build.py): the same numbers as numba's JIT, without numba.

The build is real: numba's pycc and the C compiler, on the tiny model, into a temporary folder. Translations then
run in fresh processes, once through the extension and once through the JIT, and must give the same tokens.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from model import native

ROOT = Path(__file__).resolve().parents[1]

# Translates with the model in argv[1] in float32 and int8 (its own input ranges, if any, else a scale per row),
# greedy and beam 3, one sentence at a time and all together, on 2 threads; prints the tokens and what ran them.
TRANSLATE = r"""
import dataclasses, json, sys
import numpy as np, torch
torch.set_num_threads(2)
from model import checkpoint, native
from model.search import generate
numba_at_load = None
rng = np.random.default_rng(1)
out = {}
for dtype in ("float32", "int8"):
    m = checkpoint.load(sys.argv[1], device="cpu", dtype=dtype)
    numba_at_load = "numba" in sys.modules if numba_at_load is None else numba_at_load
    V = m.model.cfg.src_vocab_size
    sources = [[int(t) for t in rng.integers(4, V, n)] for n in (2, 5, 11, 7, 23, 4, 16)]
    for beam in (1, 3):
        cfg = dataclasses.replace(m.generation, beam_size=beam)
        alone = [generate(m.net, [s], cfg, max_rows=beam)[0][0].tokens for s in sources]
        together = [h[0].tokens for h in generate(m.net, sources, cfg, max_rows=len(sources) * beam)]
        out[f"{dtype} beam {beam}"] = [alone, together]
print(json.dumps({"tokens": out, "numba": "numba" in sys.modules, "numba_at_load": numba_at_load,
                  "ahead": native.active()}))
"""


def _translate(model_dir: Path, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", TRANSLATE, str(model_dir)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.slow  # a real build with the C compiler, then two fresh processes
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_kernels_compiled_ahead_translate_as_the_jit_without_numba(tiny_model_dir: Path, tmp_path: Path) -> None:
    env = {**os.environ, "TOLK_KERNELS_DIR": str(tmp_path / "kernels"), "PYTHONPATH": str(ROOT)}
    built = subprocess.run([sys.executable, "-m", "server.cli", "build-kernels", "--model", str(tiny_model_dir)],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    folders = list((tmp_path / "kernels").iterdir())
    assert len(folders) == 1 and (folders[0] / native.RECORD).exists(), folders
    record = json.loads((folders[0] / native.RECORD).read_text())
    assert {"model.kernels.step", "model.kernels.encode"} <= set(record["exports"]), sorted(record["exports"])

    ahead = _translate(tiny_model_dir, {**env, "TOLK_KERNELS": ""})
    jit = _translate(tiny_model_dir, {**env, "TOLK_KERNELS": "jit"})
    assert ahead["ahead"] and not jit["ahead"]
    assert ahead["numba"] is False, "a process with the extension imported numba"
    assert jit["numba_at_load"] is True
    assert ahead["tokens"] == jit["tokens"]
    for alone, together in ahead["tokens"].values():  # type: ignore[attr-defined]
        assert alone == together


def test_a_call_the_extension_lacks_goes_to_the_jit(caplog: pytest.LogCaptureFixture) -> None:
    from model import kernels

    calls: list[tuple[object, ...]] = []
    entry_types = native.key((np.zeros((2, 3), np.float32), 1))
    k = native.Kernel("model.kernels", "_amax", {entry_types: lambda *a: calls.append(a) or 5.0})
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert k(x, 1) == 5.0 and len(calls) == 1  # the entry for these types
    y = np.arange(12, dtype=np.float32).reshape(3, 4)[:, 1]  # not contiguous: no entry
    with caplog.at_level("WARNING", logger="model.native"):
        assert k(y) == kernels._amax(y)  # noqa: SLF001 - the JIT's own function gives the number
    assert "no kernel compiled ahead" in caplog.text and len(calls) == 1


def test_keys_are_what_numba_types_tell_apart() -> None:
    """`native.key` of a value is among the keys the build records for numba's type of it, and values that numba
    types differently get different keys (else an entry could be called with arguments it does not read right)."""
    numba = pytest.importorskip("numba")
    from model.native_build import type_keys

    a = np.zeros((4, 6), np.float32)
    read_only = a.copy()
    read_only.flags.writeable = False
    values = [a, a[:, ::2], a[:1], read_only, np.zeros(3, np.int64), np.zeros(3, np.int32), np.zeros(3, np.bool_),
              np.zeros((2, 2, 2), np.int8), 3, 2.5, True, np.float32(1), np.int64(2), (a, 3, np.float32(1))]
    seen: dict[object, object] = {}
    for v in values:
        t = numba.typeof(v)
        keys = type_keys(t)
        assert keys is not None and native.key(v) in keys, (t, native.key(v), keys)
        assert seen.setdefault(native.key(v), t) == t, (v, t)
    assert type_keys(numba.typeof(np.asfortranarray(np.zeros((3, 2), np.float32)))) is None  # "F": never built
