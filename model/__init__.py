"""Tolk's model: the Transformer, its training recipe and data, checkpoints and imports, and the decoding engine.

Importing it sets one default for the process, before torch is loaded: torch's OpenMP (libgomp) keeps a finished
parallel region's threads spinning for GOMP_SPINCOUNT iterations, 300,000 unless set, a few milliseconds. A thread
that spins holds its core, so work that Tolk runs beside torch's products on threads of its own (the fused step's runs
of rows, model/fused_step.py; the fused encoder's runs, model/fused_encoder.py) waited for that core. At 10,000 the
threads sleep soon after: the fused step of 32 rows on two threads then took 1.71 against 2.80 ms unsplit, and the
operator step kept its speed (2.50 against 2.49 ms; docs/benchmarks.md). A value set in the environment wins. Once
torch is loaded this changes nothing, so a program that imports torch first gets a warning: on a 2-core Zen 5 EPYC
the shipped model decoded one sentence at a time on two threads at 1,150 tokens/s that way, against 3,411 with
`model` imported first (float32, greedy; `bench/import_order.py`, docs/benchmarks.md).
"""

import os
import sys
import warnings

if "GOMP_SPINCOUNT" not in os.environ and "torch" in sys.modules:
    warnings.warn("torch was imported before Tolk's model package, so its OpenMP threads keep spinning after each "
                  "parallel region and slow the CPU decoder's threads (up to 3x on two threads): import model (or "
                  "server) before torch, or set GOMP_SPINCOUNT=10000 in the environment", RuntimeWarning,
                  stacklevel=2)
os.environ.setdefault("GOMP_SPINCOUNT", "10000")
