#!/usr/bin/env bash
# The whole pipeline on the tiny embedded default (CPU, minutes): a model built in code plays real ALFWorld games,
# the offline `rules` analyzer writes skills, SFT teaches the model to write them, two SEED updates, then eval.
# A random tiny model wins no game: this run checks the machinery end to end, not the method (see docs/).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-runs/demo}
MODEL=${MODEL:-$RUNS/models/tiny}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
t0=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - t0 ))s)"; }

step "1/6 tiny model"
[ -f "$MODEL/config.json" ] || seed model init --preset tiny --out "$MODEL"
step "2/6 collect"
seed collect -c tiny --model "$MODEL" --runs-dir "$RUNS"
step "3/6 annotate (offline rules analyzer)"
seed annotate -c tiny --runs-dir "$RUNS"
step "4/6 sft"
seed sft -c tiny --runs-dir "$RUNS"
step "5/6 rl (SEED, self-analyzer)"
seed rl -c tiny --runs-dir "$RUNS"
step "6/6 eval (seen, partial)"
seed eval -c tiny --split seen --from "$RUNS/rl/latest" --limit 12 --runs-dir "$RUNS"
step "done"
seed runs --runs-dir "$RUNS"
echo "report: $RUNS/eval/latest/report.md"
