#!/usr/bin/env bash
# The probe across environments: for each environment with an expert, SmolLM2-135M-Instruct's teacher on
# PANEL expert-played held-out episodes (skills: the oracle against another task's oracle, the model's own against
# another task's own; absorption's starting figures), one `seed eval --policy expert` and one `seed probe` each.
#   bash scripts/probe_sweep.sh                       # every environment, into runs/sweep/<env>/
#   ENVS="sokoban webshop" PANEL=8 SKILLS=none MEASURE=contexts bash scripts/probe_sweep.sh   # the cheapest read
# Resumable: an environment whose probe finished is kept (delete runs/sweep/<env>/probe to redo it).
# The table of docs/skill-probe.md is printed by `python scripts/probe_sweep_table.py runs/sweep`.
{
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export ALFWORLD_DATA=${ALFWORLD_DATA:-$(cd ../shared/alfworld 2>/dev/null && pwd)}
RUNS=${RUNS:-runs/sweep}
MODEL=${MODEL:-models/smollm2}
ENGINE=${ENGINE:-vllm}
ENVS=${ENVS:-search sokoban webshop alfworld ezpoints}
PANEL=${PANEL:-32}
SKILLS=${SKILLS:-self}  # the own skill: self (the model writes it: minutes of generation) | rules | none (no own context)
MEASURE=${MEASURE:-both}  # contexts | absorption | both (absorption adds a sample a state and two scorings of it)
[ -f "$MODEL/config.json" ] || seed model init --preset smollm2-135m-instruct --out "$MODEL"
split_of() { case $1 in alfworld) echo valid_unseen ;; *) echo test ;; esac; }
for env in $ENVS; do
  dir=$RUNS/$env
  n=$PANEL; [ "$env" = alfworld ] && n=$(( PANEL / 2 ))  # ALFWorld's episodes are 3-4x as many turns
  if [ -f "$dir/probe/latest/probe.json" ]; then echo "== $env: probe done, kept"; continue; fi
  mkdir -p "$dir"
  if [ ! -f "$dir/eval/latest/manifest.json" ]; then
    echo "== $env: the expert plays $n $(split_of "$env") tasks"
    seed eval --env "$env" --policy expert --split "$(split_of "$env")" --limit "$n" --runs-dir "$dir" --json > /dev/null
  fi
  echo "== $env: probe ($(date -u +%H:%M:%S))"
  start=$(date +%s)
  seed probe --env "$env" --from "$dir/eval/latest" --model "$MODEL" --runs-dir "$dir" --engine "$ENGINE" \
    --skills "$SKILLS" --episodes "$n" --max-new-tokens 128 --temperature 0.4 --measure "$MEASURE" \
    analyzer_max_new_tokens=160 --json > "$dir/probe.out" 2> "$dir/probe.log" || { tail -5 "$dir/probe.log"; exit 1; }
  echo "== $env: probe done in $(( $(date +%s) - start ))s"
done
exit
}
