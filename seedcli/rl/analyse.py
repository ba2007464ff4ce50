"""Phase 2 of an update (docs/design.md §1, Stage 2 step 2) and what is done to its skills before the teacher sees them:
π_old writes a hindsight skill per finished episode (`analyse`: greedy, the shared analysis prompt and parser; or the
static library, or the environment's rules analyzer), every rank's episodes and skills are gathered
(`gather_episodes`), then `leak_guard` masks or drops the spans of a skill the environment's leak rule finds
(`guard_skills`, `guard_step_skills`) and `opd_contrast: shuffled` draws another episode's skill to contrast with
(`contrast_skills`); the rescore phase applies both (rl/rescore.py).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence

from seedcli.analyzers.parse import SKIPPED_SUCCESS, TOO_SHORT
from seedcli.analyzers.policy import SelfAnalysis, analyze_with_engine
from seedcli.config import RLConfig
from seedcli.rl import distributed as D
from seedcli.rl.context import RLContext, update_seed

# --------------------------------------------------------------------------------------------- analyse


def failed_only(cfg: RLConfig, step: int) -> bool:
    """Whether update `step` analyses only the episodes it did not win: after `failed_only_after_steps` when that is
    set (every episode before), else as `analyze` says (the SEED code's `_should_seed_analyze_failed_only`)."""
    if cfg.failed_only_after_steps is not None:
        return step > cfg.failed_only_after_steps
    return cfg.analyze == "failed"


def in_rollout_analysis(ctx: RLContext, step: int, rollout: str) -> SelfAnalysis | None:
    """SEED's self-analysis served inside the rollout (`rollout: async`): a finished episode's analysis enters the
    same engine, with the same weights, the moment it ends (`SelfAnalysis`); None when π_old does not analyse, or
    analyses after the rollout (lockstep)."""
    cfg = ctx.cfg
    if ctx.plan.analyzer != "self" or rollout != "async":
        return None
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


def analyse(
    ctx: RLContext,
    episodes: Sequence,
    step: int,
    analyses: dict | None = None,
    in_rollout: SelfAnalysis | None = None,
) -> tuple[list[str | None], list[str | None]]:
    """(skill, rejection reason) of each of this rank's episodes: π_old writes a skill for each finished episode
    (greedy, the shared analysis prompt and parser; won ones are skipped when `failed_only`), or the static library
    answers, or the environment's rules or hindsight analyzer; None where there is none. `in_rollout`: the `in_rollout_analysis` that already analysed each episode
    as it ended (`rollout: async`). `analyses`, when given, receives the self-analyzer's ParsedSkill of each
    episode it analysed, by episode id: its step skills (`skill_mode`), prompt and raw answer."""
    cfg, plan = ctx.cfg, ctx.plan
    skills: list[str | None] = [None] * len(episodes)
    reasons: list[str | None] = ["analyzer_off"] * len(episodes)
    if plan.analyzer == "self" and episodes and in_rollout is not None:
        # rollout: async: each episode was analysed the moment it ended, while the others still played
        results = in_rollout.results
        parsed = [results[ep.episode_id] for ep in episodes]
        skills = [p.skill if p.kept else None for p in parsed]
        reasons = [None if p.kept else p.reason for p in parsed]
        if analyses is not None:
            analyses.update((ep.episode_id, p) for ep, p in zip(episodes, parsed, strict=True))
    elif plan.analyzer == "self" and episodes:
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
    elif plan.analyzer in ("rules", "hindsight") and episodes:
        # the environment's rules analyzer (or its hindsight analyzer: the episode replayed against its expert) writes
        # each finished episode's skill from its trajectory, as `seed annotate --analyzer rules|hindsight` writes it:
        # an offline stand-in for an external analyzer, no generation
        skip_won = failed_only(cfg, step)
        write = ctx.hooks.rules_skill if plan.analyzer == "rules" else ctx.hooks.hindsight_skill
        for i, ep in enumerate(episodes):
            if skip_won and ep.won:
                reasons[i] = SKIPPED_SUCCESS
                continue
            try:
                skill = write(ep)[1] if write is not None else ""
            except ValueError:  # the hindsight replay did not reproduce the episode (ReplayMismatch)
                skills[i], reasons[i] = None, "hindsight_replay_mismatch"
                continue
            kept = len(skill.split()) >= cfg.min_skill_words and bool(skill.strip())
            skills[i] = skill if kept else None
            reasons[i] = None if kept else TOO_SHORT
    elif plan.analyzer == "oracle" and episodes and ctx.hooks.oracle_skill is not None:
        # privileged information, not SEED: the environment's expert knowledge of each episode's task (the bound on
        # what the OPD channel can carry); the same text whatever the episode did, so `analyze` does not apply
        skills = [ctx.hooks.oracle_skill(ep) for ep in episodes]
        reasons = [None if s else "no_oracle_for_task" for s in skills]
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
    whose text differs (an identical text would contrast to zero); see `other_skills`."""
    return other_skills(episodes, skills, seed, other_task=False)


def other_skills(episodes: Sequence, skills: Sequence[str | None], seed: int, other_task: bool) -> list[str | None]:
    """For each episode with a skill, the skill of another episode whose text differs, drawn with
    `random.Random(seed)` in episode order: of the same category (`other_task` False: `opd_contrast`), or of another
    task (True: `skill_control: shuffled` and `seed probe`'s shuffled contexts); None where there is no such episode."""
    rng = random.Random(seed)
    out: list[str | None] = []
    for i, (ep, skill) in enumerate(zip(episodes, skills, strict=True)):
        pool = [
            other
            for j, (e, other) in enumerate(zip(episodes, skills, strict=True))
            if skill
            and j != i
            and other
            and other != skill
            and (e.task_id != ep.task_id if other_task else e.category == ep.category)
        ]
        out.append(rng.choice(pool) if pool else None)
    return out
