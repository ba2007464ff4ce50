"""Expected per-GPU memory of `seed rl` for a model shape and a config, before anything is launched.

`bench/memory_plan.py` prints it; the GPU smoke compares it with what it measures. The model (docs/design.md §5): FSDP2
shards the fp32 master weights, their gradients (reduce-scattered every micro-batch) and AdamW's two moments over
the ranks; the frozen reference is sharded in bf16; one decoder layer at a time is gathered in bf16 (two with
prefetch) plus the root group (embeddings, lm_head), which a trainable model keeps gathered from forward to
backward. Activations are bf16; without gradient checkpointing every layer keeps its intermediates, with it only
each layer's input is kept and one layer is recomputed at a time. Log-probs are formed `chunk_tokens` at a time in
fp32. The root group's gradient is reduce-scattered last, from an fp32 buffer of its full size. The colocated vLLM
engine takes `vllm_gpu_memory` of the card while it generates; a sleep frees its weights and KV cache but not its
CUDA-graph pool, which stays resident beside the trainer (`VLLM_GRAPH_POOL_GIB`). Start-up holds vLLM's share and
the full fp32 actor before FSDP shards it. Host memory per rank: the fp32 actor read before it moves to the GPU,
vLLM's weight backup in a level-1 sleep, rank 0's gathered checkpoint, and the process itself.
Figures are estimates (±15%): allocator fragmentation and NCCL buffers come on top of the fixed overhead.

A vision-language model (Qwen2.5-VL) adds its vision tower: its blocks are sharded, gathered and trained like the
decoder layers, its patch embedding and merger sit in the root group. Its activations are per patch (the tower runs
before the 2×2 merge), `images_per_micro_batch × patches_per_image` of them; the merged image tokens are already in
`micro_batch_tokens`. `image_patches` gives the patches of an image as Qwen's processor resizes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from seedcli.engines.tiny import FULL_SHAPES
from seedcli.engines.vision import VL_PRESETS, vl_config

GIB = 1024**3
CUDA_OVERHEAD_GIB = 2.0  # CUDA context, NCCL buffers, cuBLAS workspaces: measured ~1.5-2.5 GiB per rank
# vLLM's CUDA-graph pool, which a sleep (level 1 or 2) leaves resident (vLLM frees weights and KV cache only; see
# vllm-project/vllm#56373: "leaves graph executables and native CUDA graph pools resident"). vLLM logs its size at
# start-up ("Graph capturing finished in N secs, took X GiB"); reports run from a few hundred MiB for small dense
# models to 1.4 GiB (1,503,657,984 bytes) for a 1T-parameter MoE at TP8 with 256 sequences (vllm-project/vllm#47654).
# Assumed here for a ≤7B dense model and ≤64 sequences, an upper bound; the GPU smoke's mem/sleep/device_used_gib
# measures it. While vLLM is awake the pool is counted inside its `vllm_gpu_memory` share.
VLLM_GRAPH_POOL_GIB = 1.0
# One rank's process on the host: Python with torch, transformers and vLLM imported (0.5 GiB resident on CPU) plus
# the CUDA context's host side and pinned staging buffers: assumed.
HOST_PROCESS_GIB = 2.0


@dataclass(frozen=True)
class VisionShape:
    """What memory depends on in a Qwen2.5-VL vision tower (its `vision_config`)."""

    depth: int
    hidden: int
    intermediate: int
    heads: int
    out_hidden: int
    patch: int
    merge: int
    temporal_patch: int
    channels: int = 3

    @property
    def block_params(self) -> int:
        """One vision block: attention, SwiGLU MLP and two norms (the unit FSDP shards beside the decoder layers)."""
        h, i = self.hidden, self.intermediate
        attn = 3 * h * h + 3 * h + h * h + h  # fused qkv and proj, with biases
        mlp = 3 * h * i + 2 * i + h  # gate, up, down, with biases
        return attn + mlp + 2 * h  # two RMSNorms

    @property
    def root_params(self) -> int:
        """The patch embedding (a bias-free Conv3d) and the merger (RMSNorm, two linears over merge² patches)."""
        embed = self.hidden * self.channels * self.temporal_patch * self.patch * self.patch
        m = self.hidden * self.merge * self.merge
        return embed + self.hidden + m * m + m + m * self.out_hidden + self.out_hidden

    @property
    def params(self) -> int:
        return self.depth * self.block_params + self.root_params

    @classmethod
    def from_config(cls, cfg: dict) -> VisionShape:
        return cls(
            depth=cfg["depth"],
            hidden=cfg["hidden_size"],
            intermediate=cfg["intermediate_size"],
            heads=cfg["num_heads"],
            out_hidden=cfg["out_hidden_size"],
            patch=cfg.get("patch_size", 14),
            merge=cfg.get("spatial_merge_size", 2),
            temporal_patch=cfg.get("temporal_patch_size", 2),
            channels=cfg.get("in_channels", cfg.get("in_chans", 3)),
        )


@dataclass(frozen=True)
class Shape:
    """What memory depends on in a Qwen2-style model, with a Qwen2.5-VL vision tower when `vision` is set."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    vision: VisionShape | None = None

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
        """The FSDP root group: embeddings, final norm, an untied lm_head, and the vision tower's embed and merger."""
        text = self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden
        return text + (self.vision.root_params if self.vision else 0)

    @property
    def max_layer_params(self) -> int:
        """The largest unit FSDP gathers: a decoder layer, or a vision block if that were larger."""
        return max(self.layer_params, self.vision.block_params if self.vision else 0)

    @property
    def params(self) -> int:
        blocks = self.vision.depth * self.vision.block_params if self.vision else 0
        return self.layers * self.layer_params + blocks + self.root_params

    @classmethod
    def from_config(cls, cfg: dict) -> Shape:
        """From a config.json: a text model's, or a VLM's (text settings under `text_config` or at the top level as
        older Qwen2.5-VL files have them, the tower under `vision_config`)."""
        text = {**cfg, **(cfg.get("text_config") or {})}
        vision = cfg.get("vision_config")
        return cls(
            hidden=text["hidden_size"],
            intermediate=text["intermediate_size"],
            layers=text["num_hidden_layers"],
            heads=text["num_attention_heads"],
            kv_heads=text.get("num_key_value_heads", text["num_attention_heads"]),
            vocab=text["vocab_size"],
            tied=bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            vision=VisionShape.from_config(vision) if vision else None,
        )

    @classmethod
    def load(cls, name_or_dir: str) -> Shape:
        """A preset name (`qwen2.5-3b-shape`, `qwen2.5-vl-3b-shape`) or a model directory with config.json."""

        if name_or_dir in FULL_SHAPES:
            return cls.from_config(dict(FULL_SHAPES[name_or_dir]))
        if name_or_dir in VL_PRESETS:
            return cls.from_config(vl_config(name_or_dir).to_dict())  # what build_vl_model writes to config.json
        return cls.from_config(json.loads((Path(name_or_dir) / "config.json").read_text()))


def image_patches(height: int, width: int, *, min_pixels: int, max_pixels: int, patch: int = 14, merge: int = 2) -> int:
    """Patches the vision tower sees for one image (before the merge; tokens = patches / merge²): the image resized
    as Qwen2.5-VL's processor does (`smart_resize`: sides rounded to patch·merge, the area kept within the bounds)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    h, w = smart_resize(height, width, factor=patch * merge, min_pixels=min_pixels, max_pixels=max_pixels)
    return (h // patch) * (w // patch)


def activation_bytes_per_layer_token(s: Shape) -> int:
    """bf16 intermediates one decoder layer keeps for backward, per token: the two norms' inputs and their fp32
    upcasts, q/k/v, attention output, o_proj output and residual, gate, up, SiLU and the product."""
    return _layer_bytes(s.hidden, s.kv_heads * s.head_dim, s.intermediate)


def activation_bytes_per_block_patch(v: VisionShape) -> int:
    """The same per patch for one vision block (full-width k and v; windowed SDPA keeps no attention matrix)."""
    return _layer_bytes(v.hidden, v.hidden, v.intermediate)


def vision_edge_bytes_per_patch(v: VisionShape) -> int:
    """Per patch, outside the blocks: the pixels (fp32) and their bf16 copy the patch embedding keeps, and the
    merger's RMSNorm input and fp32 upcast and its two linears' inputs and GELU input (merge² patches a row)."""
    pixels = v.channels * v.temporal_patch * v.patch * v.patch
    merger = 2 * v.hidden + 4 * v.hidden + 2 * 3 * v.hidden  # norm input bf16 + fp32 upcast; 3 bf16 row tensors
    return 6 * pixels + merger


def _layer_bytes(hidden: int, kv: int, intermediate: int) -> int:
    bf16 = 2 * (8 * hidden + 2 * kv + 4 * intermediate)
    fp32_norms = 2 * 4 * hidden
    return bf16 + fp32_norms


def vision_activation_bytes(v: VisionShape, patches: int, gradient_checkpointing: bool) -> int:
    """What the tower keeps for backward over `patches` patches: every block's intermediates, or with checkpointing
    each block's input (bf16) plus one block recomputed at a time."""
    edge = patches * vision_edge_bytes_per_patch(v)
    per_block = patches * activation_bytes_per_block_patch(v)
    if gradient_checkpointing:
        return v.depth * patches * 2 * v.hidden + per_block + edge
    return v.depth * per_block + edge


def host_plan(shape: Shape, *, vllm_sleep_level: int = 2, checkpoint_bytes: int = 2) -> dict[str, float]:
    """Host memory (GiB) of one rank by phase: the actor read in fp32 before it moves to the GPU (transformers loads
    on the CPU first; the reference comes after it, in bf16), vLLM's weight backup while asleep (level 1 keeps a bf16
    copy in pinned memory, level 2 drops it), rank 0's model gathered for a checkpoint (`checkpoint_bytes` a
    parameter: bf16 on GPU), each beside the process itself (`HOST_PROCESS_GIB`); and the peak."""
    P = shape.params
    rows = {
        "start-up: actor read in fp32 before the GPU": 4 * P / GIB,
        f"vLLM asleep (level {vllm_sleep_level}): its weight backup": (2 * P if vllm_sleep_level == 1 else 0) / GIB,
        "checkpoint, rank 0: the model gathered": checkpoint_bytes * P / GIB,
    }
    rows["process (Python, torch, CUDA, vLLM)"] = HOST_PROCESS_GIB
    rows["peak per rank"] = HOST_PROCESS_GIB + max(v for k, v in rows.items() if not k.startswith("process"))
    return rows


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
    images_per_micro_batch: int = 0,
    patches_per_image: int = 0,
    vllm_graph_gib: float | None = None,
    vllm_sleep_level: int = 2,
) -> dict:
    """Per-GPU GiB by component and by phase, whether each phase fits the card, and host GiB per rank.

    `images_per_micro_batch` (default 0: a text policy) images of `patches_per_image` patches each (`image_patches`)
    go through the vision tower with every micro-batch; the re-scoring phase is costed with the same count.
    `vllm_graph_gib`: vLLM's CUDA-graph pool, resident while it sleeps (default `VLLM_GRAPH_POOL_GIB`, or 0 when
    `vllm_gpu_memory` is 0: an hf engine, no vLLM)."""
    if images_per_micro_batch and shape.vision is None:
        raise ValueError("images_per_micro_batch > 0 needs a vision-language shape (one with a vision_config)")
    if images_per_micro_batch and patches_per_image <= 0:
        raise ValueError("patches_per_image must be positive when there are images; see image_patches()")
    n = max(1, gpus)
    P = shape.params
    if vllm_graph_gib is None:
        vllm_graph_gib = VLLM_GRAPH_POOL_GIB if vllm_gpu_memory > 0 else 0.0
    parts = {
        "master weights (fp32, sharded)": 4 * P / n,
        "AdamW moments (fp32, sharded)": 8 * P / n,
        "gradients (fp32, sharded)": 4 * P / n,
        "reference model (bf16, sharded)": (2 * P / n) if kl else 0.0,
        "gathered params (bf16: root + 2 layers)": 2 * (shape.root_params + 2 * shape.max_layer_params),
        "gathered layer gradient (fp32)": 4 * shape.max_layer_params,
        "log-prob chunk (fp32 logits ×3)": 3 * 4 * chunk_tokens * shape.vocab,
        # FSDP2 reduce-scatters the root group (embeddings, lm_head) last, from an fp32 copy of its whole gradient
        "root gradient reduce-scatter buffer (fp32)": 4 * shape.root_params,
        "vLLM CUDA-graph pool (resident in sleep)": vllm_graph_gib * GIB,
    }
    per_lt = activation_bytes_per_layer_token(shape)
    full_acts = shape.layers * micro_batch_tokens * per_lt
    ckpt_acts = shape.layers * micro_batch_tokens * 2 * shape.hidden + micro_batch_tokens * per_lt
    acts = ckpt_acts if gradient_checkpointing else full_acts
    suffix = " (checkpointed)" if gradient_checkpointing else ""
    parts["activations" + suffix] = acts
    patches = images_per_micro_batch * patches_per_image
    vision_acts = {False: 0, True: 0}
    vision_nograd = 0
    tower = shape.vision
    if tower is not None:
        vision_acts = {ck: vision_activation_bytes(tower, patches, ck) for ck in (False, True)}
        # the recomputed text layer and vision block never coexist: summing them is a small over-estimate
        parts[f"vision tower activations{suffix}"] = vision_acts[gradient_checkpointing]
        # no grad: one block's intermediates, the patches' hidden states, the embedding and merger
        per_patch = activation_bytes_per_block_patch(tower) + 2 * tower.hidden + vision_edge_bytes_per_patch(tower)
        vision_nograd = patches * per_patch
    overhead = CUDA_OVERHEAD_GIB * GIB
    resident = (
        sum(parts[k] for k in list(parts)[:4]) - parts["gradients (fp32, sharded)"]
    )  # grads freed between updates
    update = sum(parts.values())
    other = update - acts - vision_acts[gradient_checkpointing]
    vllm_share = vllm_gpu_memory * card_gib * GIB  # the graph pool included while awake
    rollout = resident + vllm_share
    # the full fp32 actor on the GPU before fully_shard, then the full bf16 reference beside the sharded actor
    startup = vllm_share + max(4 * P, 4 * P / n + (2 * P if kl else 0))
    g = {k: v / GIB for k, v in parts.items()}
    phases = {
        "start-up (full fp32 actor + vLLM)": (startup + overhead) / GIB,
        "rollout (vLLM awake)": (rollout + overhead) / GIB,
        # no grad: one layer's intermediates at a time, the hidden states of the micro-batch, one logits chunk
        "re-scoring (no grad)": (resident + parts["gathered params (bf16: root + 2 layers)"]
                                 + micro_batch_tokens * (per_lt + 2 * shape.hidden) + vision_nograd
                                 + parts["log-prob chunk (fp32 logits ×3)"]
                                 + parts["vLLM CUDA-graph pool (resident in sleep)"] + overhead) / GIB,
        "update (forward+backward)": (update + overhead) / GIB,
    }  # fmt: skip
    return {
        "params_b": P / 1e9,
        "gpus": n,
        "card_gib": card_gib,
        "components_gib": g,
        "activations_gib": {"without checkpointing": full_acts / GIB, "with checkpointing": ckpt_acts / GIB},
        "vision_activations_gib": {"without checkpointing": vision_acts[False] / GIB,
                                   "with checkpointing": vision_acts[True] / GIB},
        "images": {"per_micro_batch": images_per_micro_batch, "patches_per_image": patches_per_image},
        "update_gib": {"without checkpointing": (other + full_acts + vision_acts[False] + overhead) / GIB,
                       "with checkpointing": (other + ckpt_acts + vision_acts[True] + overhead) / GIB},
        "phases_gib": phases,
        "fits": {k: v <= 0.95 * card_gib for k, v in phases.items()},
        "vllm_share_gib": vllm_gpu_memory * card_gib,
        "vllm_graph_pool_gib": vllm_graph_gib,
        "host_gib": host_plan(shape, vllm_sleep_level=vllm_sleep_level),
    }  # fmt: skip


def format_plan(p: dict, title: str) -> str:
    """A plain-text table of a plan."""
    lines = [f"{title}: {p['params_b']:.2f}B parameters, {p['gpus']} GPU(s) of {p['card_gib']:.0f} GiB", ""]
    lines.append(f"{'component (per GPU)':<44}{'GiB':>8}")
    for k, v in p["components_gib"].items():
        lines.append(f"{k:<44}{v:>8.2f}")
    rows = [("activations", p["activations_gib"])]
    if any(k.startswith("vision tower") for k in p["components_gib"]):
        rows.append(("vision", p["vision_activations_gib"]))
    rows.append(("update peak", p["update_gib"]))
    for name, a in rows:
        label = f"  ({name} without / with checkpointing)"
        lines.append(f"{label:<44}{a['without checkpointing']:>8.2f} / {a['with checkpointing']:.2f}")
    lines.append(f"{'vLLM share while generating':<44}{p['vllm_share_gib']:>8.2f}")
    lines.append("")
    lines.append(f"{'phase peak (incl. CUDA/NCCL overhead)':<44}{'GiB':>8}  fits")
    for k, v in p["phases_gib"].items():
        lines.append(f"{k:<44}{v:>8.2f}  {'yes' if p['fits'][k] else 'NO'}")
    lines.append("")
    lines.append(f"{'host memory per rank':<44}{'GiB':>8}")
    for k, v in p["host_gib"].items():
        lines.append(f"{k:<44}{v:>8.2f}")
    gpus = p["gpus"]
    label = f"  ({gpus} ranks on one node, at start-up)"
    lines.append(f"{label:<44}{p['host_gib']['peak per rank'] * gpus:>8.2f}")
    return "\n".join(lines)
