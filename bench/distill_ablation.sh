#!/usr/bin/env bash
# What each distilled source adds (issue 22): the same short en-pt fine-tune from one model, once per training mix,
# every mix the corpus and GNOME's help as the shipped recipe has them plus one source at the recipe's weight; each
# result scored greedy in float32 on the dev split, the everyday sentences and the prose split. Two runs at a time,
# one thread each. Never run by the tests; about an hour on the 2-core machine at 250 steps.
#
#   bench/distill_ablation.sh [STEPS]      (needs data/corpus, data/help and the distilled folders below)
#   MIXES="base austen" TAG=-austen bench/distill_ablation.sh   (some mixes only; a mix already exported is reused)
#
# The start is the en-pt release from before any distilled pair (git revision $BASE_REV): the shipped model has seen
# every source already, so adding one again would show little. Writes bench/results/distill-ablation-{dev,everyday,
# prose}.json (under $RESULTS); its runs and models go under $WORK.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-10000}
STEPS=${1:-250}
BASE_REV=${BASE_REV:-6abff19}
WORK=${WORK:-runs/distill-ablation}
RESULTS=${RESULTS:-bench/results}
LIMIT=${LIMIT:-0}  # sentences scored per set (0: all); a quick check of the script
declare -A EXTRA=(
    [base]=""
    [wordnet]="data/distill-wordnet:2"         # tolk data distill --sources wordnet --out data/distill-wordnet
    [fortunes]="data/distill-fortunes:2"       # tolk data distill --sources fortunes,fortunes-br --out ...
    [glosses]="data/distill-glosses"           # tolk data distill --sources wordnet-glosses --out ...
    [austen]="data/distill-austen:2"           # tolk data distill --sources austen --out data/distill-austen
)
read -r -a NAMES <<< "${MIXES:-base wordnet fortunes glosses}"
TAG=${TAG:-}  # appended to the result files' names
THREADS=${THREADS:-1}  # per run; two runs at a time
mkdir -p "$WORK/models"
if [[ ! -f "$WORK/models/before/model.safetensors" ]]; then
    git archive "$BASE_REV" weights/en-pt | tar -x -C "$WORK"
    mv "$WORK/weights/en-pt" "$WORK/models/before" && rmdir "$WORK/weights"
fi
train() {  # name: mix, train STEPS steps from the start, export; resumes a run that stopped
    local name=$1
    [[ -n $name && ! -f "$WORK/models/$name/model.safetensors" ]] || return 0
    # shellcheck disable=SC2086  # EXTRA holds zero or one word
    "$PYTHON" -m model.data.mix --out "$WORK/mix-$name" data/corpus data/help:9 ${EXTRA[$name]}
    "$PYTHON" -m server.cli train --corpus "$WORK/mix-$name" --run "$WORK/run-$name" --source en --target pt \
        --arch small --spm weights/en-pt/source.spm --init "$WORK/models/before" --lr 3e-4 --warmup 100 \
        --max-tokens 4096 --accum 2 --save-every 50 --average 4 --max-steps "$STEPS" --eval-every 100000 \
        --threads "$THREADS" > "$WORK/train-$name.log" 2>&1
    "$PYTHON" -m server.cli train --corpus "$WORK/mix-$name" --run "$WORK/run-$name" --source en --target pt \
        --arch small --spm weights/en-pt/source.spm --export "$WORK/models/$name" --average 4 >> "$WORK/train-$name.log" 2>&1
}
set -x
for ((i = 0; i < ${#NAMES[@]}; i += 2)); do
    train "${NAMES[i]}" & first=$!
    train "${NAMES[i + 1]:-}"
    wait "$first"
done
models=(--model "$WORK/models/before")
for name in "${NAMES[@]}"; do models+=(--model "$WORK/models/$name"); done
"$PYTHON" bench/quality.py --src data/corpus/dev.en --ref data/corpus/dev.pt "${models[@]}" \
    --limit "$LIMIT" --out "$RESULTS/distill-ablation-dev$TAG.json"
"$PYTHON" bench/quality.py --src bench/data/everyday.en --ref bench/data/everyday.pt "${models[@]}" \
    --limit "$LIMIT" --out "$RESULTS/distill-ablation-everyday$TAG.json"
"$PYTHON" bench/quality.py --src data/corpus/prose.en --ref data/corpus/prose.pt "${models[@]}" \
    --limit "$LIMIT" --out "$RESULTS/distill-ablation-prose$TAG.json"
