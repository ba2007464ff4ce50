"""The checkpoints that let a run stop and continue (docs/design.md §1, Stage 2): `checkpoints/step_NNNNNN/` with the
actor in Hugging Face format, the optimizer, the fp32 master weights when the model is saved in a lower precision,
every rank's RNG state and state.json (sampler position, non-finite streak, the update's metrics); `latest` points
at the newest. A resumed run restores the optimizer and the RNG states and continues exactly. Under `lora=true`
model/ is the merged model and adapter/ beside it holds the adapter in fp32, which a resume loads onto the starting
model; the optimizer state is the adapter's.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from seedcli.config import RLConfig
from seedcli.rl.distributed import DistInfo, all_gather_object, barrier, full_state_dict, reshard
from seedcli.rl.lora import ADAPTER_DIR, adapter_state, base_model, is_lora, merged_params, save_adapter

CHECKPOINTS = "checkpoints"


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def checkpoint_dtype(cfg: RLConfig, info: DistInfo) -> torch.dtype:
    """dtype of the checkpoints' model weights: bf16 on GPU (what vLLM serves them in; half the disk), fp32 on CPU."""
    if cfg.checkpoint_dtype == "auto":
        return torch.bfloat16 if info.device.type == "cuda" else torch.float32
    return getattr(torch, cfg.checkpoint_dtype)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: Path,
    step: int,
    *,
    lm: torch.nn.Module,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    train_module: torch.nn.Module,
    info: DistInfo,
    state: dict[str, Any],
    keep: int = 0,
    model_dtype: torch.dtype = torch.float32,
    processor: Any = None,
) -> Path:
    """`root/step_NNNNNN/` with model/ (HF format + tokenizer, in `model_dtype`: bf16 on GPU, what eval and vLLM
    load), the optimizer, the fp32 master weights when the model is saved in a lower precision (so a resume
    continues exactly), every rank's RNG state and state.json; written into a temporary directory and renamed, then
    `root/latest` moves to it. Every rank calls it. `keep` > 0 deletes all but the newest `keep` checkpoints."""
    reshard(train_module)  # state dicts must see the sharded parameters the optimizer holds
    root = Path(root)
    final = root / step_dir_name(step)
    tmp = root / f".tmp_{step_dir_name(step)}"
    if info.is_main:
        if tmp.exists():
            shutil.rmtree(tmp)
        (tmp / "model").mkdir(parents=True)
    barrier(info)

    lossy = model_dtype != torch.float32
    if is_lora(lm):
        _save_lora(tmp, lm, optimizer, train_module, info, model_dtype)
    elif info.fsdp:
        sd = full_state_dict(lm, keep=info.is_main, dtype=model_dtype)  # collective: every rank gathers, rank 0 keeps
        if info.is_main:
            _save_hf_state_dict(lm, sd, tmp / "model", model_dtype)
        del sd
        import torch.distributed.checkpoint as dcp  # FSDP only; importing it takes a second
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        blob = {"optimizer": get_optimizer_state_dict(train_module, optimizer)}
        if lossy:  # the sharded fp32 master weights, for an exact resume
            blob["model"] = get_model_state_dict(train_module)
        dcp.save(blob, checkpoint_id=str(tmp / "optimizer"))
    elif info.is_main:
        if lossy:
            lm.save_pretrained(
                tmp / "model",
                safe_serialization=True,
                state_dict={k: v.to(model_dtype) for k, v in lm.state_dict().items()},
            )
            _set_config_dtype(tmp / "model", model_dtype)
            torch.save({k: v.detach().cpu() for k, v in lm.state_dict().items()}, tmp / "master.pt")
        else:
            lm.save_pretrained(tmp / "model", safe_serialization=True)
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    rngs = all_gather_object(rng_state(), info)
    if info.is_main:
        tokenizer.save_pretrained(tmp / "model")
        if processor is not None:  # a vision-language policy's image processor travels with its weights
            processor.save_pretrained(tmp / "model")
        torch.save(rngs, tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2, default=float))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _point(root / "latest", final.name)
        if keep > 0:
            for old in sorted(root.glob("step_*"))[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    barrier(info)
    return final


def _save_lora(
    tmp: Path,
    lm: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    train_module: torch.nn.Module,
    info: DistInfo,
    model_dtype: torch.dtype,
) -> None:
    """A LoRA actor's checkpoint (rl/lora.py): model/ the merged model in `model_dtype` (what eval and the engine of
    a resumed run load), adapter/ PEFT's adapter files in fp32 (the trained weights a resume continues from: the base
    is the starting model's, frozen) and the adapter's optimiser state (DCP under FSDP). Every rank calls it."""
    merged = {}
    for name, tensor in merged_params(lm):  # collective under FSDP: every rank gathers, rank 0 keeps
        if info.is_main:
            merged[name] = tensor.detach().to(model_dtype).cpu()
    adapter = adapter_state(lm, keep=info.is_main)
    if info.is_main:
        _save_hf_state_dict(base_model(lm), merged, tmp / "model", model_dtype)
        save_adapter(lm, adapter, tmp / ADAPTER_DIR)
    del merged
    if info.fsdp:
        import torch.distributed.checkpoint as dcp  # FSDP only; importing it takes a second
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        dcp.save({"optimizer": get_optimizer_state_dict(train_module, optimizer)}, checkpoint_id=str(tmp / "optimizer"))
    elif info.is_main:
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")


def _save_hf_state_dict(
    lm: torch.nn.Module, sd: dict[str, torch.Tensor], out: Path, dtype: torch.dtype = torch.float32
) -> None:
    """A gathered state dict in Hugging Face format (safetensors + config), for the FSDP path."""
    cfg = lm.config
    if getattr(cfg, "tie_word_embeddings", False):
        sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}
    save_file({k: v.contiguous() for k, v in sd.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(out)
    _set_config_dtype(out, dtype)
    if getattr(lm, "generation_config", None) is not None:
        lm.generation_config.save_pretrained(out)


def _set_config_dtype(model_dir: Path, dtype: torch.dtype) -> None:
    """Record the saved weights' dtype in config.json (vLLM and transformers load in it)."""
    path = Path(model_dir) / "config.json"
    cfg = json.loads(path.read_text())
    name = str(dtype).removeprefix("torch.")
    cfg["dtype"] = name
    cfg.pop("torch_dtype", None)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _point(link: Path, target: str) -> None:
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint (state.json written) under `root`, or None."""
    root = Path(root)
    link = root / "latest"
    if link.is_symlink() and (link.resolve() / "state.json").exists():
        candidates = [link.resolve()]
    else:
        candidates = []
    candidates += [d for d in root.glob("step_*") if (d / "state.json").exists()]
    if not candidates:
        return None
    return max(candidates, key=lambda d: int(d.name.split("_")[-1]))


def read_checkpoint_state(ckpt: Path) -> dict[str, Any]:
    return json.loads((Path(ckpt) / "state.json").read_text())


def load_optimizer_and_rng(
    ckpt: Path, optimizer: torch.optim.Optimizer, train_module: torch.nn.Module, info: DistInfo
) -> None:
    """Restore the optimizer state and this rank's RNG state from a checkpoint (weights are loaded with the model)."""
    ckpt = Path(ckpt)
    reshard(train_module)
    if info.fsdp:
        import torch.distributed.checkpoint as dcp  # FSDP only; importing it takes a second
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        sd = {"optimizer": get_optimizer_state_dict(train_module, optimizer)}
        metadata = dcp.FileSystemReader(str(ckpt / "optimizer")).read_metadata()
        has_master = any(key.startswith("model.") for key in metadata.state_dict_metadata)
        if has_master:  # the model/ weights are bf16: restore the fp32 master weights they were cast from
            sd["model"] = get_model_state_dict(train_module)
        dcp.load(sd, checkpoint_id=str(ckpt / "optimizer"))
        if has_master:
            set_model_state_dict(train_module, sd["model"])
        set_optimizer_state_dict(train_module, optimizer, sd["optimizer"])
    else:
        if (ckpt / "master.pt").exists():
            master = torch.load(ckpt / "master.pt", map_location=info.device, weights_only=True)
            getattr(train_module, "module", train_module).lm.load_state_dict(master)
        optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", map_location=info.device, weights_only=False))
    rngs = torch.load(ckpt / "rng.pt", weights_only=False)
    set_rng_state(rngs[info.rank] if info.rank < len(rngs) else rngs[0])
