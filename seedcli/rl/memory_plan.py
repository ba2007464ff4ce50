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

LoRA (`lora_r`; `seed rl lora=true`): the frozen base in bf16 and the adapter's fp32 weights, gradients and AdamW
moments, no reference copy (the base with the adapter off is the reference); `lora_comparison` puts full and LoRA
training side by side on several cards (`seed rl --print-memory-plan`).

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


def host_plan(
    shape: Shape, *, vllm_sleep_level: int = 2, checkpoint_bytes: int = 2, lora: bool = False
) -> dict[str, float]:
    """Host memory (GiB) of one rank by phase: the actor read in fp32 before it moves to the GPU (transformers loads
    on the CPU first; the reference comes after it, in bf16; under LoRA the frozen base is read in bf16), vLLM's
    weight backup while asleep (level 1 keeps a bf16 copy in pinned memory, level 2 drops it), rank 0's model
    gathered for a checkpoint (`checkpoint_bytes` a parameter: bf16 on GPU; LoRA: the merged model), each beside the
    process itself (`HOST_PROCESS_GIB`); and the peak."""
    P = shape.params
    start = "start-up: base read in bf16 before the GPU" if lora else "start-up: actor read in fp32 before the GPU"
    rows = {
        start: (2 if lora else 4) * P / GIB,
        f"vLLM asleep (level {vllm_sleep_level}): its weight backup": (2 * P if vllm_sleep_level == 1 else 0) / GIB,
        "checkpoint, rank 0: the model gathered": checkpoint_bytes * P / GIB,
    }
    rows["process (Python, torch, CUDA, vLLM)"] = HOST_PROCESS_GIB
    rows["peak per rank"] = HOST_PROCESS_GIB + max(v for k, v in rows.items() if not k.startswith("process"))
    return rows


ADAPTED_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def adapter_params(shape: Shape, r: int, target: str = "all-linear") -> int:
    """Parameters of a LoRA adapter of rank `r` on the decoder's linear layers (`target`: all-linear, or module
    names separated by commas, as `seed rl lora_target`): r·(in + out) per adapted module, every layer. A
    vision-language model's tower, which all-linear adapts too, is not counted."""
    h, kv, i = shape.hidden, shape.kv_heads * shape.head_dim, shape.intermediate
    dims = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}  # fmt: skip
    names = ADAPTED_MODULES if target == "all-linear" else [t.strip() for t in target.split(",")]
    unknown = [n for n in names if n not in dims]
    if unknown:
        raise ValueError(f"lora_target {target}: {', '.join(unknown)} is not a decoder linear layer of this shape")
    return shape.layers * sum(r * sum(dims[n]) for n in names)


def _state_parts(shape: Shape, n: int, A: int, kl: bool, chunk_tokens: int, graph_gib: float) -> tuple[dict, tuple]:
    """`plan`'s components other than activations (bytes per GPU), and (weights, AdamW, reference) of them: what
    stays resident between phases. `A` > 0: LoRA with an adapter of `A` parameters (`plan`'s docstring)."""
    P = shape.params
    if A:
        layer_a = A // shape.layers
        weights, adam, ref = 2 * P / n + 4 * A / n, 8 * A / n, 0.0
        return {
            "base weights (bf16, frozen, sharded)": 2 * P / n,
            "adapter weights (fp32, sharded)": 4 * A / n,
            "AdamW moments of the adapter (fp32, sharded)": adam,
            "adapter gradients (fp32, sharded)": 4 * A / n,
            "reference model: the base, adapter off": ref,
            "gathered params (bf16: root + 2 layers)": 2 * (shape.root_params + 2 * (shape.max_layer_params + layer_a)),
            "gathered layer gradient (fp32, the adapter's)": 4 * layer_a,
            "log-prob chunk (fp32 logits ×3)": 3 * 4 * chunk_tokens * shape.vocab,
            "root gradient reduce-scatter buffer (fp32)": 0.0,  # the root group is frozen
            "vLLM CUDA-graph pool (resident in sleep)": graph_gib * GIB,
        }, (weights, adam, ref)
    weights, adam, ref = 4 * P / n, 8 * P / n, (2 * P / n) if kl else 0.0
    return {
        "master weights (fp32, sharded)": weights,
        "AdamW moments (fp32, sharded)": adam,
        "gradients (fp32, sharded)": 4 * P / n,
        "reference model (bf16, sharded)": ref,
        "gathered params (bf16: root + 2 layers)": 2 * (shape.root_params + 2 * shape.max_layer_params),
        "gathered layer gradient (fp32)": 4 * shape.max_layer_params,
        "log-prob chunk (fp32 logits ×3)": 3 * 4 * chunk_tokens * shape.vocab,
        # FSDP2 reduce-scatters the root group (embeddings, lm_head) last, from an fp32 copy of its whole gradient
        "root gradient reduce-scatter buffer (fp32)": 4 * shape.root_params,
        "vLLM CUDA-graph pool (resident in sleep)": graph_gib * GIB,
    }, (weights, adam, ref)


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
    lora_r: int | None = None,
    lora_target: str = "all-linear",
) -> dict:
    """Per-GPU GiB by component and by phase, whether each phase fits the card, and host GiB per rank.

    `images_per_micro_batch` (default 0: a text policy) images of `patches_per_image` patches each (`image_patches`)
    go through the vision tower with every micro-batch; the re-scoring phase is costed with the same count.
    `vllm_graph_gib`: vLLM's CUDA-graph pool, resident while it sleeps (default `VLLM_GRAPH_POOL_GIB`, or 0 when
    `vllm_gpu_memory` is 0: an hf engine, no vLLM).

    `lora_r` (`seed rl lora=true`, rl/lora.py): the base is frozen in bf16 (sharded), only the adapter has fp32
    weights, gradients and AdamW moments; the KL reference is the base with the adapter off (no copy); the frozen root
    group has no gradient to reduce-scatter, a layer's gathered gradient is its adapter's. Activations are those of
    full training (the backward still runs through every layer to reach the first layers' adapters); the adapter's
    own (r values per adapted module and token) are left out."""
    if images_per_micro_batch and shape.vision is None:
        raise ValueError("images_per_micro_batch > 0 needs a vision-language shape (one with a vision_config)")
    if images_per_micro_batch and patches_per_image <= 0:
        raise ValueError("patches_per_image must be positive when there are images; see image_patches()")
    n = max(1, gpus)
    P = shape.params
    if vllm_graph_gib is None:
        vllm_graph_gib = VLLM_GRAPH_POOL_GIB if vllm_gpu_memory > 0 else 0.0
    A = adapter_params(shape, lora_r, lora_target) if lora_r else 0
    parts, (weights, adam, ref) = _state_parts(shape, n, A, kl, chunk_tokens, vllm_graph_gib)
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
    resident = weights + adam + ref  # gradients are freed between updates
    update = sum(parts.values())
    other = update - acts - vision_acts[gradient_checkpointing]
    vllm_share = vllm_gpu_memory * card_gib * GIB  # the graph pool included while awake
    rollout = resident + vllm_share
    # the full fp32 actor on the GPU before fully_shard, then the full bf16 reference beside the sharded actor;
    # LoRA: the full bf16 base and its adapter before fully_shard
    if lora_r:
        startup, startup_name = vllm_share + 2 * P + 4 * A, "start-up (full bf16 base + vLLM)"
    else:
        startup, startup_name = (
            vllm_share + max(4 * P, 4 * P / n + (2 * P if kl else 0)),
            "start-up (full fp32 actor + vLLM)",
        )
    g = {k: v / GIB for k, v in parts.items()}
    phases = {
        startup_name: (startup + overhead) / GIB,
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
        "host_gib": host_plan(shape, vllm_sleep_level=vllm_sleep_level, lora=bool(lora_r)),
        "adapter_params": A,
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


# --------------------------------------------------------------------------------------------- full against LoRA

CARDS_GIB = (24.0, 48.0, 80.0, 141.0)  # an RTX 4090 / L4-class card, an L40S / A6000, an A100 / H100, an H200


def trainer_state_gib(p: dict) -> float:
    """What a plan keeps on each GPU between phases: the weights, AdamW's moments and the reference (GiB)."""
    transient = ("gradients", "adapter gradients", "gathered", "log-prob", "root gradient", "vLLM", "activations",
                 "vision tower")  # fmt: skip
    return sum(v for k, v in p["components_gib"].items() if not k.startswith(transient))


def lora_comparison(shape: Shape, title: str, *, cards=CARDS_GIB, lora_r: int, lora_target: str, **kw) -> str:
    """Full and LoRA training of `shape` side by side on each card (`kw`: `plan`'s settings): the trainer state
    kept on the GPU, each phase's peak (GiB per GPU, CUDA overhead included) with `!` where it does not fit 95% of
    the card, and whether every phase fits."""
    plans = [(plan(shape, card_gib=c, **kw), plan(shape, card_gib=c, lora_r=lora_r, lora_target=lora_target, **kw))
             for c in cards]  # fmt: skip
    full0, lora0 = plans[0]
    width = 30
    lines = [
        f"{title}: {full0['params_b']:.2f}B parameters, {full0['gpus']} GPU(s); LoRA r={lora_r} {lora_target}: "
        f"{lora0['adapter_params'] / 1e6:.1f}M adapter parameters ({100 * lora0['adapter_params'] / shape.params:.2f}%)",
        f"trainer state kept on each GPU (weights, AdamW, reference): full {trainer_state_gib(full0):.1f} GiB, LoRA "
        f"{trainer_state_gib(lora0):.1f} GiB",
        f"{'phase peak, GiB per GPU':<{width}}" + "".join(f"{f'{c:.0f} GiB card':>16}" for c in cards),
        f"{'':<{width}}" + "".join(f"{'full':>8}{'LoRA':>8}" for _ in cards),
    ]
    for i, key in enumerate(full0["phases_gib"]):
        cells = []
        for pair in plans:
            for p in pair:
                k = list(p["phases_gib"])[i]
                cells.append(f"{p['phases_gib'][k]:.1f}{'' if p['fits'][k] else '!'}")
        lines.append(f"{key.split(' (')[0]:<{width}}" + "".join(f"{c:>8}" for c in cells))
    fits = ["yes" if all(p["fits"].values()) else "NO" for pair in plans for p in pair]
    lines.append(f"{'fits':<{width}}" + "".join(f"{c:>8}" for c in fits))
    lines.append(f"(! = over 95% of the card; a phase peak includes vLLM's share while it generates and "
                 f"{CUDA_OVERHEAD_GIB:.0f} GiB of CUDA/NCCL overhead)")  # fmt: skip
    weights = 2 * shape.params / GIB  # what vLLM holds of its share before any KV cache
    for c, (full, _) in zip(cards, plans, strict=True):
        left = full["vllm_share_gib"] - weights - full["vllm_graph_pool_gib"]
        if full["vllm_share_gib"] and left < 2:
            lines.append(f"on the {c:.0f} GiB card vLLM's share of {full['vllm_share_gib']:.1f} GiB leaves "
                         f"{left:.1f} GiB beside its bf16 weights ({weights:.1f}) and graphs for the KV cache: raise "
                         "vllm_gpu_memory")  # fmt: skip
    return "\n".join(lines)


QWEN_SHAPES = (("Qwen2.5-3B", "qwen2.5-3b-shape"), ("Qwen2.5-7B", "qwen2.5-7b-shape"))


def config_comparison(cfg, cards=CARDS_GIB) -> str:
    """`seed rl --print-memory-plan`: full and LoRA training side by side for an rl config (`RLConfig`) on each card:
    its model when --model is a local model directory, else Qwen2.5-3B and 7B; its GPU count (at least one), micro-batch
    tokens, gradient checkpointing (on unless the config turns it off, as on a GPU), vLLM share, KL term and LoRA
    settings."""
    model = Path(cfg.model) if cfg.model else None
    shapes = [(str(model), str(model))] if model is not None and (model / "config.json").is_file() else QWEN_SHAPES
    checkpointing = cfg.gradient_checkpointing if cfg.gradient_checkpointing is not None else True
    kw = dict(gpus=max(cfg.gpus, 1), micro_batch_tokens=cfg.micro_batch_tokens, gradient_checkpointing=checkpointing,
              vllm_gpu_memory=cfg.vllm_gpu_memory, kl=cfg.kl_coef > 0, vllm_sleep_level=cfg.vllm_sleep_level)  # fmt: skip
    head = (
        f"memory plan of seed rl (seedcli/rl/memory_plan.py; estimates, ±15%): micro_batch_tokens "
        f"{cfg.micro_batch_tokens}, gradient checkpointing {'on' if checkpointing else 'off'}, a colocated vLLM engine "
        f"with {cfg.vllm_gpu_memory:g} of the card, KL term {'on' if cfg.kl_coef > 0 else 'off'}"
    )
    tables = [
        lora_comparison(Shape.load(shape), name, cards=cards, lora_r=cfg.lora_r, lora_target=cfg.lora_target, **kw)
        for name, shape in shapes
    ]
    return "\n\n".join([head, *tables]) + "\n"
