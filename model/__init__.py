"""Tolk's model: the Transformer, its training recipe and data, checkpoints and imports, and the decoding engine.

Importing it sets one default for the process, before torch is loaded: torch's OpenMP (libgomp) keeps a finished
parallel region's threads spinning for GOMP_SPINCOUNT iterations, 300,000 unless set, a few milliseconds. A thread
that spins holds its core, so work that Tolk runs beside torch's products on threads of its own (the fused step's runs
of rows, model/fused_step.py; the fused encoder's runs, model/fused_encoder.py) waited for that core. At 10,000 the
threads sleep soon after: the fused step of 32 rows on two threads then took 1.71 against 2.80 ms unsplit, and the
operator step kept its speed (2.50 against 2.49 ms; docs/benchmarks.md). A value set in the environment wins; once
torch is loaded, this changes nothing.
"""

import os

os.environ.setdefault("GOMP_SPINCOUNT", "10000")
