"""The compiled CPU kernels without numba: an extension module built ahead of time for this machine, or numba's JIT.

model/kernels.py and model/beam_host.py are written for numba. Run through its JIT, every decoding process pays for
numba itself: about 69 MB to import it, 45 MB more at the first compiled call (LLVM's initialisation, numba's
typing), and about ten times each loaded kernel's machine code in bitcode kept for later links
(docs/benchmarks.md). `model.native_build` compiles the kernels that a warm-up of the served models called, for the
argument types it saw, into one extension (numba's `pycc`), next to a record of those types. A process that finds an
extension built from the same sources for the same machine and libraries (`identity`) calls it and never imports
numba:
- each kernel becomes a `Kernel`, which picks the compiled entry for its arguments' types (`key`);
- a call with types that no entry has goes to numba's JIT, which is then imported once (`jit_module`: a second copy
  of the kernel module, compiled as before), with a warning: the results are the same, only the memory is not saved.

`TOLK_KERNELS=jit` keeps the JIT; `TOLK_KERNELS_DIR` is where extensions are built and looked for
(default `~/.cache/tolk/kernels`). This module imports neither numba nor torch.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import platform
import sys
import threading
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

MODULES = ("model.kernels", "model.beam_host")  # the modules whose compiled functions an extension holds
EXTENSION = "tolk_kernels"
RECORD = "kernels.json"
_ROOT = Path(__file__).resolve().parent


def root() -> Path:
    """Where extensions are built and looked for: one folder per `identity`."""
    configured = os.environ.get("TOLK_KERNELS_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "tolk" / "kernels"


def _cpu() -> str:
    """The CPU as the compiler targets it: its model name and feature flags (Linux), else the platform's words."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = ("model name", "flags", "Features", "CPU part")
    seen = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in lines if ":" in line}
    return " | ".join(f"{k}: {seen[k]}" for k in wanted if k in seen) or platform.machine()


def identity() -> dict[str, str]:
    """What an extension must have been built from to be used here: the kernels' sources, numba's, numpy's and
    Python's versions, the CPU, and numba's CPU settings (`NUMBA_CPU_NAME`, `NUMBA_CPU_FEATURES`)."""
    sources = hashlib.sha256()
    for name in MODULES:
        sources.update((_ROOT / f"{name.split('.')[-1]}.py").read_bytes())

    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "none"

    return {"sources": sources.hexdigest(), "numba": version("numba"), "numpy": np.__version__,
            "python": f"{sys.implementation.cache_tag} {platform.machine()}",
            "cpu": hashlib.sha256(_cpu().encode()).hexdigest(),
            "numba_cpu": f"{os.environ.get('NUMBA_CPU_NAME', '')}|{os.environ.get('NUMBA_CPU_FEATURES', '')}"}


def folder(ident: dict[str, str] | None = None) -> Path:
    """The folder of the extension for this identity."""
    text = json.dumps(ident or identity(), sort_keys=True)
    return root() / hashlib.sha256(text.encode()).hexdigest()[:16]


# numba's type of a scalar argument, by its Python type (`key`)
_SCALARS: dict[type, str] = {int: "i8", np.int64: "i8", float: "f8", np.float64: "f8", np.float32: "f4",
                             bool: "?", np.bool_: "?", np.int32: "i4"}
# of an array's flags, what numba's type of it depends on: C-contiguous (layout "C", else "A") and writeable
FLAG_BITS = 0x401


def key(v: Any) -> Any:
    """What numba's type of an argument depends on, cheaply: an array's dtype number, dimensions and `FLAG_BITS` of
    its flags; a scalar's type code (`_SCALARS`); a tuple's keys. Anything else: its Python type (never matched)."""
    if type(v) is np.ndarray:
        return (v.dtype.num, v.ndim, v.flags.num & FLAG_BITS)
    if isinstance(v, tuple):  # (a NamedTuple too: numba types it by its members)
        return tuple(map(key, v))
    return _SCALARS.get(type(v), type(v))


def _frozen(v: Any) -> Any:
    """A key read back from JSON (lists) as `key` makes it (tuples)."""
    return tuple(_frozen(x) for x in v) if isinstance(v, list) else v


class Kernel:
    """A compiled function of a kernel module, called through the extension's entry for its arguments' types, or
    through numba's JIT for types the extension lacks (`jit_module`)."""

    __slots__ = ("module", "name", "entries", "missed")

    def __init__(self, module: str, name: str, entries: dict[Any, Callable[..., Any]]) -> None:
        self.module, self.name, self.entries = module, name, entries
        self.missed: set[Any] = set()

    def __call__(self, *args: Any) -> Any:
        # `key` with its array case inlined: this runs at every call of a step's kernels (about 9 us for 56 arguments)
        entry = self.entries.get(tuple([(v.dtype.num, v.ndim, v.flags.num & FLAG_BITS) if type(v) is np.ndarray
                                        else key(v) for v in args]))
        if entry is not None:
            return entry(*args)
        return self.jit(args)(*args)

    def entry(self, args: tuple[Any, ...]) -> Callable[..., Any]:
        """What serves a call with these arguments: the extension's entry for their types, else numba's JIT."""
        entry = self.entries.get(tuple(map(key, args)))
        return entry if entry is not None else self.jit(args)

    def jit(self, args: tuple[Any, ...]) -> Callable[..., Any]:
        types = tuple(map(key, args))
        if types not in self.missed:
            self.missed.add(types)
            log.warning("%s.%s: no kernel compiled ahead for these argument types %s; numba's JIT takes the call "
                        "(run `tolk build-kernels` again with this model and precision)", self.module, self.name,
                        types)
        return getattr(jit_module(self.module), self.name)  # type: ignore[no-any-return]


class Bound:
    """A compiled function whose arguments at..at+len(fixed)-1 are always `fixed` (a step's weights and settings):
    called with the others, in order. The entry is looked up by the others' types alone (the fixed ones' never
    change): the fused step's 46 weight arguments took about 9 us of its 10-odd us of key a call, five times a
    step. Works for a `Kernel` and for numba's own dispatcher alike (which finds its entry itself)."""

    __slots__ = ("fn", "at", "fixed", "entries")

    def __init__(self, fn: Callable[..., Any], at: int, fixed: tuple[Any, ...]) -> None:
        self.fn, self.at, self.fixed = fn, at, fixed
        self.entries: dict[Any, Callable[..., Any]] = {}  # by the other arguments' keys

    def __call__(self, *args: Any) -> Any:
        at, fn = self.at, self.fn
        if type(fn) is not Kernel:  # numba's dispatcher
            return fn(*args[:at], *self.fixed, *args[at:])
        others = tuple([(v.dtype.num, v.ndim, v.flags.num & FLAG_BITS) if type(v) is np.ndarray else key(v)
                        for v in args])
        entry = self.entries.get(others)
        if entry is None:
            entry = self.entries[others] = fn.entry((*args[:at], *self.fixed, *args[at:]))
        return entry(*args[:at], *self.fixed, *args[at:])


class Extension:
    """A built extension and its record: which entry serves which kernel for which argument types, and the values
    the kernel module computed from numba's view of the CPU when it was built (`value`)."""

    def __init__(self, module: ModuleType, record: dict[str, Any]) -> None:
        self.module, self.record = module, record

    def njit(self, *_: Any, **__: Any) -> Callable[[Callable[..., Any]], Kernel]:
        """Stands in for `numba.njit(...)` in a kernel module: the decorated function becomes a `Kernel`."""
        def wrap(fn: Callable[..., Any]) -> Kernel:
            module, name = fn.__module__, fn.__name__
            entries = {_frozen(types): getattr(self.module, entry)
                       for entry, types in self.record["exports"].get(f"{module}.{name}", [])}
            return Kernel(module, name, entries)
        return wrap

    def value(self, name: str) -> Any:
        return self.record["values"][name]


def same(fn: Any) -> Any:
    """Stands in for numba's `intrinsic` in a kernel module run from an extension: what it builds is only used
    inside compiled code, which the extension already holds."""
    return fn


def unused(*_: Any, **__: Any) -> Callable[[Any], Any]:
    """Stands in for numba's `overload(...)` in a kernel module run from an extension (as `same`)."""
    return same


_loaded: dict[str, Extension | None] = {}
_lock = threading.Lock()


def extension(module: str) -> Extension | None:
    """The extension for a kernel module being imported (`MODULES`), if one built for this machine is there and
    `TOLK_KERNELS` is not "jit"; None: the module compiles with numba's JIT as before."""
    if module not in MODULES or os.environ.get("TOLK_KERNELS", "").lower() == "jit":
        return None
    with _lock:
        if "ext" not in _loaded:
            _loaded["ext"] = _load(folder())
        return _loaded["ext"]


def _load(where: Path) -> Extension | None:
    record_path = where / RECORD
    if not record_path.exists():
        return None
    try:
        record = json.loads(record_path.read_text())
        path = where / record["file"]
        spec = importlib.util.spec_from_file_location(EXTENSION, path,
                                                      loader=importlib.machinery.ExtensionFileLoader(EXTENSION,
                                                                                                     str(path)))
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (OSError, ImportError, ValueError, KeyError) as e:
        log.warning("kernels compiled ahead in %s not loaded (%s); numba's JIT compiles them", where, e)
        return None
    log.info("kernels compiled ahead loaded from %s", where)
    return Extension(module, record)


def active() -> bool:
    """Whether this process runs its kernels from an extension (and so has not needed numba for them)."""
    return _loaded.get("ext") is not None


_jit: dict[str, ModuleType] = {}


def jit_module(module: str) -> ModuleType:
    """A second copy of a kernel module compiled by numba's JIT (imported here, once), for calls the extension has
    no entry for. Its functions are numba's own: the same numbers as a process without an extension."""
    with _lock:
        if module not in _jit:
            name = f"{module}_jit"
            spec = importlib.util.spec_from_file_location(name, _ROOT / f"{module.split('.')[-1]}.py")
            assert spec is not None and spec.loader is not None
            copy = importlib.util.module_from_spec(spec)
            sys.modules[name] = copy
            spec.loader.exec_module(copy)
            _jit[module] = copy
        return _jit[module]
