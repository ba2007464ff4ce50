"""The weights as vLLM's worker holds them: its parameter names for transformers' (fused q/k/v and gate/up, a
vision-language model's prefixes) and the checksums of its own tensors under Hugging Face names, read inside the
worker, which prove a weight refresh landed (rl/weight_sync.py compares them with the trainer's)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from seedcli.engines.base import tensor_checksum

if TYPE_CHECKING:
    import torch


# Hugging Face name → (vLLM parameter name, which slice of the fused parameter holds it)
def _fused(name: str) -> tuple[str, str | None]:
    for part, fused in (("q_proj", "qkv_proj"), ("k_proj", "qkv_proj"), ("v_proj", "qkv_proj")):
        if f".self_attn.{part}." in name:
            return name.replace(part, fused), part
    for part in ("gate_proj", "up_proj"):
        if f".mlp.{part}." in name:
            return name.replace(part, "gate_up_proj"), part
    return name, None


# A vision-language model (Qwen2.5-VL) keeps its text stack under `model.language_model.` and its vision tower under
# `model.visual.` in transformers; vLLM names them `language_model.model.`, `visual.` and `language_model.lm_head.`.
_VL_TO_VLLM = (
    ("model.language_model.", "language_model.model."),
    ("model.visual.", "visual."),
    ("lm_head.", "language_model.lm_head."),
)


def vllm_name(name: str, vision: bool) -> str:
    """vLLM's parameter name for a transformers name (the same for a text model)."""
    if vision:
        for hf, vl in _VL_TO_VLLM:
            if name.startswith(hf):
                return vl + name[len(hf) :]
    return name


def vllm_checksums(model: torch.nn.Module, names: Sequence[str]) -> dict[str, list[int]]:
    """Runs inside the vLLM worker (`LLM.apply_model`): checksums of its own parameters under Hugging Face names.
    Fused q/k/v and gate/up parameters are split at the sizes the model config gives; vocabulary padding is cut."""
    params = dict(model.named_parameters())
    cfg = _text_config(model)
    vision = any(n.startswith("visual.") for n in params)
    out: dict[str, list[int]] = {}
    for name in names:
        vname, part = _fused(vllm_name(name, vision))
        p = params.get(vname)
        if p is None:
            continue
        t = p.data
        if t.numel() == 0:  # the weight lives elsewhere in a kernel-specific form (vLLM CPU's repacked GEMM weights)
            t = getattr(_owner(model, vname), KEPT, None)  # ... unless the layer kept what it packed (`keep_packed`)
            if t is None:
                continue
        if part is not None:
            sizes = _fused_sizes(cfg, part, name.endswith(".bias"))
            if sizes is None or t.shape[0] != sum(sizes.values()):
                continue  # another layout (tensor parallel shard, repacked): not comparable
            start = 0
            for key, size in sizes.items():
                if key == part:
                    t = t[start : start + size]
                    break
                start += size
        elif name.endswith("embed_tokens.weight") or name.endswith("lm_head.weight"):
            t = t[: cfg.vocab_size]
        out[name] = tensor_checksum(t)
    return out


# vLLM's CPU backend packs each linear layer's weight for its GEMM kernels (oneDNN) when the layer is loaded or
# reloaded and drops the plain tensor, so the proof could not read it. A layer whose vLLM prefix begins with one of
# `keep_packed`'s keeps a copy of the tensor it packed, taken inside the engine at that moment (after the weight
# loader assembled it, fused q/k/v included): what its kernels compute with, and stale if a refresh never reached it.
KEPT = "_seedcli_packed_from"
_KEEP_PREFIXES: set[str] = set()


def keep_packed(prefixes: Sequence[str]) -> None:
    """In the process the vLLM worker runs in (the in-process engine's), before it loads: the linear layers under
    `prefixes` (vLLM names, e.g. "model.layers.0.") keep the weight they pack, from the first load on. Wraps vLLM's
    CPU GEMM dispatch once."""
    from vllm.model_executor.layers import utils

    _KEEP_PREFIXES.update(prefixes)
    dispatch = utils.dispatch_cpu_unquantized_gemm
    if getattr(dispatch, "seedcli_keeps", False):
        return

    def keeping(layer, remove_weight):
        weight = getattr(layer, "weight", None)
        prefix = str(getattr(layer, "prefix", "") or "")
        if remove_weight and weight is not None and not weight.is_meta and prefix.startswith(tuple(_KEEP_PREFIXES)):
            setattr(layer, KEPT, weight.detach().clone())
        return dispatch(layer, remove_weight)

    keeping.seedcli_keeps = True  # type: ignore[attr-defined]
    utils.dispatch_cpu_unquantized_gemm = keeping


def _owner(model: torch.nn.Module, param_name: str):
    """The module holding the parameter `param_name` (None when there is no such module)."""
    try:
        return model.get_submodule(param_name.rsplit(".", 1)[0])
    except AttributeError:
        return None


def _text_config(model: torch.nn.Module):
    cfg = getattr(model, "config", None)
    return getattr(cfg, "text_config", cfg) if cfg is not None else None


def _fused_sizes(cfg, part: str, bias: bool) -> dict[str, int] | None:
    if cfg is None:
        return None
    if part in ("q_proj", "k_proj", "v_proj"):
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        q = cfg.num_attention_heads * head_dim
        kv = cfg.num_key_value_heads * head_dim
        return {"q_proj": q, "k_proj": kv, "v_proj": kv}
    return {"gate_proj": cfg.intermediate_size, "up_proj": cfg.intermediate_size}
