"""Phase 3 of an update (docs/design.md §1, Stage 2 steps 3 and 4): the update's turn-samples, their advantages, and
their response tokens re-scored without gradient under each context.

`rescore`: the batch's skills after `leak_guard` (and `opd_contrast`'s other skills, rl/analyse.py), the turn-samples
with their scores and group-normalised advantages (rl/samples.py; GiGPO's under step_advantage gigpo,
rl/advantages.py), the mini-batch plan (rl/batching.py), and this
rank's share re-scored (`rescore_samples`): ℓ_old (ordinary prompt, π_old), ℓ_skill (the prompt with the skill block
inserted after the task line, π_old), ℓ_ref (the frozen starting model) and, under opd_contrast, ℓ_other. The
forwards themselves are `rl/logprobs.py: score_responses` (packed by length, right-padded only to the longest of each
micro-batch).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from seedcli.engines.base import content_parts
from seedcli.engines.vision import expand_image_tokens
from seedcli.errors import UserError
from seedcli.rl import distributed as D
from seedcli.rl.analyse import Batch, contrast_skills, guard_skills, guard_step_skills, other_skills
from seedcli.rl.batching import VisionFn, plan_minibatches, rank_indices
from seedcli.rl.context import RLContext, gigpo_settings, update_seed
from seedcli.rl.logprobs import ScoreFn, score_responses
from seedcli.rl.optimize import LossWeights
from seedcli.rl.samples import TurnSample, build_turn_samples, episode_rewards, render_samples, share_lengths


@dataclass
class Rescored:
    """The update's turn-samples (all ranks', with advantages), the mini-batch plan, this rank's share re-scored,
    and what the metrics need of the re-scoring."""

    samples: list[TurnSample]
    minibatches: list[list[list[int]]]
    mine: list[TurnSample]
    forwards: dict[str, int]
    teacher_s: float  # seconds of the skill-context (teacher) pass
    shift_sum: float  # Σ (ℓ_skill − ℓ_old) over this rank's tokens with a skill
    shift_n: int
    leak_guarded: int = 0  # skills leak_guard masked or dropped
    contrast_s: float = 0.0  # seconds of the opd_contrast teacher pass
    episode_rewards: list[float] = field(default_factory=list)  # each episode's training reward (rl/samples.py)
    trained: int = -1  # turn-samples in the plan (fewer than `samples` under zero_adv drop)
    reused_old: bool = False  # old_logp reuse: ℓ_old comes from the update's own forward (filled by train_update)


def rescore(ctx: RLContext, batch: Batch, step: int, weights: LossWeights) -> Rescored:
    """Turn-samples of `batch` with group-normalised advantages; this rank tokenises its share (the other ranks'
    prompt lengths are exchanged, for packing and the loss's token counts) and re-scores it without gradient."""
    cfg, info = ctx.cfg, ctx.info
    # no skill-context pass while λ_opd is 0 for this update (opd_start/stop_after_steps), as the SEED code
    teacher = ctx.plan.teacher and weights.opd_coef > 0
    skills, step_skills, others, guarded = teacher_skills(ctx, batch, step, teacher)
    hooks = ctx.hooks
    samples = build_turn_samples(
        batch.episodes,
        skills,
        None,
        insert_skill=hooks.insert_skill,
        with_skill_context=teacher,
        reward=hooks.reward,
        normalize_std=cfg.advantage_norm == "mean_std",
        advantage_level=cfg.advantage_level,
        contrast_skills=others,
        skill_mode=cfg.skill_mode,
        step_skills=step_skills,
        insert_step_skill=hooks.insert_step_skill if step_skills is not None else None,
        gigpo=gigpo_settings(cfg),  # step_advantage gigpo: GiGPO's advantages instead of GRPO's
    )
    # zero_adv drop: only the samples that teach (a nonzero advantage or an OPD term) are tokenised, scored and trained
    trained = teaching_samples(samples, cfg.zero_adv)
    # every rank tokenises a slice, so that all know every sample's length; then the plan deals the samples by tokens
    # and each rank tokenises what it was dealt and had not (at most twice its share, once on one process)
    render = _renderer(ctx)
    counted = trained[info.rank :: info.world]
    render_samples(samples, counted, render)
    share_lengths(samples, counted, lambda obj: D.all_gather_object(obj, info))
    seed = update_seed(cfg.seed, step, "minibatch")
    plan = plan_minibatches(len(trained), cfg.mini_batch, info.world, seed, [samples[i].length for i in trained])
    minibatches = [[[trained[k] for k in share] for share in mb] for mb in plan]  # indices into `samples`
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
    # old_logp reuse: one optimizer step this update, so ℓ_old is the update's own forward at θ = π_old (rl/optimize.py)
    reuse = cfg.old_logp == "reuse" and len(minibatches) == 1
    forwards = rescore_samples(
        mine,
        old_fn=None if reuse else models.train_model,
        teacher_fn=models.train_model,
        ref_fn=models.ref_model,
        teacher=teacher,
        max_tokens=cfg.micro_batch_tokens,
        pad_id=ctx.pad_id,
        device=info.device,
        timings=timings,
        sync_count=lambda n: D.max_over_ranks(n, info),  # every rank runs as many forwards as the busiest
        vision=ctx.vision_inputs if ctx.vision_processor is not None else None,
        padding_ids=ctx.padding_ids(),
        contrast=others is not None,  # opd_contrast: the extra teacher pass under another episode's skill
    )
    D.reshard(models.train_model)
    shift_sum, shift_n = skill_shift(mine) if not reuse else (0.0, 0)  # reuse: counted after the update
    return Rescored(
        samples,
        minibatches,
        mine,
        forwards,
        timings.get("teacher", 0.0),
        shift_sum,
        shift_n,
        leak_guarded=guarded,
        contrast_s=timings.get("contrast", 0.0),
        episode_rewards=episode_rewards(batch.episodes, hooks.reward),
        trained=len(trained),
        reused_old=reuse,
    )


def teaching_samples(samples: Sequence[TurnSample], zero_adv: str) -> list[int]:
    """Indices of the samples the update scores and trains on: all (`keep`), or under `drop` those with a nonzero
    advantage or an OPD term (a sample with neither carries only the KL and entropy terms)."""
    return [i for i, s in enumerate(samples) if zero_adv == "keep" or s.advantage != 0.0 or s.has_skill]


def skill_shift(mine: Sequence[TurnSample]) -> tuple[float, int]:
    """(Σ (ℓ_skill − ℓ_old), response tokens) over this rank's samples with a skill: `opd/shift_mean`'s parts."""
    shift_sum, shift_n = 0.0, 0
    for s in mine:
        if s.skill_logp is not None and s.old_logp is not None:
            shift_sum += float((s.skill_logp - s.old_logp).sum())
            shift_n += len(s.response_ids)
    return shift_sum, shift_n


def teacher_skills(
    ctx: RLContext, batch: Batch, step: int, teacher: bool
) -> tuple[list[str | None], list[dict[int, str] | None] | None, list[str | None] | None, int]:
    """(episode skills, step skills, opd_contrast's other skills, how many leak_guard changed) of the batch: leak_guard,
    then `skill_control: shuffled`'s exchange for another task's skill, then opd_contrast's other skills, on the
    batch's final skills (every rank holds all of them)."""
    cfg, find_leaks = ctx.cfg, ctx.hooks.find_leaks
    skills, guarded = list(batch.skills), 0
    if cfg.leak_guard != "off" and find_leaks is not None:
        skills, guarded = guard_skills(skills, find_leaks(batch.episodes, skills), cfg.leak_guard)
    step_skills = batch.step_skills if cfg.skill_mode != "episode_only" else None
    if step_skills is not None and cfg.leak_guard != "off" and find_leaks is not None:
        step_skills, step_guarded = guard_step_skills(batch.episodes, step_skills, find_leaks, cfg.leak_guard)
        guarded += step_guarded
    if cfg.skill_control == "shuffled":  # the control: another task's skill in each episode's teacher prompt
        skills = other_skills(batch.episodes, skills, update_seed(cfg.seed, step, "control"), other_task=True)
    contrast = teacher and cfg.opd_contrast == "shuffled"
    others = contrast_skills(batch.episodes, skills, update_seed(cfg.seed, step, "contrast")) if contrast else None
    return skills, step_skills, others, guarded


def _renderer(ctx: RLContext) -> Callable[..., list[int]]:
    """The engine's chat rendering of a turn's user message (with its images' tokens expanded, for a vision-language
    policy): what the turn-samples' prompt ids are."""
    engine = ctx.engine

    def render(text: str, images: list[str] | None = None) -> list[int]:
        if not images:
            return list(engine.render([{"role": "user", "content": text}]))
        if ctx.vision_processor is None:
            raise UserError(
                "the episodes show images but the policy has no vision tower: use a vision-language model "
                "(`seed model init --preset tiny-vl`) or env_options '{observation: text}'"
            )
        ids = engine.render([{"role": "user", "content": content_parts(text)}])
        return expand_image_tokens(ids, ctx.models.lm.config.image_token_id, ctx.image_tokens(images))

    return render


def rescore_samples(
    samples: Sequence[TurnSample],
    *,
    old_fn: ScoreFn | None,
    ref_fn: ScoreFn | None,
    teacher_fn: ScoreFn | None = None,
    teacher: bool,
    max_tokens: int,
    pad_id: int,
    device: torch.device | str = "cpu",
    timings: dict[str, float] | None = None,
    sync_count: Callable[[int], int] | None = None,
    vision: VisionFn | None = None,
    padding_ids: Sequence[int] | None = None,
    contrast: bool = False,
) -> dict[str, int]:
    """Fill ℓ_old (when `old_fn`; None under old_logp reuse), ℓ_ref (when `ref_fn`) and ℓ_skill (when `teacher`, for
    samples with a skill prompt, scored by `teacher_fn`, default `old_fn`: π_old) in place, and ℓ_other
    (`contrast_logp`, when `teacher` and `contrast`, for samples with a contrast prompt: opd_contrast).
    `timings` (if given) receives seconds for 'old', 'ref', 'teacher' and 'contrast'. With `sync_count` (several ranks) every
    pass runs the same number of forwards on every rank. Returns the forwards run per pass (padding included) and
    this rank's padding forwards ("padding")."""
    counts: dict[str, int] = {}

    def counting(key: str) -> Callable[[int], int]:
        def fn(n: int) -> int:
            counts[key] = sync_count(n) if sync_count is not None else n
            counts["padding"] = counts.get("padding", 0) + counts[key] - n  # this rank's padding forwards
            return counts[key]

        return fn

    def timed(key: str, fn):
        t0 = time.perf_counter()
        result = fn()
        if timings is not None:
            timings[key] = timings.get(key, 0.0) + time.perf_counter() - t0
        return result

    kw = dict(max_tokens=max_tokens, pad_id=pad_id, device=device, vision=vision, padding_ids=padding_ids)
    plain = [(s.prompt_ids, s.response_ids) for s in samples]
    images = [s.images for s in samples]
    teacher_fn = teacher_fn if teacher_fn is not None else old_fn
    if old_fn is not None:
        scored = timed("old", lambda: score_responses(old_fn, plain, sync_count=counting("old"), images=images, **kw))
        for s, lp in zip(samples, scored, strict=True):
            s.old_logp = lp
    if ref_fn is not None:
        scored = timed("ref", lambda: score_responses(ref_fn, plain, sync_count=counting("ref"), images=images, **kw))
        for s, lp in zip(samples, scored, strict=True):
            s.ref_logp = lp
    if teacher:
        with_skill = [s for s in samples if s.skill_prompt_ids is not None]
        ctx = [(s.skill_prompt_ids, s.response_ids) for s in with_skill]
        teacher_images = [s.images for s in with_skill]  # the same images: only the text differs (the skill block)
        scored = timed(
            "teacher",
            lambda: score_responses(teacher_fn, ctx, sync_count=counting("teacher"), images=teacher_images, **kw),
        )
        for s, lp in zip(with_skill, scored, strict=True):
            s.skill_logp = lp
        with_other = [s for s in samples if s.contrast_prompt_ids is not None]
        if contrast:  # the extra teacher pass of opd_contrast (every rank runs as many forwards)
            ctx = [(s.contrast_prompt_ids, s.response_ids) for s in with_other]
            scored = timed(
                "contrast",
                lambda: score_responses(
                    teacher_fn, ctx, sync_count=counting("contrast"), images=[s.images for s in with_other], **kw
                ),
            )
            for s, lp in zip(with_other, scored, strict=True):
                s.contrast_logp = lp
    return counts
