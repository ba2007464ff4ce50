"""The update's metrics.jsonl record (docs/design.md §1, Stage 2): what the phases returned (the rewards the turn-samples
were scored with, the trainer's losses, the refresh's proof), summed over the ranks where they differ, and the seconds
and GPU memory of each phase (`PhaseLog`).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from seedcli.analyzers.parse import SKIPPED_SUCCESS
from seedcli.rl import distributed as D
from seedcli.rl.advantages import step_group_metrics
from seedcli.rl.analyse import Batch
from seedcli.rl.context import RLContext
from seedcli.rl.losses import opd_gate_stats
from seedcli.rl.optimize import LossWeights, UpdateResult
from seedcli.rl.rescore import Rescored
from seedcli.rl.samples import TurnSample

GIB = 1024**3


class PhaseLog:
    """Seconds per phase (`timing_s/<phase>`) and, on CUDA, GPU memory at each phase's end (`mem/<phase>/...`)."""

    def __init__(self, info, on_phase: Callable[[str], None] | None = None) -> None:
        self.info = info
        self.timing: dict[str, float] = {}
        self.mem: dict[str, float] = {}
        self.on_phase = on_phase  # told each phase's name as it begins (the stage's progress line)

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        if self.on_phase is not None:
            self.on_phase(phase)
        t0 = time.perf_counter()
        yield
        self.timing[phase] = time.perf_counter() - t0

    def memory(self, phase: str) -> None:
        phase_memory(self.info, phase, self.mem)


def phase_memory(info, phase: str, out: dict[str, float]) -> None:
    """GPU memory of the phase that just ended (CUDA only): the trainer's peak allocated and reserved bytes (torch's
    allocator) and the device's used memory now (vLLM's pool included); then reset the peaks for the next phase."""
    if info.device.type != "cuda":
        return
    free, total = torch.cuda.mem_get_info(info.device)
    out[f"mem/{phase}/peak_allocated_gib"] = torch.cuda.max_memory_allocated(info.device) / GIB
    out[f"mem/{phase}/peak_reserved_gib"] = torch.cuda.max_memory_reserved(info.device) / GIB
    out[f"mem/{phase}/device_used_gib"] = (total - free) / GIB
    torch.cuda.reset_peak_memory_stats(info.device)


SUBPHASES = ("rescore_teacher", "rescore_contrast")  # timed inside rescore; logged beside it


def take_prefix_tally(models) -> tuple[float, float]:
    """The actor's and the reference's (tokens scored, tokens a shared prefix saved) since the last call."""
    scored = shared = 0.0
    for model in (models.train_model, models.ref_model):
        scorer = D.unwrap(model) if model is not None else None  # DDP keeps the scorer inside; FSDP2 is the scorer
        if scorer is not None:
            a, b = scorer.take_tally()
            scored, shared = scored + a, shared + b
    return scored, shared


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
    weights: LossWeights,
    prefix_tally: tuple[float, float] = (0.0, 0.0),
) -> dict[str, Any]:
    """The update's metrics.jsonl record (every rank computes it; rank 0 writes). `episode_summary` is
    `seedcli.rollout.episode_metrics` of the batch's episodes; `weights` the update's loss coefficients;
    `prefix_tally` this rank's (tokens scored, tokens a shared prefix saved) in the update (`take_prefix_tally`)."""
    info, plan, episodes, samples = ctx.info, ctx.plan, batch.episodes, scored.samples
    active, n_gate = _gate_active_sum(scored.mine, weights.opd_beta)
    scored_tokens, shared_tokens = prefix_tally
    stats = torch.tensor(
        [
            scored.shift_sum, float(scored.shift_n), float(scored.forwards.get("padding", 0)), active, n_gate,
            scored_tokens, shared_tokens,
        ],  # fmt: skip
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
        "reward/mean": sum(scored.episode_rewards) / max(len(episodes), 1),
        "reward/score_mean": sum(e.score for e in episodes) / max(len(episodes), 1),
        "reward/turn_score_mean": sum(s.score for s in samples) / max(len(samples), 1),
        # turn-samples with advantage 0 (their group's turn scores were all equal: no GRPO signal) and groups whose
        # episodes did not all end alike (won and lost): how much of the batch can teach anything
        "adv/zero_frac": sum(s.advantage == 0.0 for s in samples) / max(len(samples), 1),
        "adv/mixed_group_frac": _mixed_group_frac(episodes),
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
        "actor/lr": result.metrics.get("actor/lr", ctx.cfg.lr),  # the optimizer's (lr_warmup_steps: lower at first)
        "rollout/turn_samples_trained": scored.trained if scored.trained >= 0 else len(samples),  # zero_adv drop
        "opd/valid_skill_frac": kept / max(len(episodes), 1) if plan.analyzer != "none" else 0.0,
        "opd/shift_mean": stats[0] / stats[1] if stats[1] else 0.0,
        # the SEED code's actor/opd_gate_active_ratio, here at π_old (the rescore pass): share of tokens with g > 0.5
        "opd/gate_active_frac": stats[3] / stats[4] if stats[4] else 0.0,
        # the SEED code's actor/opd_teacher_gap_mean: mean of ℓ_skill − ℓ_θ over OPD tokens (the trainer's delta)
        "opd/teacher_gap_mean": result.metrics.get("opd/delta_mean", 0.0),
        # not in the SEED code: each reply's largest |ℓ_skill − ℓ_θ|, averaged over the replies with a skill (the
        # mean above dilutes the one token that decides a short action ~60-fold, as actor/kl does)
        "opd/teacher_gap_absmax": result.metrics.get("opd/delta_absmax", 0.0),
        "opd/coef": weights.opd_coef,
        "opd/beta": weights.opd_beta,
        **{f"analyzer/rejected/{k}": v for k, v in rejected.items()},
        **{f"timing_s/{k}": v for k, v in timing.items()},
        "perf/tokens_per_s": tokens_all / elapsed if elapsed > 0 else 0.0,
        "perf/gen_tokens_per_s": tokens_gen / timing["rollout"] if timing["rollout"] > 0 else 0.0,
        "dist/padding_forwards_rescore": stats[2],
        "rescore/pad_forward_frac": stats[2] / forwards_all if forwards_all else 0.0,
        # of the tokens the update and re-scoring forwards covered, the share a micro-batch's common prefix covered
        # once for all its rows (`share_prefix`): the forward compute saved
        "perf/prefix_shared_frac": stats[6] / stats[5] if stats[5] else 0.0,
        **sync,
        **log.mem,
    }
    if ctx.cfg.leak_guard != "off":
        record["skills/leak_guarded"] = scored.leak_guarded
    if ctx.cfg.skill_mode != "episode_only":
        record.update(step_skill_metrics(batch, samples))
    if ctx.cfg.step_advantage == "gigpo":  # GiGPO's step-group sizes (gigpo/state_group/*, the SEED code's names)
        record.update(step_group_metrics([s.step_group for s in samples]))
    if plan.analyzer in ("self", "rules", "hindsight"):
        # won episodes `analyze: failed` left out (the SEED code's skipped_success_traj_count)
        record["analyzer/skipped_success"] = sum(r == SKIPPED_SUCCESS for r in batch.reasons)
    if result.cause:
        record["actor/skip_cause"] = result.cause
    audit = ctx.hooks.audit_skills  # skills/leak_frac: hindsight facts in the skills (the stage hands it in)
    if audit is not None and plan.analyzer != "none":
        record.update(audit(batch.episodes, batch.skills))
    return record


def _mixed_group_frac(episodes: Sequence) -> float:
    """Share of GRPO groups (episodes of one game) with both a won and a lost episode."""
    outcomes: dict[str, set[bool]] = {}
    for e in episodes:
        outcomes.setdefault(e.group_id, set()).add(bool(e.won))
    return sum(len(o) == 2 for o in outcomes.values()) / max(len(outcomes), 1)


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
    scored = [s for s in mine if s.skill_logp is not None]
    if not scored:
        return 0.0, 0.0
    teacher = torch.cat([s.skill_logp.reshape(-1) for s in scored]).double()  # [N]
    student = torch.cat([s.old_logp.reshape(-1) for s in scored]).double()  # [N]
    stats = opd_gate_stats(student, teacher, torch.ones_like(student), beta)
    return float(stats["opd/gate_active_frac"]) * student.numel(), float(student.numel())


STALL_UPDATES = 3  # updates in a row without a won episode before the run says so


class StallWatch:
    """Says when `STALL_UPDATES` updates in a row had no won episode: every group's episodes then score alike but
    for invalid-reply penalties, GRPO's episode advantage has nothing to compare and (zero_adv=drop) those updates
    train next to nothing, so a policy that stopped winning does not come back by itself. Once per such streak."""

    def __init__(self, limit: int = STALL_UPDATES):
        self.limit = limit
        self.streak = 0
        self.last_win: int | None = None

    def observe(self, step: int, record: dict[str, Any]) -> str | None:
        """The warning to print after update `step` (its metrics `record`), or None."""
        if record.get("rollout/success_rate", 0.0) > 0:
            self.streak, self.last_win = 0, step
            return None
        self.streak += 1
        if self.streak != self.limit:
            return None
        opd = record.get("opd/token_frac") or 0.0
        since = f"the last won episode was in update {self.last_win}" if self.last_win else "none won this session"
        trains = (
            f" (OPD still trains {100 * opd:.0f}% of the response tokens)" if opd else ", so they train next to nothing"
        )
        return (
            f"updates {step - self.limit + 1}-{step} won no episode ({since}): GRPO's advantage has no outcome to "
            f"compare{trains}; the policy may have collapsed. `seed eval --from RUN/checkpoints/step_N` tells an "
            "earlier checkpoint from this one; a lower lr or larger groups make such a fall rarer"
        )
