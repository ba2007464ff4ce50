"""Expected per-GPU memory of `seed rl` for a model shape and a config, before anything is launched.

`bench/memory_plan.py` prints it; the GPU smoke compares it with what it measures. The model (DESIGN.md §5): FSDP2
shards the fp32 master weights, their gradients (reduce-scattered every micro-batch) and AdamW's two moments over
the ranks; the frozen reference is sharded in bf16; one decoder layer at a time is gathered in bf16 (two with
prefetch) plus the root group (embeddings, lm_head), which a trainable model keeps gathered from forward to
backward. Activations are bf16; without gradient checkpointing every layer keeps its intermediates, with it only
each layer's input is kept and one layer is recomputed at a time. Log-probs are formed `chunk_tokens` at a time in
fp32. The colocated vLLM engine takes `vllm_gpu_memory` of the card while it generates and ~nothing after a level-2
sleep. Figures are estimates (±15%): allocator fragmentation and NCCL buffers come on top of the fixed overhead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3
CUDA_OVERHEAD_GIB = 2.0  # CUDA context, NCCL buffers, cuBLAS workspaces: measured ~1.5-2.5 GiB per rank


@dataclass(frozen=True)
class Shape:
    """What memory depends on in a Qwen2-style model."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_params(self) -> int:
        h, kv = self.hidden, self.kv_heads * self.head_dim
        attn = h * h + 2 * h * kv + h + 2 * kv + h * h  # q, k, v (with biases), o
        mlp = 3 * h * self.intermediate
        return attn + mlp + 2 * h  # two RMSNorms

    @property
    def root_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    @classmethod
    def from_config(cls, cfg: dict) -> Shape:
        return cls(
            hidden=cfg["hidden_size"],
            intermediate=cfg["intermediate_size"],
            layers=cfg["num_hidden_layers"],
            heads=cfg["num_attention_heads"],
            kv_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
            vocab=cfg["vocab_size"],
            tied=bool(cfg.get("tie_word_embeddings", False)),
        )

    @classmethod
    def load(cls, name_or_dir: str) -> Shape:
        """A preset name (`qwen2.5-3b-shape`) or a model directory with config.json."""
        from seedcli.engines.tiny import FULL_SHAPES

        if name_or_dir in FULL_SHAPES:
            s = dict(FULL_SHAPES[name_or_dir])
            return cls.from_config({**s, "vocab_size": s["vocab_size"]})
        return cls.from_config(json.loads((Path(name_or_dir) / "config.json").read_text()))


def activation_bytes_per_layer_token(s: Shape) -> int:
    """bf16 intermediates one decoder layer keeps for backward, per token: the two norms' inputs and their fp32
    upcasts, q/k/v, attention output, o_proj output and residual, gate, up, SiLU and the product."""
    kv = s.kv_heads * s.head_dim
    bf16 = 2 * (8 * s.hidden + 2 * kv + 4 * s.intermediate)
    fp32_norms = 2 * 4 * s.hidden
    return bf16 + fp32_norms


def plan(
    shape: Shape,
    *,
    gpus: int,
    micro_batch_tokens: int,
    gradient_checkpointing: bool,
    vllm_gpu_memory: float,
    card_gib: float,
    kl: bool = True,
    chunk_tokens: int = 1024,
) -> dict:
    """Per-GPU GiB by component and by phase, and whether each phase fits the card."""
    n = max(1, gpus)
    P = shape.params
    parts = {
        "master weights (fp32, sharded)": 4 * P / n,
        "AdamW moments (fp32, sharded)": 8 * P / n,
        "gradients (fp32, sharded)": 4 * P / n,
        "reference model (bf16, sharded)": (2 * P / n) if kl else 0.0,
        "gathered params (bf16: root + 2 layers)": 2 * (shape.root_params + 2 * shape.layer_params),
        "gathered layer gradient (fp32)": 4 * shape.layer_params,
        "log-prob chunk (fp32 logits ×3)": 3 * 4 * chunk_tokens * shape.vocab,
    }
    per_lt = activation_bytes_per_layer_token(shape)
    full_acts = shape.layers * micro_batch_tokens * per_lt
    ckpt_acts = shape.layers * micro_batch_tokens * 2 * shape.hidden + micro_batch_tokens * per_lt
    acts = ckpt_acts if gradient_checkpointing else full_acts
    parts["activations" + (" (checkpointed)" if gradient_checkpointing else "")] = acts
    overhead = CUDA_OVERHEAD_GIB * GIB
    resident = (
        sum(parts[k] for k in list(parts)[:4]) - parts["gradients (fp32, sharded)"]
    )  # grads freed between updates
    update = sum(parts.values())
    rollout = resident + vllm_gpu_memory * card_gib * GIB
    g = {k: v / GIB for k, v in parts.items()}
    phases = {
        "rollout (vLLM awake)": (rollout + overhead) / GIB,
        # no grad: one layer's intermediates at a time, the hidden states of the micro-batch, one logits chunk
        "re-scoring (no grad)": (resident + parts["gathered params (bf16: root + 2 layers)"]
                                 + micro_batch_tokens * (per_lt + 2 * shape.hidden)
                                 + parts["log-prob chunk (fp32 logits ×3)"] + overhead) / GIB,
        "update (forward+backward)": (update + overhead) / GIB,
    }  # fmt: skip
    return {
        "params_b": P / 1e9,
        "gpus": n,
        "card_gib": card_gib,
        "components_gib": g,
        "activations_gib": {"without checkpointing": full_acts / GIB, "with checkpointing": ckpt_acts / GIB},
        "phases_gib": phases,
        "fits": {k: v <= 0.95 * card_gib for k, v in phases.items()},
        "vllm_share_gib": vllm_gpu_memory * card_gib,
    }


def format_plan(p: dict, title: str) -> str:
    """A plain-text table of a plan."""
    lines = [f"{title}: {p['params_b']:.2f}B parameters, {p['gpus']} GPU(s) of {p['card_gib']:.0f} GiB", ""]
    lines.append(f"{'component (per GPU)':<44}{'GiB':>8}")
    for k, v in p["components_gib"].items():
        lines.append(f"{k:<44}{v:>8.2f}")
    a = p["activations_gib"]
    lines.append(
        f"{'  (activations without / with checkpointing)':<44}{a['without checkpointing']:>8.2f} / "
        f"{a['with checkpointing']:.2f}"
    )
    lines.append(f"{'vLLM share while generating':<44}{p['vllm_share_gib']:>8.2f}")
    lines.append("")
    lines.append(f"{'phase peak (incl. CUDA/NCCL overhead)':<44}{'GiB':>8}  fits")
    for k, v in p["phases_gib"].items():
        lines.append(f"{k:<44}{v:>8.2f}  {'yes' if p['fits'][k] else 'NO'}")
    return "\n".join(lines)
