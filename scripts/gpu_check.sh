#!/usr/bin/env bash
# The GPU check a bare CUDA machine can run (Python 3.12, torch and transformers installed; no vLLM, no network, at
# most 64 MiB carried to it): one `seed rl` update of a Qwen2.5-3B-shaped model in bf16 with the hf engine, one-rank
# FSDP, gradient checkpointing and static skills (the OPD teacher pass runs), on text Sokoban (no data files), then a
# table of memory per phase beside the memory plan, time per phase and tokens per second, and the checks; exit 1 on a
# failed check. Under 8 minutes on one H200. The steps and sizes are in scripts/gpu_check.py.
#   here, once:        bash scripts/gpu_check_wheels.sh .whl    # seedcli's missing dependencies (<= 48 MiB)
#   on the GPU:        bash scripts/gpu_check.sh --wheels .whl  # pip --no-index --target, then PYTHONPATH
#   here, on CPU:      bash scripts/gpu_check.sh --cpu          # the same steps on a tiny model (a test runs it)
#   more options:      bash scripts/gpu_check.sh --help         # --out DIR, --keep, --preset NAME, --results FILE,
#                                                               # --no-checkpoint (no ~54 GB rl checkpoint)
#   PYTHON=python3 bash scripts/gpu_check.sh ...                # another interpreter (default: .venv/bin/python, else python3)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)  # paths given as options stay relative to where it is called from
PYTHON=${PYTHON:-$( [ -x "$REPO/.venv/bin/python" ] && echo "$REPO/.venv/bin/python" || echo python3 )}
WHEELS=""
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS=${2:?--wheels needs a folder of wheels}; shift 2 ;;
    --wheels=*) WHEELS=${1#--wheels=}; shift ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
if [ -n "$WHEELS" ]; then
  SITE=${GPU_CHECK_SITE:-/tmp/seed-gpu-check-site}
  shopt -s nullglob
  wheels=("$WHEELS"/*.whl)
  shopt -u nullglob
  if [ ${#wheels[@]} -eq 0 ]; then
    echo "gpu_check: no wheels in $WHEELS (make them where pip works: bash scripts/gpu_check_wheels.sh DIR)" >&2
    exit 2
  fi
  rm -rf "$SITE"
  echo "  \$ $PYTHON -m pip install -q --no-index --no-deps --no-compile --target $SITE $WHEELS/*.whl (${#wheels[@]} wheels)"
  "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "${wheels[@]}"
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
# seedcli runs from the checkout (`python -m seedcli`), installed or not
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" "$REPO/scripts/gpu_check.py" ${ARGS[@]+"${ARGS[@]}"}
