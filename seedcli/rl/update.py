"""One SEED update, the paper's Algorithm 1 (docs/design.md §1, Stage 2 steps 1-5 and the weight refresh), phase by phase:

  roll out   π_old plays this rank's share of the games, `group` times each (the stage's `Rollout`: seedcli.rollout
             knows the environments, rl/ does not); under `rollout: async` π_old analyses each episode as it ends
  analyse    π_old writes a hindsight skill per finished episode, greedy, or the static library answers; every
             rank's episodes and skills are gathered (rl/analyse.py)
  rescore    leak_guard and opd_contrast on the skills; the turn-samples, scored `win·won − invalid_penalty·invalid`
             and group-normalised (rl/samples.py); their response tokens re-scored without gradient under the
             ordinary prompt (ℓ_old), the skill-augmented prompt (ℓ_skill) and the frozen starting model (ℓ_ref)
             (rl/rescore.py)
  update     one epoch of dual-clip PPO + k3 KL − entropy + λ_opd·OPD on θ over the mini-batches (rl/optimize.py,
             the loss terms in rl/losses.py)
  refresh    π_old ← θ: the rollout engine gets the new weights and proves it holds them, exact checksums and a fixed
             probe (rl/weight_sync.py)

then the metrics.jsonl record (rl/metrics.py) and, on sampled updates, the samples.jsonl record (rl/run_log.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from seedcli.rl.analyse import analyse, gather_episodes, in_rollout_analysis
from seedcli.rl.context import RLContext, loss_weights
from seedcli.rl.metrics import PhaseLog, take_prefix_tally, update_metrics
from seedcli.rl.optimize import train_update
from seedcli.rl.rescore import rescore, skill_shift
from seedcli.rl.run_log import sample_record, write_dumps
from seedcli.rl.weight_sync import sleep_engine


class Rollout(Protocol):
    """How this rank plays games: what the stage hands the update (it knows the environments; rl/ does not)."""

    def play(self, games: list, step: int, followups: Any) -> list:
        """This rank's episodes of update `step`: its share of `games`, `group` times each, played by π_old;
        `followups` (an `in_rollout_analysis`, or None) analyses each episode the moment it ends. A rollout may
        also have `phase(step, name)`, told as each phase of the update begins (the stage's progress line)."""
        ...

    def summary(self, episodes: Sequence) -> dict:
        """`seedcli.rollout.episode_metrics` of `episodes`: success by category, length, invalid rate."""
        ...


def update(ctx: RLContext, rollout: Rollout, sampler: Any, step: int, want_sample: bool) -> tuple[dict, dict | None]:
    """One update: returns the metrics record and, on sampled updates (`want_sample`), the samples.jsonl record
    (rank 0; None on the other ranks)."""
    cfg, info = ctx.cfg, ctx.info
    # λ_opd of this update: the plan's, or 0 outside opd_start/stop_after_steps or once the teacher retired
    # (then no teacher pass either)
    retired_at = ctx.retirement.retired_at if ctx.retirement is not None else None
    weights = loss_weights(cfg, ctx.plan, step, retired_at)
    phase = getattr(rollout, "phase", None)
    log = PhaseLog(info, on_phase=(lambda name: phase(step, name)) if phase is not None else None)
    with log.timed("rollout"):  # 1. π_old plays this rank's share of the games, `group` times each
        games = sampler.next_batch()
        followups = in_rollout_analysis(ctx, step, ctx.base_settings.rollout)
        mine = rollout.play(games, step, followups)
    log.memory("rollout")
    with log.timed("analyze"):  # 2. π_old writes a hindsight skill per finished episode, or the static library
        analyses: dict = {}  # the self-analyzer's parsed answers: step skills, prompts and answers for the dumps
        skills, reasons = analyse(ctx, mine, step, analyses, in_rollout=followups)
    batch = gather_episodes(mine, skills, reasons, info, analyses, keep_text=cfg.dump_analyses)
    log.memory("analyze")
    sleep_engine(ctx.engine)  # vLLM: free the KV cache and weights for training; a no-op for the hf engine
    log.memory("sleep")
    with log.timed("rescore"):  # 3. ℓ_old, ℓ_skill and ℓ_ref of this rank's turn-samples, without gradient
        scored = rescore(ctx, batch, step, weights)
    log.memory("rescore")
    write_dumps(ctx, step, batch, scored)  # dump_analyses: this update's analyses and teacher prompts (rank 0)
    log.timing["rescore_teacher"] = scored.teacher_s
    if cfg.opd_contrast != "none":  # the extra teacher pass under another episode's skill
        log.timing["rescore_contrast"] = scored.contrast_s
    with log.timed("update"):  # 4-5. group advantages; one epoch of PPO + KL − entropy + λ·OPD on θ
        models = ctx.models
        set_lr(models.optimizer, warmup_lr(cfg.lr, cfg.lr_warmup_steps, step))
        result = train_update(
            models.train_model,
            models.optimizer,
            scored.samples,
            scored.minibatches,
            info,
            weights=weights,
            micro_tokens=cfg.micro_batch_tokens,
            grad_clip=cfg.grad_clip,
            pad_id=ctx.pad_id,
            use_ref=models.ref_model is not None,
            vision=ctx.vision_inputs if ctx.vision_processor is not None else None,
            padding_ids=ctx.padding_ids(),
            step=step,
        )
    log.memory("update")
    if scored.reused_old:  # ℓ_old came from the update's own forward: the shift ℓ_skill − ℓ_old is counted now
        scored.shift_sum, scored.shift_n = skill_shift(scored.mine)
    with log.timed("sync"):  # π_old ← θ: refresh the rollout engine and prove it holds the new weights
        sync = ctx.sync.refresh(step)
    log.memory("refresh")
    record = update_metrics(
        ctx, step, epoch=sampler.epoch, games=len(games), batch=batch, episode_summary=rollout.summary(batch.episodes),
        scored=scored, result=result, sync=sync, log=log, weights=weights, prefix_tally=take_prefix_tally(ctx.models),
    )  # fmt: skip
    threshold = result.metrics.get("actor/entropy_top20_threshold")
    return record, sample_record(ctx, step, batch, scored, threshold) if want_sample else None


def warmup_lr(lr: float, warmup_steps: int, step: int) -> float:
    """The lr of update `step` (1-based) under `lr_warmup_steps`: lr·step/n for the first n updates, then lr."""
    return lr * min(1.0, step / warmup_steps) if warmup_steps > 0 else lr


def set_lr(optimizer: Any, lr: float) -> None:
    """Every parameter group of `optimizer` trains at `lr` (AdamW's state is untouched)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
