# Everything goes through a virtual environment in .venv; torch is pinned and installed first so that pip
# takes the CPU wheel instead of pulling several GB of CUDA packages.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: setup test test-fast serve kernels lint bench corpus train clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

test: setup
	$(BIN)/python -m pytest

# Everything but the slow tier (tests marked `slow`: browser, Prometheus, Redis, Ray, soak, full fuzz, training,
# parity with other engines): for the edit-and-test loop; CI and `make test` run the whole suite.
test-fast: setup
	$(BIN)/python -m pytest -m "not slow"

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

serve: setup kernels
	$(BIN)/tolk serve --host $(HOST) --port $(PORT)

# The CPU kernels compiled ahead for the shipped models on this machine (model/native.py): the server then runs them
# without numba (about 190 MB less a process). Needs a C compiler; without one the server compiles them as before.
kernels: $(VENV)/.kernels

$(VENV)/.kernels: $(VENV)/.installed model/kernels.py model/beam_host.py model/native.py model/native_build.py
	$(BIN)/tolk build-kernels --model weights/en-pt --model weights/pt-en && touch $@ \
		|| echo "kernels not compiled ahead: the server compiles them with numba's JIT (the next make serve tries again)"

# Every table of docs/benchmarks.md, one script after another (about 20 minutes on the 2-core Zen 5 machine, 1.5 hours on the Zen 4 one; run it quiet).
bench: setup
	$(BIN)/pip install --quiet -e ".[bench]"
	PYTHON=$(BIN)/python bash bench/run_all.sh

corpus: setup
	$(BIN)/tolk data build

train: setup
	$(BIN)/tolk train --corpus data/corpus --run runs/en-pt-small --arch small --max-hours 2

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
