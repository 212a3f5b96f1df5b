#!/usr/bin/env bash
# Builds, here, what bench/gpu/run.sh needs carried to the GPU machine (which has no network), in git-ignored
# folders that each run names in `carry`:
#   .whl/      the server's packages the GPU image lacks, as wheels for its Python 3.12 (about 8 MB)
#   .gpudata/  the training corpus, one .tar.xz (about 10 MB; needs data/corpus: `tolk data build`); with
#              TRAIN_EXTRA=data/distill:2 (after `tolk data distill`) those pairs join its train split
#   .ct2a/ .ct2b/  CTranslate2 recompressed (xz) and cut in two halves of about 12 MB, one per run: a run carries
#              at most 64 MiB with the working tree (about 38 MB), too little for the whole 43 MB wheel at once;
#              run.sh's setup keeps the halves on the machine and installs CTranslate2 once both have come
# Then the runs are, back to back (a machine is handed back 30 s after a run ends, and everything on it with it):
#   1. carry .ct2a .gpudata: bash bench/gpu/run.sh setup tests step profile     (about 2 minutes)
#   2. carry .ct2b .whl:     bash bench/gpu/run.sh setup tests engines          (about 5 minutes; tests need .whl)
#   3. carry .gpudata .whl:  bash bench/gpu/run.sh setup serve latency          (about 2 minutes)
#   4. carry .gpudata .whl:  TRAIN_MINUTES=M TRAIN_RUNS=... TRAIN_INIT=RUN=DIR bash bench/gpu/run.sh setup \
#                            train-start collect   (M + 1.5 minutes; collect waits for the runs and scores them)
# A run carries at most 64 MiB with the working tree (about 39 MB): .ct2a and .ct2b never fit together, and the
# second must reach the machine that got the first. One session has 30 minutes of GPU time, each machine's start
# (about 40 s) included. The 2026-11-22 sessions: the first spent 4 minutes on training, 5 on step and server, 4 on
# engines; the second 3 diagnosing (profile, latency), 12 on tests, step, engines and server, 8 training, 2 on beam search.
# The 2026-11-27 session had 15 minutes and used 11 in four runs on one machine, each started within the 30 s it
# stays warm: (1) carry .gpudata .ct2a: setup train-start (3-minute runs, TRAIN_INIT both directions); (2) carry
# .ct2b .whl: setup tests, then train.py collect --shipped none (waits for the runs); (3) no carry: engines (both
# tables, fewer engines) and serve; (4) serve at 64 clients again. The tests ran beside the training.
# Put OUT=$OUT before bash: results come back from $OUT.
# Needs pip, xz, unzip and split; run from anywhere.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
download() {  # wheels for the GPU machine's CPython 3.12
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" -d "$1" "${@:2}"
}
pinned() {  # NAME==VERSION as installed here, so the GPU machine runs what the tests ran against
    "$PY" -m pip show "$1" | awk -v n="$1" '/^Version:/ {print n "==" $2}'
}

rm -rf .whl && mkdir -p .whl
names=(fastapi starlette uvicorn pydantic pydantic-core pydantic-settings python-dotenv annotated-types
       typing-inspection python-multipart limits deprecated py3langid cachetools polib httptools annotated-doc redis langcodes
       typing-extensions opentelemetry-api)
specs=()
for name in "${names[@]}"; do specs+=("$(pinned "$name")"); done
download .whl "${specs[@]}"

rm -rf .gpudata && mkdir -p .gpudata
# shellcheck disable=SC2086  # TRAIN_EXTRA: one word per DIR[:N]
PYTHONPATH=. "$PY" bench/gpu/train.py pack-corpus --corpus data/corpus --out .gpudata/corpus.tar.xz \
    ${TRAIN_EXTRA:+--extra $TRAIN_EXTRA}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
download "$tmp" "$(pinned ctranslate2)"
mkdir -p "$tmp/x" && unzip -q "$tmp"/ctranslate2-*.whl -d "$tmp/x"
tar -C "$tmp/x" -cf - . | xz -9e -T0 > "$tmp/ct2.tar.xz"
split -n 2 -d "$tmp/ct2.tar.xz" "$tmp/ct2.part-"
rm -rf .ct2a .ct2b && mkdir -p .ct2a .ct2b
mv "$tmp/ct2.part-00" .ct2a/ && mv "$tmp/ct2.part-01" .ct2b/

tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb | tail -1 | cut -f1)
limit=$((64 * 1048576))
for carried in ".whl .gpudata" ".gpudata .ct2a" ".ct2b .whl"; do  # as the runs listed above carry them
    # shellcheck disable=SC2086  # one word per folder
    size=$(du -cb $carried | tail -1 | cut -f1)
    echo "a run carrying $carried: $(((tree + size) / 1000000)) MB of $((limit / 1000000)) MB"
    [ $((tree + size)) -lt $limit ] || { echo "too large for one run: carry less"; exit 1; }
done
