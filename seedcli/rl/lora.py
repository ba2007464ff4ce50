"""LoRA in `seed rl` (`lora=true`, PEFT): only an adapter on the frozen starting model trains.

- The actor is the starting model with a LoRA adapter on its linear layers (`attach_adapter`); AdamW holds the
  adapter's parameters only. The frozen base is kept as the full-weight run keeps its KL reference: fp32 on a CPU in
  fp32, bf16 on a GPU (it is never updated, so fp32 master weights would buy nothing).
- The KL reference is the base model: the actor's own forward with the adapter switched off (`adapter_disabled`,
  `Scorer(reference=True)`), as verl does with LoRA; no second copy of the model. The OPD teacher stays π_old, the
  actor with its adapter, under the skill-augmented prompt.
- The rollout engine (hf or vLLM) holds the merged weights W + (α/r)·B·A, streamed after every update
  (`merged_params`: one linear layer at a time, gathered under FSDP), and the refresh proof checksums the engine's
  copies of merged weights the adapter changes (`proof_names`) against the trainer's merged view, exactly. The
  alternative, vLLM's own LoRA support (the adapter loaded into its LoRA slots), is measured in
  bench/lora_refresh.py and documented in docs/parity.md.
- A checkpoint holds model/ (the merged model, what eval and vLLM load), adapter/ (PEFT's files, fp32: the
  trained weights of a resume) and the adapter's optimiser state.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from seedcli.errors import UserError
from seedcli.rl import distributed as D

ADAPTER = "default"  # PEFT's name of the one adapter
PEFT_PREFIX = "base_model.model."  # PeftModel's state-dict prefix before the Hugging Face names
ADAPTER_DIR = "adapter"
ADAPTER_FILE = "adapter_model.safetensors"


def is_lora(lm: Any) -> bool:
    """Whether `lm` (a Hugging Face model, or a PEFT model) carries a LoRA adapter."""
    return hasattr(lm, "peft_config")


def _targets(spec: str) -> str | list[str]:
    return spec if spec == "all-linear" else [t.strip() for t in spec.split(",")]


def attach_adapter(base: torch.nn.Module, cfg: Any, adapter_dir: Path | None = None) -> torch.nn.Module:
    """The PEFT model of `base` with a LoRA adapter of `cfg` (lora_r, lora_alpha, lora_dropout, lora_target) on its
    linear layers: a fresh one (A drawn from a generator seeded by the run's seed alone, B zero, so the merged model
    starts as the base), or the adapter saved in `adapter_dir` (a resumed run). Only the adapter requires grad."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from peft.tuners.lora.layer import Linear as LoraLinear
    from peft.tuners.lora.layer import LoraLayer

    config = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=_targets(cfg.lora_target),
        task_type="CAUSAL_LM",
    )
    # the adapter's initial draw depends on the seed only, not on what consumed the global generator before it
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        try:
            lm = get_peft_model(base, config, adapter_name=ADAPTER)
        except ValueError as e:  # PEFT: "Target modules {...} not found in the base model"
            raise UserError(f"lora_target {cfg.lora_target}: {str(e).splitlines()[0]}") from None
    layers = [(n, m) for n, m in lm.named_modules() if isinstance(m, LoraLayer)]
    other = [n for n, m in layers if not isinstance(m, LoraLinear)]
    if other or not layers:
        raise UserError(
            f"lora_target {cfg.lora_target}: the adapter goes on linear layers only (got "
            f"{', '.join(other[:3]) or 'none'}); use all-linear or names such as q_proj,v_proj"
        )
    if adapter_dir is not None:
        from safetensors.torch import load_file

        path = Path(adapter_dir) / ADAPTER_FILE
        if not path.is_file():
            raise UserError(f"{adapter_dir}: no {ADAPTER_FILE}; this checkpoint was not written by a lora=true run")
        result = set_peft_model_state_dict(lm, load_file(str(path)), adapter_name=ADAPTER)
        unexpected = getattr(result, "unexpected_keys", None) or []
        if unexpected:
            raise UserError(
                f"{adapter_dir}: the saved adapter does not fit lora_target {cfg.lora_target} / lora_r {cfg.lora_r} "
                f"(unexpected {unexpected[:2]}); resume with the run's own LoRA settings"
            )
    for name, p in lm.named_parameters():
        p.requires_grad_(".lora_" in name)
    return lm


def base_model(lm: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model inside a PEFT model (itself otherwise): its config and generation config."""
    return lm.get_base_model() if hasattr(lm, "get_base_model") else lm


# --------------------------------------------------------------------------------------------- the KL reference


@contextlib.contextmanager
def adapter_disabled(layers: list[torch.nn.Module]) -> Iterator[None]:
    """Every LoRA layer in `layers` computes its base layer alone (the base model). PEFT's own `disable_adapter`
    also switches the adapter's requires_grad off and on, which DDP's and FSDP's gradient hooks must not see; the
    flag the LoRA forward reads is set directly instead."""
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer in layers:
            layer._disable_adapters = False


def lora_layers(lm: torch.nn.Module) -> list[torch.nn.Module]:
    from peft.tuners.lora.layer import LoraLayer

    return [m for m in lm.modules() if isinstance(m, LoraLayer)]


class AdapterOff:
    """The KL reference under LoRA: the actor's own scorer (`train_model`, as DDP or FSDP wrap it, so its forward
    gathers parameters like any other) with the adapter disabled. Called like a score function; its tokens are
    tallied by the actor's scorer."""

    def __init__(self, train_model: torch.nn.Module) -> None:
        self.train_model = train_model

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.train_model(*args, reference=True, **kwargs)

    @property
    def share_prefix(self) -> bool:
        return bool(getattr(D.unwrap(self.train_model), "share_prefix", False))

    def take_tally(self) -> list[int]:
        return [0, 0]


# --------------------------------------------------------------------------------------------- the merged view


def merge_weight(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """W + scaling·(B·A) in fp32: the merged weight of one LoRA linear layer (the one formula the refresh, the proof
    and the checkpoint's model/ use), in W's dtype."""
    delta = (b.float() @ a.float()) * scaling
    return (weight.float() + delta).to(weight.dtype)


def merged_params(lm: torch.nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, tensor) of the merged model, in `dtype`, one at a time: every base tensor, a LoRA layer's
    weight merged with its adapter (`merge_weight`). Under FSDP each tensor is gathered when the consumer asks for it
    (a collective: every rank consumes the whole stream in the same order); a layer's weight waits for its A and B."""
    scaling = {name: float(module.scaling[ADAPTER]) for name, module in _named_lora_layers(lm)}
    pending: dict[str, dict[str, torch.Tensor]] = {}

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype) if dtype is not None and t.is_floating_point() else t

    for raw, tensor in D.iter_full_params(lm):
        name = raw.removeprefix(PEFT_PREFIX)
        if ".base_layer." in name:
            module, leaf = name.split(".base_layer.", 1)
            if leaf != "weight":  # a bias passes as it is
                yield f"{module}.{leaf}", cast(tensor)
                continue
            pending.setdefault(module, {})["w"] = tensor
        elif m := re.match(rf"(.+)\.lora_([AB])\.{ADAPTER}\.weight$", name):
            pending.setdefault(m.group(1), {})[m.group(2)] = tensor
            module = m.group(1)
        else:
            yield name, cast(tensor)
            continue
        parts = pending[module]
        if len(parts) == 3:
            del pending[module]
            yield f"{module}.weight", cast(merge_weight(parts["w"], parts["A"], parts["B"], scaling[module]))
    if pending:
        raise RuntimeError(f"LoRA layers without their base weight or adapter: {sorted(pending)[:3]}")


def merged_names(lm: torch.nn.Module) -> list[str]:
    """The Hugging Face names of the weights the adapter changes (every LoRA layer's), in model order."""
    return [f"{name}.weight" for name, _ in _named_lora_layers(lm)]


def _named_lora_layers(lm: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(Hugging Face name, layer) of every LoRA layer that holds the adapter."""
    from peft.tuners.lora.layer import LoraLayer

    return [
        (name.removeprefix(PEFT_PREFIX), m)
        for name, m in lm.named_modules()
        if isinstance(m, LoraLayer) and ADAPTER in m.lora_A
    ]


def proof_names(lm: torch.nn.Module) -> list[str]:
    """The merged weights the refresh proof checksums beside the usual ones: every adapted weight of the first and the
    last decoder layer (both ends of the stack, each kind of targeted module), so that an engine left with a stale
    adapter, or with the base weights, fails the proof."""
    names = merged_names(lm)
    index = {n: int(m.group(1)) for n in names if (m := re.search(r"\.layers\.(\d+)\.", n))}
    if not index:
        return names[:1] + names[-1:]
    ends = (min(index.values()), max(index.values()))
    return [n for n in names if index.get(n) in ends]


# --------------------------------------------------------------------------------------------- checkpoints


def adapter_state(lm: torch.nn.Module, keep: bool = True) -> dict[str, torch.Tensor]:
    """The adapter's tensors (PEFT's state-dict names, fp32, on the CPU), gathered under FSDP (a collective: every
    rank calls it; `keep=False` keeps nothing)."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, value in lm.state_dict().items():
        if ".lora_" not in name:
            continue
        if isinstance(value, DTensor):
            value = value.full_tensor()
        if keep:
            out[name] = value.detach().float().cpu().contiguous()
    return out


def save_adapter(lm: torch.nn.Module, state: dict[str, torch.Tensor], out: Path) -> None:
    """PEFT's adapter files (adapter_config.json, adapter_model.safetensors) of `state` in `out`, byte for byte the
    same for the same adapter: PEFT writes the target modules it found from a set (in an order that changes with
    Python's string hashing) and a model card template; the list is sorted and the card left out."""
    out = Path(out)
    lm.save_pretrained(str(out), state_dict=state, safe_serialization=True)
    (out / "README.md").unlink(missing_ok=True)
    path = out / "adapter_config.json"
    config = json.loads(path.read_text())
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
