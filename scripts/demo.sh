#!/usr/bin/env bash
# The whole pipeline on the tiny embedded default (CPU, minutes): a model built in code plays real ALFWorld games,
# the offline `rules` analyzer writes skills, SFT teaches the model to write them, two SEED updates, then eval.
# A random tiny model wins no game: this run checks the machinery end to end, not the method (see docs/).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-runs/demo}
MODEL=${MODEL:-$RUNS/models/tiny}
# DEMO_CONFIG=webshop/tiny (or search/tiny) runs the same demo on another environment; the default is ALFWorld's
CONFIG=${DEMO_CONFIG:-tiny}
SPLIT=$([ "$CONFIG" = tiny ] && echo "--split seen" || true)  # other presets name their eval split
EVAL_LIMIT=12  # search applies --limit per data source, the others to the split as a whole
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
t0=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - t0 ))s)"; }

step "1/6 tiny model"
[ -f "$MODEL/config.json" ] || seed model init --preset tiny --out "$MODEL"
step "2/6 collect"
seed collect -c "$CONFIG" --model "$MODEL" --runs-dir "$RUNS"
step "3/6 annotate (offline rules analyzer)"
seed annotate -c "$CONFIG" --runs-dir "$RUNS"
step "4/6 sft"
seed sft -c "$CONFIG" --runs-dir "$RUNS"
step "5/6 rl (SEED, self-analyzer)"
seed rl -c "$CONFIG" --runs-dir "$RUNS"
step "6/6 eval (partial)"
seed eval -c "$CONFIG" $SPLIT --from "$RUNS/rl/latest" --limit "$EVAL_LIMIT" --runs-dir "$RUNS"
step "done"
seed runs --runs-dir "$RUNS"
summary() {  # what the demo made, where, what its numbers mean, and what to run next
  python - "$RUNS" "$MODEL" "$(( $(date +%s) - t0 ))" "$EVAL_LIMIT" <<'PY'
import json, re, sys
from pathlib import Path
from seedcli.envs import env_class
runs, model, secs, limit = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
def manifest(stage):
    p = runs / stage / "latest" / "manifest.json"
    return json.loads(p.read_text()) if p.exists() else {}
def metric(stage, key):
    v = manifest(stage).get("metrics", {}).get(key)
    return f"{v:.0%}" if isinstance(v, float) else str(v)
ev = manifest("eval").get("metrics", {})
env = env_class(ev.get("env", "alfworld"))
# the eval's own count: search applies --limit to each data source, the others to the split as a whole
played = f"{ev.get('games', '?')} eval {env.card.task_noun}s (partial: --limit {limit}" + (
    f" per {env.card.category_label})" if env.limit_per_category else ")")
first = next(iter(env.card.metric_labels))
measure = "success" if first.endswith("_success") else env.card.metric_labels[first].split(" (")[0]
headline = re.sub(r" \(\w+\)$", "", ev.get("headline", f"success {metric('eval', 'macro_success')}"))
def last_row(key):
    p = runs / "rl" / "latest" / "metrics.jsonl"
    rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []
    vals = [r[key] for r in rows if key in r]
    return f"{vals[-1]:.2f}" if vals else "n/a"
print(f"""
== summary ({secs}s)
made: the model {model} (tiny Qwen2 shape, random weights, built in code) and, under {runs}/
(each run has a manifest.json with its config, inputs and output hashes; `latest` points to the newest):
  collect/latest/trajectories.jsonl  {metric('collect', 'episodes')} episodes played by it
  annotate/latest/skills.jsonl       {metric('annotate', 'annotate/kept')} hindsight skills (offline rules analyzer)
  sft/latest/model/                  the model fine-tuned to write skill JSON
  rl/latest/                         2 SEED updates: metrics.jsonl, samples.jsonl, checkpoints/
  eval/latest/report.md              {measure} per {env.card.category_label} on {played}
what the numbers mean: this model has random weights, so {headline} and
  opd/valid_skill_frac {last_row('opd/valid_skill_frac')} (skills the model wrote for itself that parse) are expected
  — the demo checks that every stage runs and chains, not that the method learns. The method check does that.
next:
  seed plot {runs}/rl/latest --out plots        training curves (PNG)
  seed inspect {runs}/rl/latest                 an episode, its skill, and per-token score shift and gate
  seed runs --runs-dir {runs}                   every run, its status and lineage
  make method-check-tiny                         SEED vs GRPO with 3 seeds on text Sokoban, on CPU (~100 min)
  on GPUs: GPU=1 make install, then the paper's pipeline with -c paper_qwen25_3b and seed rl --gpus 8 (README)
`seed` lives in .venv/bin: `source .venv/bin/activate`, or call .venv/bin/seed.""")
PY
}
summary
