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
        if t.numel() == 0:
            continue  # the weight lives elsewhere in a kernel-specific form (vLLM CPU's repacked GEMM weights)
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
