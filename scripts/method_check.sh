#!/usr/bin/env bash
# CPU method check (issue 7): warm-started tiny agent → Stage 1 (collect → annotate → sft) → GRPO and SEED from the
# same checkpoint and seed → eval seen/unseen → docs/method-check.md regenerated from the run directories.
#   make method-check                          # the whole check, fresh runs, PARALLEL=1 (about an hour on two idle cores)
#   PARALLEL=1 bash scripts/method_check.sh    # independent steps (the two RL runs, seen/unseen evals) side by side
#   REPORT_ONLY=1 bash scripts/method_check.sh # only regenerate the document from the last run
#   WARM_FROM=DIR bash scripts/method_check.sh  # reuse a model trained by `seed model init --warm-start expert`
#   RESUME=1 bash scripts/method_check.sh      # keep the steps index.json lists as done (delete an entry to redo it)
# Every command and its wall time are appended to $RUNS/commands.jsonl; $RUNS/index.json names the run of each step.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${CONFIG:-configs/method_check.yaml}
RUNS=${RUNS:-runs/method-check}
DOC=${DOC:-docs/method-check.md}
# one thread per process: on two shared cores, two threads ran the tiny model 4x slower than one (contention)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false \
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
PY=${PY:-python}
export PARALLEL=${PARALLEL:-${RL_PARALLEL:-0}}
cfg() { $PY -c "import sys,yaml; d=yaml.safe_load(open('$CONFIG')); print(d$1)"; }
SEED=$(cfg "['seed']")
GAMES=$(cfg "['warm_start']['games']")
EPOCHS=$(cfg "['warm_start']['epochs']")
MODEL=$RUNS/models/agent
LOGS=$RUNS/logs
t0=$(date +%s)

# record <name> <command...>: run, log to $LOGS/<name>.log, append {name, command, seconds, run} to commands.jsonl
record() {
  local name=$1; shift
  local start end rc=0
  if [ "${RESUME:-0}" = 1 ] && done_step "$name"; then echo "== $name: done in an earlier session, kept"; return 0; fi
  echo "== $name ($(( $(date +%s) - t0 ))s): $*"
  start=$(date +%s.%N)
  "$@" > "$LOGS/$name.json" 2> "$LOGS/$name.log" || rc=$?
  end=$(date +%s.%N)
  flock "$RUNS/.lock" $PY - "$RUNS" "$name" "$start" "$end" "$rc" "$@" <<'PYEOF'
import json, sys, time
from pathlib import Path
runs, name, start, end, rc, *cmd = sys.argv[1:]
out = Path(runs) / "logs" / f"{name}.json"
run = None
try:
    text = out.read_text().strip().splitlines()
    summary = json.loads(text[-1]) if text else {}
    if "stage" in summary and "run_id" in summary:
        run = str(Path(runs) / summary["stage"] / summary["run_id"])
except (OSError, ValueError):
    pass
rec = {"name": name, "command": " ".join(cmd), "seconds": round(float(end) - float(start), 1), "rc": int(rc),
       "run": run, "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(end)))}
with open(Path(runs) / "commands.jsonl", "a") as f:
    f.write(json.dumps(rec) + "\n")
index = Path(runs) / "index.json"
data = json.loads(index.read_text()) if index.exists() else {}
if int(rc) == 0:
    data[name] = run
index.write_text(json.dumps(data, indent=1))
PYEOF
  if [ "$rc" != 0 ]; then echo "step $name failed (rc $rc): see $LOGS/$name.log" >&2; tail -5 "$LOGS/$name.log" >&2; exit "$rc"; fi
}
# pair <name> <command...> -- <name> <command...>: two independent steps, side by side with PARALLEL=1
pair() {
  local first=() second=() seen=0 arg
  for arg in "$@"; do
    if [ "$arg" = "--" ] && [ $seen = 0 ]; then seen=1; continue; fi
    if [ $seen = 0 ]; then first+=("$arg"); else second+=("$arg"); fi
  done
  if [ "$PARALLEL" = 1 ]; then
    record "${first[@]}" & local p1=$!
    sleep 3  # distinct run-directory timestamps
    record "${second[@]}" & local p2=$!
    local rc=0
    wait $p1 || rc=$?
    wait $p2 || rc=$?
    [ $rc = 0 ] || exit $rc
  else
    record "${first[@]}"
    record "${second[@]}"
  fi
}
# done_step <name>: the step has a successful entry in index.json (RESUME=1 keeps it)
done_step() { $PY -c "import json,sys; d=json.load(open('$RUNS/index.json')); sys.exit(0 if '$1' in d else 1)" 2>/dev/null; }
run_of() { $PY -c "import json; print(json.load(open('$RUNS/index.json'))['$1'])"; }

if [ "${REPORT_ONLY:-0}" != 1 ]; then
  if [ "${RESUME:-0}" != 1 ] && [ -d "$RUNS" ]; then mv "$RUNS" "$RUNS.old-$(date -u +%Y%m%dT%H%M%SZ)"; fi
  mkdir -p "$LOGS" "$RUNS/models"
  [ -f "$RUNS/machine.json" ] || $PY - "$RUNS" "$CONFIG" <<'PYEOF'
import json, os, platform, subprocess, sys, time
runs, config = sys.argv[1:]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
mem = next((int(l.split()[1]) // 1024 // 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal")), None)
info = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpu": cpu, "cores": os.cpu_count(),
        "memory_gib": mem, "load_avg_at_start": os.getloadavg(), "python": platform.python_version(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "parallel": os.environ.get("PARALLEL", "0"),
        "config": config, "gpu": "none"}
json.dump(info, open(f"{runs}/machine.json", "w"), indent=1)
PYEOF

  # 1. warm start: behaviour-clone the expert's walkthroughs in the agent prompt format
  if [ -n "${WARM_FROM:-}" ]; then
    # reuse a model this same command trained earlier (its warmstart.json says how); the document says so
    [ -f "$WARM_FROM/warmstart.json" ] || { echo "WARM_FROM=$WARM_FROM has no warmstart.json" >&2; exit 2; }
    record warmstart_reused cp -r "$WARM_FROM" "$MODEL"
  else
    # nothing else runs during the warm start: two threads train it ~1.8x faster than one
    record warmstart env OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 \
      seed model init --preset tiny --out "$MODEL" --seed "$SEED" --warm-start expert --games "$GAMES" --epochs "$EPOCHS"
  fi
  pair eval_warm_seen seed eval -c "$CONFIG" --runs-dir "$RUNS" --model "$MODEL" --split seen --json \
    -- eval_warm_unseen seed eval -c "$CONFIG" --runs-dir "$RUNS" --model "$MODEL" --split unseen --json

  # 2. Stage 1: the warm-started policy plays training games, the offline analyzer writes skills, SFT on them
  record collect seed collect -c "$CONFIG" --runs-dir "$RUNS" --model "$MODEL" --json
  record annotate seed annotate -c "$CONFIG" --runs-dir "$RUNS" --from "$(run_of collect)" --json
  record sft seed sft -c "$CONFIG" --runs-dir "$RUNS" --from "$(run_of annotate)" --json
  SFT=$(run_of sft)

  # 3. Stage 2 from the same checkpoint and seed: GRPO, then SEED with the self-analyzer
  pair rl_grpo seed rl -c "$CONFIG" --runs-dir "$RUNS" --from "$SFT" --algo grpo --analyzer none --json \
    -- rl_seed seed rl -c "$CONFIG" --runs-dir "$RUNS" --from "$SFT" --algo seed --analyzer self --json

  # 4. both final models on every seen and unseen game (ordinary prompt, no skill)
  for algo in grpo seed; do
    RL=$(run_of "rl_$algo")
    pair "eval_${algo}_seen" seed eval -c "$CONFIG" --runs-dir "$RUNS" --from "$RL" --split seen --json \
      -- "eval_${algo}_unseen" seed eval -c "$CONFIG" --runs-dir "$RUNS" --from "$RL" --split unseen --json
  done
fi

# 5. the score shift of Stage-1's sampled tokens under ordinary vs skill context (the teacher pass, offline)
if [ "${REPORT_ONLY:-0}" != 1 ]; then record stage1_shift $PY scripts/method_check_report.py --runs "$RUNS" --shift-only; fi

# 6. the training curves of both runs on one plot, then the document (every number read from the run directories)
mkdir -p "$(dirname "$DOC")/method-check"
seed plot "$(run_of rl_grpo)" "$(run_of rl_seed)" --out "$RUNS/plots" > /dev/null
$PY scripts/method_check_report.py --runs "$RUNS" --out "$DOC"
echo "== done ($(( $(date +%s) - t0 ))s): $DOC"
