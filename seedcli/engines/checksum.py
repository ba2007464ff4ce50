"""Exact checksums of weight tensors, to prove a rollout engine holds the trainer's weights after a refresh.

A probe of log-probs cannot do this at the paper's learning rate: one update at lr 1e-6 moves them ~3e-4, far below
the noise between a bf16 engine and the trainer. Instead both sides checksum the raw bits of a few tensors in the
engine's dtype (the trainer casts its fp32 master weights the way the refresh does): any skipped or partial refresh
changes a checksum whenever the update changed any of those bits. Integer arithmetic (wrapping int64) makes the
result independent of device, chunking and summation order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

CHUNK = 1 << 24  # elements per step: bounds the int64 temporaries (128 MB) on a 300M-element embedding

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def tensor_checksum(t: torch.Tensor) -> list[int]:
    """[numel, Σ bits, Σ bits·(i mod 65521 + 1)] of the tensor's raw bits in its own dtype (wrapping int64): equal
    checksums mean, with overwhelming probability, bit-identical tensors of the same dtype and shape order."""
    flat = t.detach().contiguous().reshape(-1)
    bits = flat.view(_INT_VIEW[flat.element_size()])
    s1 = torch.zeros((), dtype=torch.int64, device=flat.device)
    s2 = torch.zeros((), dtype=torch.int64, device=flat.device)
    for start in range(0, bits.numel(), CHUNK):
        chunk = bits[start : start + CHUNK].to(torch.int64)
        weight = torch.arange(start, start + chunk.numel(), device=flat.device, dtype=torch.int64) % 65521 + 1
        s1 += chunk.sum()
        s2 += (chunk * weight).sum()
    return [int(flat.numel()), int(s1.item()), int(s2.item())]


# Hugging Face name → (vLLM parameter name, which slice of the fused parameter holds it)
def _fused(name: str) -> tuple[str, str | None]:
    for part, fused in (("q_proj", "qkv_proj"), ("k_proj", "qkv_proj"), ("v_proj", "qkv_proj")):
        if f".self_attn.{part}." in name:
            return name.replace(part, fused), part
    for part in ("gate_proj", "up_proj"):
        if f".mlp.{part}." in name:
            return name.replace(part, "gate_up_proj"), part
    return name, None


def checksum_names(num_layers: int, linear: bool = True) -> list[str]:
    """The weights checked after each refresh: the embedding (every token), the first layer's attention and the
    last layer's MLP (both ends of the stack), the final norm and the lm_head. `linear=False` keeps to weights
    every back end stores unchanged (vLLM's CPU backend repacks linear layers for its GEMM kernels)."""
    last = num_layers - 1
    names = ["model.embed_tokens.weight", "model.norm.weight", f"model.layers.{last}.post_attention_layernorm.weight"]
    if linear:
        names += [
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.self_attn.v_proj.weight",
            f"model.layers.{last}.mlp.down_proj.weight",
        ]
    else:
        names += ["model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.v_proj.bias"]
    # a tied lm_head is checked too where the engine keeps its own copy (vLLM CPU); where it shares the embedding's
    # parameter (vLLM on GPU), the engine does not list it and it is compared through the embedding
    names.append("lm_head.weight")
    return names


# A vision-language model (Qwen2.5-VL) keeps its text stack under `model.language_model.` and its vision tower under
# `model.visual.` in transformers; vLLM names them `language_model.model.`, `visual.` and `language_model.lm_head.`.
_VL_TO_VLLM = (
    ("model.language_model.", "language_model.model."),
    ("model.visual.", "visual."),
    ("lm_head.", "language_model.lm_head."),
)


def vision_checksum_names(num_layers: int, linear: bool = True) -> list[str]:
    """`checksum_names` for a vision-language model: the text stack's tensors under its transformers names, and
    the vision tower's first block norm and merger norm (plus, where linear weights are comparable, the first
    block's fused qkv), so a refresh that skips the vision tower fails the check."""
    text = [
        name if name == "lm_head.weight" else name.replace("model.", "model.language_model.", 1)
        for name in checksum_names(num_layers, linear)
    ]
    vision = ["model.visual.blocks.0.norm1.weight", "model.visual.merger.ln_q.weight"]
    if linear:
        vision.append("model.visual.blocks.0.attn.qkv.weight")
    return text + vision


def names_for_config(config, linear: bool = True) -> list[str]:
    """The checked tensor names of a model with Hugging Face `config` (text or vision-language)."""
    if getattr(config, "vision_config", None) is not None:
        text = getattr(config, "text_config", None) or config
        return vision_checksum_names(text.num_hidden_layers, linear)
    return checksum_names(config.num_hidden_layers, linear)


def vllm_name(name: str, vision: bool) -> str:
    """vLLM's parameter name for a transformers name (the same for a text model)."""
    if vision:
        for hf, vl in _VL_TO_VLLM:
            if name.startswith(hf):
                return vl + name[len(hf) :]
    return name


def trainer_checksums(named: Iterable[tuple[str, torch.Tensor]], names: Sequence[str], dtype: torch.dtype) -> dict:
    """Checksums of the tensors in `names` from (name, tensor) pairs, cast to the engine's `dtype` as the refresh
    sends them."""
    wanted = set(names)
    return {n: tensor_checksum(t.to(dtype)) for n, t in named if n in wanted}


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
