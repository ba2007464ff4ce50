"""The phases of one SEED update after the rollouts (docs/design.md §1, Stage 2; the paper's Algorithm 1), each one call
from the rl stage: `analyse` (π_old writes a hindsight skill per episode) → `gather_episodes` → `rescore` (ℓ_old,
ℓ_skill, ℓ_ref without gradient, and the advantages) → `update_policy` (one epoch of dual-clip PPO + k3 KL − entropy
+ λ_opd·OPD) → `refresh_and_prove` (the rollout engine gets the new weights, `rl/engine_sync.py`) → `update_metrics`,
`sample_record` and `save_update_checkpoint`. Also the models the phases share (`load_models`, `RLContext`).

No environment here: the stage plays the games (`seedcli.rollout`) and hands in how a skill enters a prompt
(`RLContext.insert_skill`) and the reward convention.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from seedcli.config import RLConfig
from seedcli.errors import UserError
from seedcli.prompts import insert_step_skill
from seedcli.rl import distributed as D
from seedcli.rl.engine_sync import phase_memory, prove_start_weights, refresh_engine
from seedcli.rl.rescoring import TurnSample
from seedcli.rl.skill_library import SkillLibrary
from seedcli.rl.trainer import LossWeights, UpdateResult, update_seed

# --------------------------------------------------------------------------------------------- what the phases share


@dataclasses.dataclass
class Plan:
    """What the algorithm switches decide (docs/design.md §1: baselines are switches of the same loop)."""

    analyzer: str  # self | static | rules | none
    library: SkillLibrary | None
    opd_coef: float
    opd_beta: float

    @property
    def teacher(self) -> bool:
        """Whether the skill-context re-scoring runs (GRPO and --analyzer none skip it, so their cost is honest)."""
        return self.analyzer != "none" and self.opd_coef > 0


@dataclasses.dataclass
class Models:
    """The trainer's models on this rank."""

    lm: Any  # the actor: a Hugging Face causal LM (fp32 master weights; sharded under FSDP)
    train_model: Any  # Scorer(lm) wrapped for DDP / FSDP: what the phases call
    ref_model: Any  # the frozen starting model (Scorer, wrapped); None without a KL term
    optimizer: Any
    shared: bool  # the hf engine generates with `lm` itself: refresh is free, the probe still runs


@dataclasses.dataclass
class RLContext:
    """Everything the phases of an update read: the config and switches, this rank, the rollout engine, the models,
    and what the stage handed in from the environment."""

    cfg: RLConfig
    plan: Plan
    info: Any  # DistInfo
    engine: Any
    meta: dict  # engine, model id and hash: what the trajectories carry
    models: Models
    weights: LossWeights
    base_settings: Any  # RolloutSettings of the config; each update derives its seed
    check_sync: Callable[[int], dict[str, float]]  # the probe check (engine_sync.ProbeCheck)
    checksum_names: list[str]
    insert_skill: Callable[[str, str], str]  # the environment's skill-augmented prompt
    win_reward: float  # the environment's reward convention (ALFWorld 10 / 0.1, search 1 / 0.01)
    invalid_penalty: float
    vision_processor: Any = None  # a vision-language policy's image processor (None: a text policy)
    images: Any = None  # ImageStore of the run's observation images (set by the stage)
    in_rollout_analysis: Any = None  # this update's SelfAnalysis when π_old analysed inside the (async) rollout
    # the skill-leak audit the stage hands in: (episodes, skills) -> skills/leak_frac metrics (the env's own rule)
    audit_skills: Callable[[Sequence, Sequence], dict] | None = None
    # the same rule's spans, for leak_guard: (episodes, skills) -> per episode its skill's leaked spans, or None
    find_leaks: Callable[[Sequence, Sequence], list] | None = None
    # `--analyzer rules`: the environment's rules analyzer, trajectory -> (episode_summary, episode_skill)
    rules_skill: Callable[[Any], tuple[str, str]] | None = None
    # skill_mode episode_step / step_only: the environment's step-skill-augmented prompt
    insert_step_skill: Callable[[str, str], str] = insert_step_skill
    run_dir: Path | None = None  # where `dump_analyses` writes (set by the stage)

    def vision_inputs(self, rows: list[list[str]]) -> dict:
        """pixel_values and image_grid_thw of a micro-batch's images (each row's sha256s, in order)."""
        from seedcli.engines.vision import vision_inputs

        batch = vision_inputs(self.vision_processor, [[self._pixels(sha) for sha in row] for row in rows])
        return {"pixel_values": batch.pixel_values, "image_grid_thw": batch.image_grid_thw}

    def padding_ids(self) -> list[int] | None:
        """The prompt of a padding forward for a vision-language policy: one blank image's tokens (None: text)."""
        if self.vision_processor is None:
            return None
        from seedcli.rl.rescoring import BLANK_IMAGE

        image_id = self.models.lm.config.image_token_id
        return [self.pad_id, *[image_id] * self.image_tokens([BLANK_IMAGE])[0], self.pad_id]

    def image_tokens(self, shas: list[str]) -> list[int]:
        """How many tokens each image takes in the prompt (its merged patches)."""
        from seedcli.engines.vision import vision_inputs

        return vision_inputs(self.vision_processor, [[self._pixels(sha) for sha in shas]]).tokens[0]

    def _pixels(self, sha: str):
        from seedcli.rl.rescoring import BLANK_IMAGE

        if sha == BLANK_IMAGE:
            import numpy as np

            return np.zeros((56, 56, 3), dtype=np.uint8)
        return self.images.pixels(sha)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0


def load_lm(path: Path, info, dtype=None):
    """A Hugging Face causal LM (fp32 by default: the master weights) on this rank's device; FSDP then shards it."""
    import torch
    from transformers import AutoModelForCausalLM

    from seedcli.engines.base import is_vision_model

    if is_vision_model(path):  # the vision tower is part of the policy: trained, sharded and refreshed with it
        from transformers import AutoModelForImageTextToText as AutoModelForCausalLM  # noqa: N814
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    return lm.to(info.device)  # under FSDP, fully_shard then shards the parameters already on the rank's GPU


def load_models(cfg: RLConfig, info, engine, start_dir: Path, model_dir: Path, *, resumed: bool) -> Models:
    """The actor (from `start_dir`: the starting model or the checkpoint resumed), the frozen reference (always the
    starting model `model_dir`) and AdamW. The hf engine on one process or DDP shares the actor's weights."""
    import torch

    from seedcli.precision import compute_dtype
    from seedcli.rl.trainer import Scorer

    compute = compute_dtype(cfg.dtype, info.device)
    # FSDP2's mixed-precision policy casts the parameters itself (bf16 on GPU); elsewhere bf16 is autocast
    autocast_dtype = compute if (compute == torch.bfloat16 and not info.fsdp) else None
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
    train_model = D.wrap_for_training(Scorer(lm, compute_dtype=autocast_dtype), info)

    ref_model = None
    if cfg.kl_coef > 0:
        # the frozen starting model; in bf16 on GPU (FSDP computes in bf16 anyway) and when the compute dtype is
        # bf16: half the memory, no cast per pass
        bf16_ref = info.device.type == "cuda" or compute == torch.bfloat16
        ref_dtype = torch.bfloat16 if bf16_ref else torch.float32
        if not resumed and not info.fsdp:
            ref_lm = copy.deepcopy(lm).to(ref_dtype)
        else:
            ref_lm = load_lm(model_dir, info, ref_dtype)
        ref_lm.eval()
        for p in ref_lm.parameters():
            p.requires_grad_(False)
        ref_model = D.wrap_frozen(Scorer(ref_lm, compute_dtype=autocast_dtype), info)

    optimizer = torch.optim.AdamW(
        [p for p in train_model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=cfg.weight_decay
    )
    return Models(lm, train_model, ref_model, optimizer, shared)


class PhaseLog:
    """Seconds per phase (`timing_s/<phase>`) and, on CUDA, GPU memory at each phase's end (`mem/<phase>/...`)."""

    def __init__(self, info) -> None:
        self.info = info
        self.timing: dict[str, float] = {}
        self.mem: dict[str, float] = {}

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self.timing[phase] = time.perf_counter() - t0

    def memory(self, phase: str) -> None:
        phase_memory(self.info, phase, self.mem)


# --------------------------------------------------------------------------------------------- schedules


def opd_coef_at(cfg: RLConfig, coef: float, step: int) -> float:
    """λ_opd of update `step` (1-based): `coef`, or 0 for updates ≤ `opd_start_after_steps` and > `opd_stop_after_steps`
    (the SEED code's `_is_seed_teacher_signal_enabled`)."""
    if cfg.opd_start_after_steps is not None and step <= cfg.opd_start_after_steps:
        return 0.0
    if cfg.opd_stop_after_steps is not None and step > cfg.opd_stop_after_steps:
        return 0.0
    return coef


def failed_only(cfg: RLConfig, step: int) -> bool:
    """Whether update `step` analyses only the episodes it did not win: after `failed_only_after_steps` when that is
    set (every episode before), else as `analyze` says (the SEED code's `_should_seed_analyze_failed_only`)."""
    if cfg.failed_only_after_steps is not None:
        return step > cfg.failed_only_after_steps
    return cfg.analyze == "failed"


# --------------------------------------------------------------------------------------------- analyse


def in_rollout_analysis(ctx: RLContext, step: int, rollout: str) -> Any:
    """SEED's self-analysis served inside the rollout (`rollout: async`): a finished episode's analysis enters the
    same engine, with the same weights, the moment it ends (`SelfAnalysis`); None when π_old does not analyse, or
    analyses after the rollout (lockstep)."""
    cfg = ctx.cfg
    if ctx.plan.analyzer != "self" or rollout != "async":
        return None
    from seedcli.analyzers.policy import SelfAnalysis

    return SelfAnalysis(
        ctx.engine,
        cfg.analyzer_max_new_tokens,
        seed=update_seed(cfg.seed, step, "analyze", ctx.info.rank),
        max_prompt_chars=cfg.analysis_max_chars,
        images=ctx.images,
        attempts=cfg.analyzer_parse_retries,
        min_words=cfg.min_skill_words,
        failed_only=failed_only(cfg, step),
        skill_mode=cfg.skill_mode,
        max_step_skills=cfg.max_step_skills,
    )


def vision_processor(engine, models, meta: dict) -> Any:
    """A vision-language policy's image processor (None for a text model)."""
    if getattr(models.lm.config, "vision_config", None) is None:
        return None
    processor = getattr(engine, "image_processor", None)
    if processor is None:
        from seedcli.engines.vision import load_image_processor

        processor = load_image_processor(meta["model_id"])
    return processor


def analyse(
    ctx: RLContext, episodes: Sequence, step: int, analyses: dict | None = None
) -> tuple[list[str | None], list[str | None]]:
    """(skill, rejection reason) of each of this rank's episodes: π_old writes a skill for each finished episode
    (greedy, the shared analysis prompt and parser; won ones are skipped when `failed_only`), or the static library
    answers; None where there is none. `analyses`, when given, receives the self-analyzer's ParsedSkill of each
    episode it analysed, by episode id: its step skills (`skill_mode`), prompt and raw answer."""
    cfg, plan = ctx.cfg, ctx.plan
    skills: list[str | None] = [None] * len(episodes)
    reasons: list[str | None] = ["analyzer_off"] * len(episodes)
    if plan.analyzer == "self" and episodes and ctx.in_rollout_analysis is not None:
        # rollout: async: each episode was analysed the moment it ended, while the others still played
        results = ctx.in_rollout_analysis.results
        parsed = [results[ep.episode_id] for ep in episodes]
        skills = [p.skill if p.kept else None for p in parsed]
        reasons = [None if p.kept else p.reason for p in parsed]
        if analyses is not None:
            analyses.update((ep.episode_id, p) for ep, p in zip(episodes, parsed, strict=True))
    elif plan.analyzer == "self" and episodes:
        from seedcli.analyzers.parse import SKIPPED_SUCCESS
        from seedcli.analyzers.policy import analyze_with_engine

        skip_won = failed_only(cfg, step)
        chosen = [i for i, ep in enumerate(episodes) if not (skip_won and ep.won)]
        reasons = [SKIPPED_SUCCESS] * len(episodes)
        parsed = []
        if chosen:
            parsed = analyze_with_engine(
                ctx.engine,
                [episodes[i] for i in chosen],
                cfg.analyzer_max_new_tokens,
                temperature=0.0,
                seed=update_seed(cfg.seed, step, "analyze", ctx.info.rank),
                max_prompt_chars=cfg.analysis_max_chars,
                images=ctx.images,  # an episode played from images is analysed from its images
                attempts=cfg.analyzer_parse_retries,
                min_words=cfg.min_skill_words,
                skill_mode=cfg.skill_mode,
                max_step_skills=cfg.max_step_skills,
            )
        for i, p in zip(chosen, parsed, strict=True):
            skills[i] = p.skill if p.kept else None
            reasons[i] = None if p.kept else p.reason
            if analyses is not None:
                analyses[episodes[i].episode_id] = p
    elif plan.analyzer == "static":
        skills = [plan.library.skill_for(ep.category, ep.episode_id) for ep in episodes]
        reasons = [None if s else "no_static_skill_for_type" for s in skills]
    elif plan.analyzer == "rules" and episodes:
        # the environment's rules analyzer writes each finished episode's hindsight skill from its trajectory (what
        # `seed annotate --analyzer rules` writes): an offline stand-in for an external analyzer, no generation
        from seedcli.analyzers.parse import SKIPPED_SUCCESS, TOO_SHORT

        skip_won = failed_only(cfg, step)
        for i, ep in enumerate(episodes):
            if skip_won and ep.won:
                reasons[i] = SKIPPED_SUCCESS
                continue
            skill = ctx.rules_skill(ep)[1] if ctx.rules_skill is not None else ""
            kept = len(skill.split()) >= cfg.min_skill_words and bool(skill.strip())
            skills[i] = skill if kept else None
            reasons[i] = None if kept else TOO_SHORT
    return skills, reasons


@dataclasses.dataclass
class Batch:
    """Every rank's episodes of this update (by episode id) with their skills and rejection reasons, and the
    self-analyzer's ParsedSkill of each (None where it did not analyse; None in all without `analyses`)."""

    episodes: list
    skills: list[str | None]
    reasons: list[str | None]
    analyses: list | None = None

    @property
    def step_skills(self) -> list[dict[int, str] | None]:
        """Each episode's step skills (turn index -> skill) from a kept analysis; None where there are none."""
        analyses = self.analyses or [None] * len(self.episodes)
        return [a.step_skills if (a is not None and a.kept and a.step_skills) else None for a in analyses]


def gather_episodes(
    episodes: Sequence, skills: Sequence, reasons: Sequence, info, analyses: dict | None = None, keep_text: bool = True
) -> Batch:
    """All ranks' episodes, skills and reasons (and `analyse`'s `analyses`, by episode id), in episode-id order
    (every rank needs every score for advantages). `keep_text=False` leaves the analyses' prompts and answers
    behind (only `dump_analyses` reads them; an analysis prompt can be 24k characters)."""
    parsed = [(analyses or {}).get(ep.episode_id) for ep in episodes]
    if not keep_text:
        parsed = [dataclasses.replace(a, prompt="", raw="") if a is not None else None for a in parsed]
    gathered = D.all_gather_object(list(zip(episodes, skills, reasons, parsed, strict=False)), info)
    rows = sorted((row for part in gathered for row in part), key=lambda row: row[0].episode_id)
    batch = Batch([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
    if analyses is not None:
        batch.analyses = [r[3] for r in rows]
    return batch


# --------------------------------------------------------------------------------------------- guards

GUARD_PLACEHOLDER = "[…]"


def guard_skills(
    skills: Sequence[str | None], spans: Sequence[list[tuple[int, int]] | None], mode: str
) -> tuple[list[str | None], int]:
    """(`leak_guard` applied to `skills`, how many it changed): `mask` replaces each leaked span (character offsets
    into the skill) by GUARD_PLACEHOLDER, `drop` removes a leaking skill (its episode gets no OPD), `off` changes
    nothing."""
    if mode == "off":
        return list(skills), 0
    out: list[str | None] = []
    changed = 0
    for skill, leaked in zip(skills, spans, strict=True):
        if not skill or not leaked:
            out.append(skill)
            continue
        changed += 1
        if mode == "drop":
            out.append(None)
            continue
        for start, end in sorted(leaked, reverse=True):  # from the end, so earlier offsets stay valid
            skill = skill[:start] + GUARD_PLACEHOLDER + skill[end:]
        out.append(skill)
    return out, changed


def guard_step_skills(
    episodes: Sequence, step_skills: Sequence[dict[int, str] | None], find_leaks: Callable, mode: str
) -> tuple[list[dict[int, str] | None], int]:
    """`leak_guard` on each episode's step skills, judged by the same leak rule as its episode skill: (the guarded
    step skills, how many it changed); `drop` removes a leaking step skill (that turn gets no step skill)."""
    owners = [(ei, ti) for ei, by_turn in enumerate(step_skills) for ti in sorted(by_turn or {})]
    texts = [step_skills[ei][ti] for ei, ti in owners]
    guarded, changed = guard_skills(texts, find_leaks([episodes[ei] for ei, _ in owners], texts), mode)
    out: list[dict[int, str] | None] = [None if by_turn is None else {} for by_turn in step_skills]
    for (ei, ti), text in zip(owners, guarded, strict=True):
        if text:
            out[ei][ti] = text
    return [by_turn or None for by_turn in out], changed


def contrast_skills(episodes: Sequence, skills: Sequence[str | None], seed: int) -> list[str | None]:
    """`opd_contrast: shuffled`: for each episode with a skill, the skill of another episode of the same category
    whose text differs (an identical text would contrast to zero), drawn with `random.Random(seed)` in episode
    order; None where there is no such episode."""
    rng = random.Random(seed)
    out: list[str | None] = []
    for i, (ep, skill) in enumerate(zip(episodes, skills, strict=True)):
        pool = [
            other
            for j, (e, other) in enumerate(zip(episodes, skills, strict=True))
            if skill and j != i and other and other != skill and e.category == ep.category
        ]
        out.append(rng.choice(pool) if pool else None)
    return out


# --------------------------------------------------------------------------------------------- rescore


@dataclasses.dataclass
class Rescored:
    """The update's turn-samples (all ranks', with advantages), the mini-batch plan, this rank's share re-scored,
    and what the metrics and samples.jsonl need of the re-scoring."""

    samples: list[TurnSample]
    minibatches: list[list[list[int]]]
    mine: list[TurnSample]
    forwards: dict[str, int]
    teacher_s: float  # seconds of the skill-context (teacher) pass
    shift_sum: float  # Σ (ℓ_skill − ℓ_old) over this rank's tokens with a skill
    shift_n: int
    leak_guarded: int = 0  # skills leak_guard masked or dropped
    contrast_s: float = 0.0  # seconds of the opd_contrast teacher pass
    sample_episode: int = 0  # the episode samples.jsonl logs, and its turns on this rank
    sample_rows: list | None = None


def rescore(ctx: RLContext, batch: Batch, step: int, want_sample: bool) -> Rescored:
    """Turn-samples of `batch` with group-normalised advantages; this rank tokenises its share (the other ranks'
    prompt lengths are exchanged, for packing and the loss's token counts) and re-scores it without gradient."""
    from seedcli.rl.rescoring import build_turn_samples, render_samples, rescore_samples, share_lengths
    from seedcli.rl.trainer import plan_minibatches, rank_indices

    cfg, info, engine = ctx.cfg, ctx.info, ctx.engine
    # no skill-context pass while λ_opd is 0 for this update (opd_start/stop_after_steps), as the SEED code
    teacher = ctx.plan.teacher and ctx.weights.opd_coef > 0

    def render(text: str, images: list[str] | None = None) -> list[int]:
        if not images:
            return list(engine.render([{"role": "user", "content": text}]))
        if ctx.vision_processor is None:
            raise UserError(
                "the episodes show images but the policy has no vision tower: use a vision-language model "
                "(`seed model init --preset tiny-vl`) or env_options '{observation: text}'"
            )
        from seedcli.engines.base import content_parts
        from seedcli.engines.vision import expand_image_tokens

        ids = engine.render([{"role": "user", "content": content_parts(text)}])
        return expand_image_tokens(ids, ctx.models.lm.config.image_token_id, ctx.image_tokens(images))

    # leak_guard, then opd_contrast's other skills, on the batch's final skills (every rank holds all of them)
    skills, guarded = list(batch.skills), 0
    if cfg.leak_guard != "off" and ctx.find_leaks is not None:
        skills, guarded = guard_skills(skills, ctx.find_leaks(batch.episodes, skills), cfg.leak_guard)
    step_skills = batch.step_skills if cfg.skill_mode != "episode_only" else None
    if step_skills is not None and cfg.leak_guard != "off" and ctx.find_leaks is not None:
        step_skills, step_guarded = guard_step_skills(batch.episodes, step_skills, ctx.find_leaks, cfg.leak_guard)
        guarded += step_guarded
    contrast = teacher and cfg.opd_contrast == "shuffled"
    others = contrast_skills(batch.episodes, skills, update_seed(cfg.seed, step, "contrast")) if contrast else None
    samples = build_turn_samples(
        batch.episodes,
        skills,
        None,
        insert_skill=ctx.insert_skill,
        with_skill_context=teacher,
        win_reward=ctx.win_reward,
        invalid_penalty=ctx.invalid_penalty,
        normalize_std=cfg.advantage_norm == "mean_std",
        contrast_skills=others,
        skill_mode=cfg.skill_mode,
        step_skills=step_skills,
        insert_step_skill=ctx.insert_step_skill if step_skills is not None else None,
    )
    # every rank tokenises a slice, so that all know every sample's length; then the plan deals the samples by tokens
    # and each rank tokenises what it was dealt and had not (at most twice its share, once on one process)
    counted = list(range(info.rank, len(samples), info.world))
    render_samples(samples, counted, render)
    share_lengths(samples, counted, lambda obj: D.all_gather_object(obj, info))
    seed = update_seed(cfg.seed, step, "minibatch")
    minibatches = plan_minibatches(len(samples), cfg.mini_batch, info.world, seed, [s.length for s in samples])
    mine_idx = rank_indices(minibatches, info.rank)
    keep = set(mine_idx)
    for i in counted:
        if i not in keep:  # the lengths stay; the ids belong to the rank that trains on the sample
            samples[i].prompt_ids = samples[i].skill_prompt_ids = samples[i].contrast_prompt_ids = None
    render_samples(samples, [i for i in mine_idx if not samples[i].rendered], render)
    mine = [samples[i] for i in mine_idx]
    models = ctx.models
    models.train_model.eval()
    timings: dict[str, float] = {}
    forwards = rescore_samples(
        mine,
        old_fn=models.train_model,
        ref_fn=models.ref_model,
        teacher=teacher,
        max_tokens=cfg.micro_batch_tokens,
        pad_id=ctx.pad_id,
        device=info.device,
        timings=timings,
        sync_count=lambda n: D.max_over_ranks(n, info),  # every rank runs as many forwards as the busiest
        vision=ctx.vision_inputs if ctx.vision_processor is not None else None,
        padding_ids=ctx.padding_ids(),
        contrast=contrast,
    )
    D.reshard(models.train_model)
    shift_sum, shift_n = 0.0, 0
    for s in mine:
        if s.skill_logp is not None:
            shift_sum += float((s.skill_logp - s.old_logp).sum())
            shift_n += len(s.response_ids)
    out = Rescored(samples, minibatches, mine, forwards, timings.get("teacher", 0.0), shift_sum, shift_n, guarded)
    out.contrast_s = timings.get("contrast", 0.0)
    if want_sample and batch.episodes:
        out.sample_episode = choose_sample_episode(batch.episodes, batch.skills)
        out.sample_rows = [
            (
                s.turn_index,
                s.response_ids,
                s.old_logp.tolist(),
                s.skill_logp.tolist() if s.skill_logp is not None else None,
                s.advantage,
            )
            for s in mine
            if s.episode_index == out.sample_episode
        ]
    return out


def choose_sample_episode(episodes: list, skills: list[str | None]) -> int:
    """The episode whose score shift is logged: a won one with a skill, else any with a skill, else the first."""
    for want_won in (True, False):
        for i, (ep, skill) in enumerate(zip(episodes, skills, strict=False)):
            if skill and (ep.won or not want_won):
                return i
    return 0


# --------------------------------------------------------------------------------------------- update and refresh


def update_policy(ctx: RLContext, scored: Rescored) -> UpdateResult:
    """One epoch of dual-clip PPO + k3 KL − entropy + λ_opd·OPD on θ over the update's mini-batches (advantages
    are in the samples)."""
    from seedcli.rl.trainer import train_update

    cfg, models = ctx.cfg, ctx.models
    return train_update(
        models.train_model,
        models.optimizer,
        scored.samples,
        scored.minibatches,
        ctx.info,
        weights=ctx.weights,
        micro_tokens=cfg.micro_batch_tokens,
        grad_clip=cfg.grad_clip,
        pad_id=ctx.pad_id,
        use_ref=models.ref_model is not None,
        vision=ctx.vision_inputs if ctx.vision_processor is not None else None,
        padding_ids=ctx.padding_ids(),
    )


def prove_start(ctx: RLContext, step: int) -> None:
    """Before the first update of a session: the engine must already hold the trainer's weights (a broken engine
    fails now, not after an hour of rollouts)."""
    prove_start_weights(
        ctx.engine,
        ctx.models.lm,
        ctx.info,
        step,
        shared=ctx.models.shared,
        checksum_names=ctx.checksum_names,
        check_sync=ctx.check_sync,
    )


def refresh_and_prove(ctx: RLContext, step: int) -> dict[str, float]:
    """Refresh the rollout engine with the new weights and prove it holds them (`engine_sync.refresh_engine`);
    under DDP also check that every rank holds the same weights."""
    from seedcli.errors import UserError

    info = ctx.info
    sync = refresh_engine(
        ctx.engine,
        ctx.models.lm,
        info,
        step,
        shared=ctx.models.shared,
        checksum_names=ctx.checksum_names,
        check_sync=ctx.check_sync,
    )
    if info.world > 1 and not info.fsdp:
        digests = D.all_gather_object(D.param_digest(ctx.models.lm), info)
        sync["dist/ranks_in_sync"] = float(len(set(digests)) == 1)
        if len(set(digests)) != 1:
            raise UserError(f"update {step}: the ranks' weights differ after the update (DDP out of sync); stopped")
    return sync


# --------------------------------------------------------------------------------------------- metrics and samples


SUBPHASES = ("rescore_teacher", "rescore_contrast")  # timed inside rescore; logged beside it


def update_metrics(
    ctx: RLContext,
    step: int,
    *,
    epoch: int,
    games: int,
    batch: Batch,
    episode_summary: dict,
    scored: Rescored,
    result: UpdateResult,
    sync: dict[str, float],
    log: PhaseLog,
) -> dict[str, Any]:
    """The update's metrics.jsonl record (every rank computes it; rank 0 writes). `episode_summary` is
    `seedcli.rollout.episode_metrics` of the batch's episodes."""
    import torch

    from seedcli.analyzers.parse import SKIPPED_SUCCESS

    info, plan, episodes, samples = ctx.info, ctx.plan, batch.episodes, scored.samples
    active, n_gate = _gate_active_sum(scored.mine, ctx.weights.opd_beta)
    stats = torch.tensor(
        [scored.shift_sum, float(scored.shift_n), float(scored.forwards.get("padding", 0)), active, n_gate],
        dtype=torch.float64,
        device=info.device,
    )
    stats = D.all_reduce_(stats, info).cpu().tolist()
    # every rank ran as many forwards per pass as the busiest (padding included): world × the passes' counts in all
    forwards_all = info.world * sum(v for k, v in scored.forwards.items() if k != "padding")
    ep, timing = episode_summary, log.timing
    tokens_gen = sum(len(t.response_ids) for e in episodes for t in e.turns)
    tokens_all = sum(s.length for s in samples) + sum(s.skill_length for s in samples if s.has_skill)
    # the teacher and contrast passes are parts of rescore (their own rows), not phases of their own
    elapsed = sum(v for k, v in timing.items() if k not in SUBPHASES)
    kept = sum(1 for s, steps in zip(batch.skills, batch.step_skills, strict=True) if s or steps)
    rejected = Counter(r for r in batch.reasons if r and r not in ("analyzer_off", SKIPPED_SUCCESS))
    record: dict[str, Any] = {
        "step": step,
        "epoch": epoch,
        "reward/mean": sum(ctx.win_reward * e.won - ctx.invalid_penalty * e.invalid_turns for e in episodes)
        / max(len(episodes), 1),
        "reward/score_mean": sum(e.score for e in episodes) / max(len(episodes), 1),
        "reward/turn_score_mean": sum(s.score for s in samples) / max(len(samples), 1),
        "rollout/success_rate": ep["success_rate"],
        **{f"rollout/success/{k}": v for k, v in ep["success_by_type"].items()},
        "rollout/episodes": len(episodes),
        "rollout/games": games,
        "rollout/turn_samples": len(samples),
        "rollout/response_tokens": tokens_gen,
        "rollout/truncated_frac": sum(t.finish_reason == "length" for e in episodes for t in e.turns)
        / max(sum(len(e.turns) for e in episodes), 1),
        "env/episode_length": ep["mean_length"],
        "env/invalid_rate": ep["invalid_rate"],
        **result.metrics,
        "actor/lr": ctx.cfg.lr,
        "opd/valid_skill_frac": kept / max(len(episodes), 1) if plan.analyzer != "none" else 0.0,
        "opd/shift_mean": stats[0] / stats[1] if stats[1] else 0.0,
        # the SEED code's actor/opd_gate_active_ratio, here at π_old (the rescore pass): share of tokens with g > 0.5
        "opd/gate_active_frac": stats[3] / stats[4] if stats[4] else 0.0,
        # the SEED code's actor/opd_teacher_gap_mean: mean of ℓ_skill − ℓ_θ over OPD tokens (the trainer's delta)
        "opd/teacher_gap_mean": result.metrics.get("opd/delta_mean", 0.0),
        "opd/coef": ctx.weights.opd_coef,
        "opd/beta": ctx.weights.opd_beta,
        **{f"analyzer/rejected/{k}": v for k, v in rejected.items()},
        **{f"timing_s/{k}": v for k, v in timing.items()},
        "perf/tokens_per_s": tokens_all / elapsed if elapsed > 0 else 0.0,
        "perf/gen_tokens_per_s": tokens_gen / timing["rollout"] if timing["rollout"] > 0 else 0.0,
        "dist/padding_forwards_rescore": stats[2],
        "rescore/pad_forward_frac": stats[2] / forwards_all if forwards_all else 0.0,
        **sync,
        **log.mem,
    }
    if ctx.cfg.leak_guard != "off":
        record["skills/leak_guarded"] = scored.leak_guarded
    if ctx.cfg.skill_mode != "episode_only":
        record.update(step_skill_metrics(batch, samples))
    if plan.analyzer in (
        "self",
        "rules",
    ):  # won episodes `analyze: failed` left out (the SEED code's skipped_success_traj_count)
        record["analyzer/skipped_success"] = sum(r == SKIPPED_SUCCESS for r in batch.reasons)
    if result.cause:
        record["actor/skip_cause"] = result.cause
    audit = getattr(
        ctx, "audit_skills", None
    )  # skills/leak_frac: hindsight facts in the skills (the stage hands it in)
    if audit is not None and plan.analyzer != "none":
        record.update(audit(batch.episodes, batch.skills))
    return record


def step_skill_metrics(batch: Batch, samples: Sequence[TurnSample]) -> dict[str, float]:
    """Under skill_mode episode_step / step_only: step skills kept in the batch (`skills/step_skills`), the share of
    turn-samples whose teacher prompt carries one (`opd/step_skill_turn_frac`, the SEED code's
    seed/step_skill_teacher/step_skill_step_ratio over all turns) and the step-skill entries dropped, by reason."""
    dropped: Counter[str] = Counter()
    for a in batch.analyses or []:
        dropped.update((a.step_dropped or {}) if a is not None else {})
    return {
        "skills/step_skills": float(sum(len(steps or {}) for steps in batch.step_skills)),
        "opd/step_skill_turn_frac": sum(s.step_skill for s in samples) / max(len(samples), 1),
        **{f"analyzer/step_dropped/{k}": float(v) for k, v in sorted(dropped.items())},
    }


def _gate_active_sum(mine: Sequence[TurnSample], beta: float) -> tuple[float, float]:
    """(tokens whose gate σ(β·(ℓ_skill − ℓ_old)) > 0.5, tokens with ℓ_skill) over this rank's re-scored samples."""
    import torch

    from seedcli.rl.losses import opd_gate_stats

    scored = [s for s in mine if s.skill_logp is not None]
    if not scored:
        return 0.0, 0.0
    teacher = torch.cat([s.skill_logp.reshape(-1) for s in scored]).double()  # [N]
    student = torch.cat([s.old_logp.reshape(-1) for s in scored]).double()  # [N]
    stats = opd_gate_stats(student, teacher, torch.ones_like(student), beta)
    return float(stats["opd/gate_active_frac"]) * student.numel(), float(student.numel())


def sample_record(
    ctx: RLContext, step: int, batch: Batch, scored: Rescored, entropy_threshold: float | None = None
) -> dict | None:
    """samples.jsonl on sampled updates (rank 0; every rank joins the gather): one episode with its skill (and the
    spans of it the leak rule finds) and, per response token, ℓ_old, ℓ_skill, the shift, the gate and the entropy at
    θ (with the update's top-20% `entropy_threshold`). None on other updates and other ranks."""
    if scored.sample_rows is None:
        return None
    entropies = {s.turn_index: s.entropy for s in scored.mine if s.episode_index == scored.sample_episode}
    mine = [(*row, _tolist(entropies.get(row[0]))) for row in scored.sample_rows]
    rows = [row for part in D.all_gather_object(mine, ctx.info) for row in part]
    if not ctx.info.is_main:
        return None
    chosen = scored.sample_episode
    episode, beta = batch.episodes[chosen], ctx.weights.opd_beta
    turns = []
    for turn_index, response_ids, old, skill_lp, advantage, entropy in sorted(rows, key=lambda r: r[0]):
        turn = episode.turns[turn_index]
        entry = {
            "turn": turn_index + 1,
            "action": turn.action,
            "valid": turn.valid,
            "advantage": advantage,
            "tokens": [ctx.tokenizer.decode([t]) for t in response_ids],
            "old_logp": old,
        }
        if entropy is not None:
            entry["entropy"] = entropy
        if skill_lp is not None:
            shift = [b - a for a, b in zip(old, skill_lp, strict=False)]
            entry["skill_logp"] = skill_lp
            entry["shift"] = shift
            entry["gate"] = [1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, beta * d)))) for d in shift]
        turns.append(entry)
    skill = batch.skills[chosen]
    leaks = ctx.find_leaks([episode], [skill])[0] if (skill and getattr(ctx, "find_leaks", None)) else None
    return {
        "step": step,
        "episode_id": episode.episode_id,
        "task": episode.task,
        "category": episode.category,
        "won": episode.won,
        "score": episode.score,
        "length": episode.length,
        "skill": skill,
        "skill_leaks": [list(span) for span in leaks] if leaks is not None else None,  # [start, end) in `skill`
        "leak_guard": ctx.cfg.leak_guard,
        "entropy_threshold": entropy_threshold,
        "skill_reason": batch.reasons[chosen],
        "skill_source": ctx.plan.analyzer,
        "opd_beta": beta,
        "turns": turns,
    }


def _tolist(t) -> list[float] | None:
    return t.tolist() if t is not None else None


ANALYSES_DIR = "analyses"
TEACHER_PROMPTS_DIR = "teacher_prompts"


def write_dumps(ctx: RLContext, step: int, batch: Batch, scored: Rescored) -> list[Path]:
    """`dump_analyses` (rank 0): `analyses/step_NNNNNN.jsonl`, one line per episode of the update (its analysis
    prompt, the raw answer, the parsed episode and step skills, the rejection reason), and
    `teacher_prompts/step_NNNNNN.jsonl`, one line per turn-sample with a teacher prompt (the prompt with the
    skill inserted, after leak_guard); turns are numbered from 1, as in samples.jsonl. Returns the files written."""
    import orjson

    from seedcli.atomic import atomic_write_bytes
    from seedcli.prompts import analysis_prompt_version, is_visual

    cfg = ctx.cfg
    if not (cfg.dump_analyses and ctx.info.is_main and ctx.run_dir is not None):
        return []
    analyses = batch.analyses or [None] * len(batch.episodes)
    episodes = []
    for ep, skill, reason, a in zip(batch.episodes, batch.skills, batch.reasons, analyses, strict=True):
        asked = a is not None and bool(a.prompt)
        episodes.append(
            {
                "step": step,
                "episode_id": ep.episode_id,
                "group_id": ep.group_id,
                "category": ep.category,
                "won": ep.won,
                "score": ep.score,
                "length": ep.length,
                "skill_source": ctx.plan.analyzer,
                "skill_mode": cfg.skill_mode,
                "prompt_version": analysis_prompt_version(is_visual(ep), cfg.skill_mode) if asked else None,
                "prompt": a.prompt if asked else None,  # None: not analysed (static, rules, skipped won episode)
                "answer": a.raw if asked else None,
                "attempts": a.attempts if a is not None else 0,
                "episode_summary": a.summary if a is not None else None,
                "episode_skill": a.skill if a is not None else skill,
                "step_skills": {str(t + 1): text for t, text in (a.step_skills if a is not None else {}).items()},
                "step_dropped": dict(a.step_dropped) if a is not None else {},
                "skill": skill,  # the episode skill the teacher pass uses (None: rejected, skipped or none)
                "reason": reason,
            }
        )
    prompts = [
        {
            "step": step,
            "episode_id": batch.episodes[s.episode_index].episode_id,
            "turn": s.turn_index + 1,
            "source": "step" if s.step_skill else "episode",
            "teacher_prompt": s.skill_prompt,
        }
        for s in scored.samples
        if s.skill_prompt is not None
    ]
    written = []
    for folder, rows in ((ANALYSES_DIR, episodes), (TEACHER_PROMPTS_DIR, prompts)):
        path = ctx.run_dir / folder / f"step_{step:06d}.jsonl"
        atomic_write_bytes(path, b"".join(orjson.dumps(row) + b"\n" for row in rows))
        written.append(path)
    return written


# --------------------------------------------------------------------------------------------- checkpoint


def checkpoint_dtype(cfg: RLConfig, info):
    """dtype of the checkpoints' model weights: bf16 on GPU (what vLLM serves them in; half the disk), fp32 on CPU."""
    import torch

    if cfg.checkpoint_dtype == "auto":
        return torch.bfloat16 if info.device.type == "cuda" else torch.float32
    return getattr(torch, cfg.checkpoint_dtype)


def save_update_checkpoint(ctx: RLContext, root: Path, step: int, state: dict[str, Any]) -> Path:
    """`root/step_NNNNNN/` (every rank calls it): the actor, optimizer, RNG states and `state` (sampler position,
    non-finite streak, the update's metrics)."""
    from seedcli.rl.trainer import save_checkpoint

    models = ctx.models
    return save_checkpoint(
        root,
        step,
        lm=models.lm,
        tokenizer=ctx.tokenizer,
        optimizer=models.optimizer,
        train_module=models.train_model,
        info=ctx.info,
        state=state,
        keep=ctx.cfg.keep_checkpoints,
        model_dtype=checkpoint_dtype(ctx.cfg, ctx.info),
        processor=ctx.vision_processor,
    )
