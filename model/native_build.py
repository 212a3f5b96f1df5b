"""Build the CPU kernels ahead of time for the models a server will serve (model/native.py; `tolk build-kernels`).

1. With numba's JIT (`TOLK_KERNELS=jit`), each model is loaded in each precision and translates token sequences of
   a few lengths, greedy and with beams, one and many at a time, on the threads given (`warm`). Every compiled
   function of the kernel modules then lists the argument types it was called with (`record`).
2. numba's `pycc` compiles one extension from them: an entry per function and types, which calls the JIT's function
   (so each kernel keeps its own options: fastmath, no GIL) and, as `nogil=True` does, lets go of the GIL while it
   runs. It needs a C compiler.
3. The extension and its record (`native.RECORD`: each entry's types as `native.key` computes them, and the kernel
   module's values that depend on numba's view of the CPU) go into `native.folder()`, replacing an earlier build.

    tolk build-kernels --model weights/en-pt --model weights/pt-en [--dtype float32 --dtype int8] [--threads 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from model import native

LENGTHS = (3, 9, 17, 30, 60, 120)  # source lengths (tokens) of the warm-up's sentences
BATCHES = (1, 3, 12, 48)  # sentences decoded together
CONFIGS = ((1, True, 0), (1, False, 0), (1, True, 4), (4, True, 0), (4, True, 4))  # beams, scores, least new tokens
MAX_VARIANTS = 64  # at most this many keys per entry when an argument's type accepts more than one (`keys`)


def warm(models: Sequence[str], dtypes: Sequence[str], threads: int) -> None:
    """Translate with each model in each precision so that every kernel the server would call is compiled."""
    import dataclasses

    import torch

    from model import checkpoint
    from model.search import generate

    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    for directory in models:
        for dtype in dtypes:
            loaded = checkpoint.load(directory, device="cpu", dtype=dtype)
            loaded.net.warm_parts()
            V = loaded.model.cfg.src_vocab_size
            sources = [[int(t) for t in rng.integers(4, V, n)] for n in LENGTHS]
            for (beam, scores, least), rows in itertools.product(CONFIGS, BATCHES):
                config = dataclasses.replace(loaded.generation, beam_size=beam, scores=scores, min_new_tokens=least,
                                             max_new_tokens=24)
                batch = [sources[i % len(sources)] for i in range(rows)]
                generate(loaded.net, batch, config, max_rows=max(rows * beam, 1))
            del loaded


def type_keys(t: Any) -> list[Any] | None:
    """Every `native.key` that a value of numba type t may have and still be passed as t (a C-contiguous or a
    writeable array is accepted where any layout or a read-only one is); None: a type `native.key` cannot tell."""
    from numba import types
    from numba.np.numpy_support import as_dtype

    if isinstance(t, types.Array):
        if t.layout == "F":
            return None
        num = as_dtype(t.dtype).num
        layouts = (1,) if t.layout == "C" else (0, 1)
        writeable = (0x400,) if t.mutable else (0, 0x400)
        return [(num, t.ndim, c | w) for c in layouts for w in writeable]
    if isinstance(t, types.BaseTuple):
        members = [type_keys(m) for m in cast(Any, t)]
        if any(m is None or len(m) != 1 for m in members):
            return None
        return [tuple(m[0] for m in members)]  # type: ignore[index]
    scalar = {types.int64: "i8", types.float64: "f8", types.float32: "f4", types.boolean: "?", types.int32: "i4"}
    return [scalar[t]] if t in scalar else None


def keys(args: Sequence[Any]) -> list[Any] | None:
    """Every key of a signature's arguments (`type_keys`), at most `MAX_VARIANTS`; None if one cannot be told."""
    options = [type_keys(t) for t in args]
    if any(o is None for o in options):
        return None
    combos = list(itertools.islice(itertools.product(*options), MAX_VARIANTS))  # type: ignore[arg-type]
    return [tuple(c) for c in combos]


def record() -> list[tuple[str, str, Any, list[Any]]]:
    """(module, function, signature, keys) of every compiled function of the kernel modules."""
    import importlib

    from numba.core.registry import CPUDispatcher

    found = []
    for module_name in native.MODULES:
        module = importlib.import_module(module_name)
        for name, obj in sorted(vars(module).items()):
            if isinstance(obj, CPUDispatcher) and obj.__module__ == module_name:
                for signature in obj.nopython_signatures:
                    k = keys(signature.args)
                    if k is not None:
                        found.append((module_name, name, signature, k))
    return found


def compile_extension(entries: Sequence[tuple[str, str, Any, list[Any]]], out: Path) -> str:
    """pycc's extension of one entry per recorded (function, signature) into out; returns its file name."""
    import importlib

    import numba.pycc.compiler as pycc_compiler
    from numba.core.compiler import Flags

    class Releasing(Flags):  # the entries' Python wrappers let go of the GIL (nogil=True)
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
            self.release_gil: Any = True

    pycc_compiler.Flags = Releasing  # type: ignore[attr-defined]
    cc: Any = importlib.import_module("numba.pycc").CC(native.EXTENSION)
    cc.output_dir = str(out)
    cc.target_cpu = "host"
    cc.verbose = False
    for i, (module_name, name, signature, _) in enumerate(entries):
        params = ", ".join(f"a{j}" for j in range(len(signature.args)))
        scope = {"M": importlib.import_module(module_name)}
        exec(f"def e{i}({params}):\n    return M.{name}({params})\n", scope)  # noqa: S102 - generated wrapper
        cc.export(f"e{i}", signature)(scope[f"e{i}"])
    cc.compile()
    return Path(cc.output_file).name


def build(models: Sequence[str], dtypes: Sequence[str], threads: int) -> Path:
    from model import beam_host, kernels

    assert not kernels._AHEAD and not beam_host._AHEAD  # noqa: SLF001 - compiled by the JIT in this process
    start = time.perf_counter()
    warm(models, dtypes, threads)
    warmed = time.perf_counter()
    entries = record()
    ident = native.identity()
    target = native.folder(ident)
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    work.chmod(0o755)
    try:
        file = compile_extension(entries, work)
        exports: dict[str, list[Any]] = {}
        for i, (module_name, name, _, k) in enumerate(entries):
            exports.setdefault(f"{module_name}.{name}", []).extend([f"e{i}", key] for key in k)
        (work / native.RECORD).write_text(json.dumps({
            "file": file, "identity": ident, "models": list(models), "dtypes": list(dtypes), "threads": threads,
            "values": {"INT8_DOT": kernels.INT8_DOT, "INT8_VNNI": kernels.INT8_VNNI}, "exports": exports}))
        if target.exists():
            shutil.rmtree(target)
        os.replace(work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{len(entries)} kernels compiled ahead into {target} (warm-up {warmed - start:.1f} s, "
          f"compile {time.perf_counter() - warmed:.1f} s)")
    return target


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", action="append", required=True, help="a model directory to warm (repeatable)")
    parser.add_argument("--dtype", action="append", choices=["float32", "int8"],
                        help="precisions to warm (repeatable; default float32 and int8)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads while warming (default 2)")


def main(args: argparse.Namespace) -> int:
    """`tolk build-kernels`: the build runs in a child process, where numba's JIT compiles whatever was built
    before (`TOLK_KERNELS=jit`)."""
    if shutil.which(os.environ.get("CC", "cc")) is None and shutil.which("gcc") is None:
        print("tolk build-kernels: no C compiler found; the kernels stay on numba's JIT", file=sys.stderr)
        return 1
    argv = [a for m in args.model for a in ("--model", str(Path(m).resolve()))]
    argv += [a for d in args.dtype or [] for a in ("--dtype", d)] + ["--threads", str(args.threads)]
    return subprocess.call([sys.executable, "-m", "model.native_build", *argv],
                           env={**os.environ, "TOLK_KERNELS": "jit"}, cwd=Path(__file__).resolve().parents[1])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m model.native_build", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parsed = parser.parse_args()
    if os.environ.get("TOLK_KERNELS") != "jit":
        sys.exit("run with TOLK_KERNELS=jit (or through `tolk build-kernels`)")
    build(parsed.model, parsed.dtype or ["float32", "int8"], parsed.threads)
