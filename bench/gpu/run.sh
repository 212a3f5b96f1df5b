#!/usr/bin/env bash
# Everything issue 16 needs from a GPU machine, in as few runs as possible: the CUDA tests, the decode step with
# and without CUDA graphs, the engines against CTranslate2 and transformers, the server under load, and training.
#
#   bash bench/gpu/run.sh [--device cuda|cpu] STAGE...
#
# Stages, run in the order given; each writes its log and results under $OUT (default /tmp/tolk-gpu-out):
#   setup           install the wheels carried in .whl/ (the GPU image lacks fastapi, pydantic, ...) and, once both
#                   halves of the CTranslate2 archive have arrived (.ct2a/, .ct2b/, one per run), CTranslate2
#   train-start     unpack .gpudata/corpus.tar.xz and start the training runs, detached (bench/gpu/train.py)
#   tests           the CUDA tests: tests/test_cuda.py, tests/test_graphs.py and the model's tests
#   suite           the whole test suite, as far as the machine's packages allow (torch 2.11 compatibility)
#   step            the decoder step eager against CUDA graphs (bench/gpu/step.py)
#   profile         where one offline generate call spends its time, eager and with graphs (bench/gpu/stages.py)
#   engines         bench/engines.py: Tolk against CTranslate2 and transformers
#   serve           bench/serve.py: the server under 1 to 64 clients against itself unbatched
#   latency         sequential requests, streamed and not, through the server's variants (bench/gpu/latency.py)
#   train-status    print the training runs' progress
#   collect         wait for the training runs, score them with the shipped model on the test split, return the
#                   small models' weights in pieces (bench/gpu/train.py join rebuilds them)
#
# bench/gpu/prepare.sh builds the carried folders and says which run carries which.
# --device cpu is the dry run CI makes so that this script does not rot: tiny sizes, the same code paths where the
# CPU has them. The GPU machine has no network: what it lacks travels as files (`carry`).
set -uo pipefail
cd "$(dirname "$0")/../.."
DEVICE=cuda
if [ "${1:-}" = "--device" ]; then DEVICE=$2; shift 2; fi
SITE=/tmp/tolk-site
WORK=/tmp/tolk-gpu
if [ "$DEVICE" = cpu ]; then
    # The dry run keeps to a folder of its own and free ports, so that two on one machine (two clones' CI) never meet.
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
    SITE=$WORK/site
    OUT=${OUT:-$WORK/out}
fi
OUT=${OUT:-/tmp/tolk-gpu-out}
TRAIN_MINUTES=${TRAIN_MINUTES:-10}
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
failed=()
cpu() { [ "$DEVICE" = cpu ]; }
free_port() { $PY -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }

stage_setup() {
    if ! cpu && [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
            || return 1
    fi
    mkdir -p "$WORK/ct2" "$SITE"  # (a run that carries no wheels still unpacks CTranslate2 into $SITE)
    cp .ct2a/ct2.part-* .ct2b/ct2.part-* "$WORK/ct2/" 2>/dev/null
    local parts=("$WORK"/ct2/ct2.part-*)
    if [ ${#parts[@]} -eq 2 ] && [ -f "${parts[0]}" ] && ! $PY -c "import ctranslate2" 2>/dev/null; then
        cat "${parts[@]}" | xz -d | tar -C "$SITE" -x || return 1
    fi
    if ! cpu; then
        # CTranslate2's wheel opens libcublas.so.12 by name; this image has CUDA 13's cuBLAS. The calls it makes
        # (GemmEx, SgemmStridedBatched, ...) exist unchanged in 13, so a link under the old name lets it load.
        local lib
        lib=$(find / -name 'libcublas.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)
        if [ -n "$lib" ]; then
            mkdir -p "$WORK/cublas12"
            ln -sf "$lib" "$WORK/cublas12/libcublas.so.12"
            echo "libcublas.so.12 -> $lib"
        fi
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
    fi
    $PY -c "import torch, fastapi, pydantic; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
    $PY -c "import ctranslate2; print('ctranslate2', ctranslate2.__version__)" 2>/dev/null || echo "no ctranslate2 yet"
}
export LD_LIBRARY_PATH="$WORK/cublas12${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

stage_train-start() {
    if cpu; then  # a synthetic corpus and the tiny architecture: the same path in seconds
        $PY -c "from pathlib import Path; from tests.test_train import write_corpus; write_corpus(Path('$WORK/dry'))" \
            && $PY bench/gpu/train.py pack-corpus --corpus "$WORK/dry" --out "$WORK/dry.tar.xz" --preset 1 \
            && $PY bench/gpu/train.py start --corpus "$WORK/dry.tar.xz" --work "$WORK/train" --minutes 0.3 \
                --device cpu --dry-run
        return
    fi
    # TRAIN_RUNS: which runs (default all); TRAIN_INIT: RUN=MODEL_DIR pairs that continue from those weights
    # shellcheck disable=SC2086  # one word per run and pair
    $PY bench/gpu/train.py start --corpus .gpudata/corpus.tar.xz --work "$WORK/train" --minutes "$TRAIN_MINUTES" \
        ${TRAIN_RUNS:+--runs $TRAIN_RUNS} ${TRAIN_INIT:+--init $TRAIN_INIT}
}

stage_train-status() { $PY bench/gpu/train.py status --work "$WORK/train"; }

stage_collect() {  # the runs of $COLLECT_RUNS scored, and those of $COLLECT_WEIGHTS returned in pieces
    local runs=${COLLECT_RUNS:-en-pt-small en-pt-medium pt-en-small} weights=${COLLECT_WEIGHTS:-en-pt-small pt-en-small}
    # shellcheck disable=SC2086  # one word per run
    if cpu; then
        $PY bench/gpu/train.py collect --work "$WORK/train" --out "$OUT/train" --runs $runs --weights $weights \
            --device cpu --limit 8 --timeout 120
    else
        $PY bench/gpu/train.py collect --work "$WORK/train" --out "$OUT" --runs $runs --weights $weights --timeout 560
    fi
}

stage_tests() {
    $PY -m pytest -p no:cacheprovider tests/test_cuda.py tests/test_graphs.py tests/test_tokenizer_checkpoint.py \
        tests/test_model.py 2>&1 | tee "$OUT/tests-$DEVICE.log"
}

stage_suite() {  # the whole suite on this machine's torch, what its packages allow (a compatibility check)
    timeout 300 $PY -m pytest -q -p no:cacheprovider --continue-on-collection-errors --ignore=tests/test_page.py \
        2>&1 | tail -40 | tee "$OUT/suite-$DEVICE.log"
}

stage_step() {
    if cpu; then
        $PY bench/gpu/step.py --model weights/en-pt --device cpu --dtype float32 --rows 1 4 --steps 5
        return
    fi
    for dtype in float16 bfloat16; do
        $PY bench/gpu/step.py --model weights/en-pt --dtype $dtype --out "$OUT/step-cuda-en-pt-$dtype.json" || return 1
    done
    $PY bench/gpu/step.py --opus-mt --dtype float16 --out "$OUT/step-cuda-opus-mt-float16.json"
}

corpus_dir() {  # the test split: unpacked by train-start, or here from the carried archive
    local dir="$WORK/train/corpus"
    if [ ! -f "$dir/test.en" ]; then
        mkdir -p "$dir" && tar -C "$dir" -xJf .gpudata/corpus.tar.xz || return 1
    fi
    echo "$dir"
}

stage_engines() {
    if cpu; then
        $PY bench/engines.py --quick --benchmarks forced --engines tolk,tolk-bfloat16,ct2 --batches 1,4 \
            --out "$OUT/engines-dry.json"
        return
    fi
    local corpus
    corpus=$(corpus_dir) || return 1
    # two runs, two files: a failure in one keeps the other's results
    # ENGINES_FORCED / ENGINES_CORPUS: fewer engines where device time is short (the 2026-11-27 session ran
    # tolk-float16,tolk-bfloat16,ct2-float16 for (a))
    $PY bench/engines.py --device cuda --benchmarks forced --batches 1,8,32,64 --repeats 3 \
        --engines "${ENGINES_FORCED:-tolk-float16,tolk-bfloat16,ct2-float16,ct2-int8_float16,transformers}" \
        --out "$OUT/engines-cuda-forced.json" || return 1
    $PY bench/engines.py --device cuda --benchmarks corpus --src "$corpus/test.en" --limit 256 --batches 1,8,32,64 \
        --repeats 2 --engines "${ENGINES_CORPUS:-tolk-float16,tolk-bfloat16,ct2-float16,ct2-int8_float16}" \
        --out "$OUT/engines-cuda-corpus.json"
}

stage_profile() {
    if cpu; then
        printf '%s\n' "Open the file." "The disk is full." "Save the document before closing the window." \
            "An unexpected error occurred." > "$WORK/profile.en"
        $PY bench/gpu/stages.py --src "$WORK/profile.en" --device cpu --dtype float32 --batches 1 2 >/dev/null \
            && $PY bench/gpu/stages.py --src "$WORK/profile.en" --device cpu --dtype float32 --batches 2 --beam 2 \
                >/dev/null
        return
    fi
    local corpus
    corpus=$(corpus_dir) || return 1
    $PY bench/gpu/stages.py --src "$corpus/test.en" --sentences 128 --batches 1 8 32 --out "$OUT/profile-cuda" \
        && $PY bench/gpu/stages.py --src "$corpus/test.en" --sentences 128 --batches 1 8 32 --beam 4 \
            --out "$OUT/profile-cuda-beam4"
}

stage_serve() {
    if cpu; then
        $PY bench/serve.py --tiny --clients 1 4 --quick --port "$(free_port)" --out "$OUT/serve-dry.json"
        return
    fi
    local corpus
    corpus=$(corpus_dir) || return 1
    # 256 requests a phase: serve.py's default at 64 clients, two requests each, read 3.69x unbatched on the H200
    # where 256 read 6.39x (docs/benchmarks.md): a phase that short is mostly its first and last requests
    $PY bench/serve.py --model weights/en-pt --sentences "$corpus/test.en" --device cuda --dtype float16 \
        --clients 1 8 32 64 --rows 128 --requests 256 --out "$OUT/serve-cuda.json"
}

stage_latency() {
    if cpu; then
        # One thread: a server given more first compiles the steps cut over them (FrozenTransformer.warm_parts); with
        # numba's cache empty this stage took 274 s with 2 threads and 141 s with 1. In CI it still took 229 s (247 with
        # 2), most of it before the first /ready (bench/serve.py waits 300 s): it starts about 14 minutes into the
        # tests, which write the kernels' variants into numba's cache over their first 14 (the cache files' times in a
        # cold run alone), so its servers compile what the tests have not yet. After the whole suite it took 24 s.
        $PY -c "from pathlib import Path; from tests.tiny import make_model_dir, corpus_lines; d = Path('$WORK/tiny'); \
(d / 'config.json').exists() or make_model_dir(d); Path('$WORK/tiny.txt').write_text(chr(10).join(corpus_lines(80, seed=2)))" \
            && $PY bench/gpu/latency.py --model "$WORK/tiny" --sentences "$WORK/tiny.txt" --device cpu --dtype float32 \
                --requests 2 --rounds 1 --variants process thread --threads 1 --port "$(free_port)"
        return
    fi
    local corpus
    corpus=$(corpus_dir) || return 1
    $PY bench/gpu/latency.py --model weights/en-pt --sentences "$corpus/test.en" --out "$OUT/latency-cuda.json"
}

for stage in "$@"; do
    echo "=== $stage ($DEVICE) $(date -u +%T)"
    start=$SECONDS
    case $stage in
        setup|train-start|train-status|collect|tests|suite|step|profile|engines|serve|latency) "stage_$stage" ;;
        *) echo "unknown stage $stage"; false ;;
    esac
    rc=$?
    echo "=== $stage: exit $rc in $((SECONDS - start)) s"
    [ $rc -eq 0 ] || failed+=("$stage")
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "failed stages: ${failed[*]}"
    exit 1
fi
