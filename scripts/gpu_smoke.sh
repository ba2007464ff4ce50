#!/usr/bin/env bash
# First thing to run on any GPU machine: two SEED updates on one GPU with a small model built in code, the vLLM
# engine (colocated, sleep mode), FSDP over the actor, and the weight-refresh probe. Prints every check it makes and
# exits non-zero on the first failure. Takes a few minutes (most of it vLLM start-up).
#   bash scripts/gpu_smoke.sh                 # uses .venv/bin/python if present
#   PYTHON=python bash scripts/gpu_smoke.sh   # another interpreter
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export ALFWORLD_DATA=${ALFWORLD_DATA:-$( [ -d ../shared/alfworld ] && cd ../shared/alfworld && pwd || echo "" )}
exec "$PYTHON" scripts/gpu_smoke.py "$@"
