"""Process-wide settings for a decoding process, made once at its start by whoever owns the process.

The server makes them (`server.cli.main`, and each scheduler process it spawns); a benchmark that stands for the
server makes them too; importing or loading a model changes nothing process-wide unless they were made.

- Threads: torch's OpenMP (libgomp) keeps a finished parallel region's threads spinning for GOMP_SPINCOUNT
  iterations, 300,000 unless set, a few milliseconds. A spinning thread holds its core, so the work that Tolk runs
  beside torch's products on threads of its own (the fused step's shares, model/fused_step.py; the fused encoder's
  runs, model/fused_encoder.py) waited for it. At `SPIN_COUNT` those threads sleep soon after (docs/experiments.md,
  "Rows cut over the torch threads once OpenMP's threads stop spinning"). libgomp reads the variable when torch
  loads it, so `configure` must come before `import torch`; a value set in the environment wins.
- The C heap (glibc): while a model loads, and afterwards, large blocks come from mmap and go back when freed
  (`loading_heap`, `settle_heap`); idle moments hand freed heap back (`trim_heap`).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import sys
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SPIN_COUNT = "10000"
_heap_managed = False  # set by `configure` / `manage_heap`: the heap functions below act only then


def configure() -> None:
    """The server's process-wide settings: `SPIN_COUNT` for torch's OpenMP threads (unless the environment has
    one; a warning where torch is loaded already, since libgomp has then read it) and the managed heap."""
    if "GOMP_SPINCOUNT" not in os.environ:
        if "torch" in sys.modules:
            warnings.warn("torch was imported before model.runtime.configure(), so its OpenMP threads keep spinning "
                          "after each parallel region and slow the CPU decoder's threads (up to 3x on two threads): "
                          "call it before importing torch, or set GOMP_SPINCOUNT=10000 in the environment",
                          RuntimeWarning, stacklevel=2)
        os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    manage_heap()


def manage_heap() -> None:
    """From now on in this process, loading a CPU model sets glibc's mmap threshold (`loading_heap`)."""
    global _heap_managed
    _heap_managed = True


def return_freed_memory() -> None:
    """Hand the memory that loading freed back to the operating system. glibc keeps freed heap for reuse, so the
    float32 weights that quantizing or prepacking replaced stayed resident: on an OPUS-MT-size model, int8, about
    375 MB of 600 (ad hoc, /proc/self/status). Nothing happens where the C library has no malloc_trim."""
    gc.collect()
    trim_heap()


MMAP_THRESHOLD = 4 << 20  # `settle_heap`'s default (TOLK_MMAP_THRESHOLD)
LOAD_MMAP_THRESHOLD = 128 << 10  # `loading_heap`'s: glibc's own starting value, held fixed while a model loads
M_MMAP_THRESHOLD = -3  # mallopt's parameter (glibc's malloc.h)


def _mmap_threshold(value: int) -> None:
    """Fix glibc's mmap threshold at `value` bytes, unless MALLOC_MMAP_THRESHOLD_ in the environment (which glibc
    has read already) or TOLK_MMAP_THRESHOLD=0 keeps glibc's own. Nothing happens where the C library has no
    mallopt."""
    if (not _heap_managed or "MALLOC_MMAP_THRESHOLD_" in os.environ
            or int(os.environ.get("TOLK_MMAP_THRESHOLD", MMAP_THRESHOLD)) <= 0):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, value)


def settle_heap() -> None:
    """Fix glibc's mmap threshold at 4 MB (TOLK_MMAP_THRESHOLD bytes; 0 keeps glibc's own), once a CPU model is
    loaded: a batch's large blocks (encoder activations, cross K/V, its self-attention cache) then come from mmap
    and go back to the system when freed. glibc otherwise raises the threshold to the size of each mapped block
    freed, up to 32 MB, after which such blocks come from its heap and stay there: a greedy batch of 32 on the OPUS-MT
    geometry, float32, took its process 141 MB over the loaded model, 83 MB with the threshold fixed at 1 MB and 107
    at 4 MB (ad hoc, VmHWM over three or four batches). What a decoder step writes anew every time is kept in buffers
    (`KVCache.scratch`, the int8 sums in their outputs' memory), so no fused step maps or faults in memory; 4 MB
    rather than 1 leaves the operator step's own per-step arrays in the heap (the shipped model's logits at 128 rows,
    4.1 MB: float32 beam 4 at 32 sentences ran 0.90x the speed before at 1 MB, 1.01x at 4)."""
    _mmap_threshold(int(os.environ.get("TOLK_MMAP_THRESHOLD", MMAP_THRESHOLD)))


@contextlib.contextmanager
def loading_heap(device: torch.device) -> Iterator[None]:
    """While a model loads onto the CPU, blocks of 128 KB and more come from mmap (`LOAD_MMAP_THRESHOLD`), and
    `settle_heap` follows. Loading frees float32 weights as their quantized or prepacked copies are made, between
    blocks that stay: from the heap, they left it full of holes (an OPUS-MT model in int8: 303 MB of heap, 142 of
    them free). Trimming hands those pages back, but decoding then allocates across the holes and faults them in
    again: beam 4 on one sentence, 64 tokens, took the process 30-35 MB over the loaded model, where it takes 6-8
    with the holes gone (ad hoc, mallinfo2 and /proc/self/statm)."""
    if device.type != "cpu":
        yield
        return
    _mmap_threshold(LOAD_MMAP_THRESHOLD)
    try:
        yield
    finally:
        settle_heap()


def trim_heap() -> None:
    """Hand the C heap's free memory back to the operating system (glibc's malloc_trim; nothing elsewhere). After a
    burst of large batches, glibc keeps what their buffers freed for reuse: on an OPUS-MT-size model, int8, a
    process that had decoded 32 sentences stayed about 95 MB higher until trimmed (ad hoc, /proc/self/status). The
    pages are faulted in again when used, so this is for idle moments (the server's scheduler, idle half a second)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)
