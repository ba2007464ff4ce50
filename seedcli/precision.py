"""Numeric precision on CPU and GPU: which dtype a stage computes in, and the one way it does so.

    dtype = compute_dtype(cfg.dtype, device)      # "auto" → bf16 on a GPU or a CPU with bf16 instructions, else fp32
    with autocast(dtype, device):                 # matmuls in bf16 over fp32 master weights; a no-op in fp32
        logits = model(...)

The policy that holds everywhere (docs/precision.md says why):
- weights that are trained stay fp32 (master weights), and so do AdamW's two moments: at lr 1e-6 an update is below
  bf16's resolution of a weight (2^-8 relative), so bf16 masters would round most updates away;
- the forward and backward matmuls run in bf16 under `torch.autocast` (AVX512-BF16 or AMX on CPU, tensor cores on GPU);
- frozen copies that only score or generate (the rollout engine, the KL reference) hold bf16 weights: no cast per
  call, half the memory;
- the loss arithmetic is fp32 whatever the compute dtype: the trainer's log-softmax, entropy, ratios, KL and the OPD
  gate read fp32 logits (`rl/logprobs.py` upcasts each chunk before its log-softmax).

`SEEDCLI_DTYPE=float32` (or bfloat16) overrides what "auto" resolves to: the test suite pins fp32 with it, so that its
bit-exact comparisons hold, and sets bf16 explicitly where bf16 is what it tests.
"""

from __future__ import annotations

import contextlib
import os
from functools import lru_cache
from typing import Any

DTYPE_NAMES = ("auto", "float32", "bfloat16")
_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16"}
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of CPUs with native bf16 matmul instructions
ENV_OVERRIDE = "SEEDCLI_DTYPE"


def normalise(name: str | None) -> str:
    """'auto', 'float32' or 'bfloat16' from a config value (fp32 and bf16 are accepted spellings)."""
    value = (name or "auto").strip().lower()
    value = _ALIASES.get(value, value)
    if value not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {name!r}; use auto, float32 (fp32) or bfloat16 (bf16)")
    return value


@lru_cache(maxsize=1)
def cpu_bf16_flags() -> tuple[str, ...]:
    """The bf16 instruction flags this CPU reports (empty off Linux or on a CPU without them)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return tuple(flag for flag in CPU_BF16_FLAGS if flag in flags)
    except OSError:
        pass
    return ()


def auto_dtype(device: Any) -> str:
    """What "auto" means on `device`: bf16 on CUDA (when supported) and on a CPU with bf16 instructions, else fp32;
    $SEEDCLI_DTYPE, when set, wins."""
    forced = os.environ.get(ENV_OVERRIDE)
    if forced:
        value = normalise(forced)
        if value != "auto":
            return value
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    if kind == "cuda":
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if cpu_bf16_flags() else "float32"


def compute_dtype_name(name: str | None, device: Any) -> str:
    """The dtype a stage computes in: `name` unless it is auto, then `auto_dtype(device)`."""
    value = normalise(name)
    return auto_dtype(device) if value == "auto" else value


def compute_dtype(name: str | None, device: Any):
    """`compute_dtype_name` as a torch dtype."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[compute_dtype_name(name, device)]


def autocast(dtype: Any, device: Any):
    """bf16 autocast on `device` when `dtype` is bf16 (matmuls in bf16, the weights untouched); otherwise nothing."""
    import torch

    if dtype != torch.bfloat16:
        return contextlib.nullcontext()
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    return torch.autocast(device_type=kind, dtype=torch.bfloat16)
