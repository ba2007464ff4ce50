#!/usr/bin/env bash
# First thing to run on any GPU machine (after `GPU=1 make install`): `seed rl --gpus 2` (or 1) with the
# self-analyzer, unequal rank shares, bf16 vLLM with sleep mode, lr 1e-6 and exact weight checksums after every
# refresh; a tiny vision-language policy (Qwen2.5-VL) on visual Sokoban through vLLM, trained with OPD on an annotate
# run's static skills (opd/token_frac > 0 required); then one update of a Qwen2.5-3B-shaped model at the paper's
# micro-batch size with memory and time per phase beside the memory plan. One table; results.json; exit 1 on any
# failed check. Under 10 minutes.
#   bash scripts/gpu_smoke.sh                   # uses .venv/bin/python if present
#   bash scripts/gpu_smoke.sh --untied          # also Qwen2.5-7B's untied shape (~60 GiB)
#   PYTHON=python bash scripts/gpu_smoke.sh     # another interpreter
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export ALFWORLD_DATA=${ALFWORLD_DATA:-$( [ -d ../shared/alfworld ] && cd ../shared/alfworld && pwd || echo "" )}
exec "$PYTHON" scripts/gpu_smoke.py "$@"
