"""The rl run's logs, metrics.jsonl and samples.jsonl: one record per update appended and fsynced (a non-finite
value is written as the string "nan", "inf" or "-inf", never as null), and cut back to a checkpoint's step when a
run resumes. Also what a sampled update logs beside its metrics (`sample_record`: one episode, token by token) and
the analysis dumps (`write_dumps`, `dump_analyses`)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import orjson

from seedcli.artifacts import atomic_write_bytes
from seedcli.prompts import analysis_prompt_version, is_visual
from seedcli.records import visible_floats
from seedcli.rl import distributed as D
from seedcli.rl.analyse import Batch
from seedcli.rl.context import RLContext
from seedcli.rl.rescore import Rescored

ANALYSES_DIR = "analyses"
TEACHER_PROMPTS_DIR = "teacher_prompts"


def read_records_upto(path: Path, step: int) -> list[dict]:
    """Records of `path` whose step ≤ `step` (a resumed run forgets what came after its checkpoint)."""
    if not path.exists():
        return []
    keep = []
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # a half-written last line from a killed run
        if isinstance(rec, dict) and rec.get("step", math.inf) <= step:
            keep.append(rec)
    return keep


def rewrite_records(path: Path, records: list[dict]) -> None:
    """Replace `path` (atomically) with `records`, one JSON line each."""
    atomic_write_bytes(path, b"".join(_dumps(r) for r in records))


def append_record(path: Path, record: dict) -> None:
    """Append one record and fsync: a killed run keeps every update it logged."""
    with open(path, "ab") as fh:
        fh.write(_dumps(record))
        fh.flush()
        os.fsync(fh.fileno())


def _dumps(record: dict) -> bytes:
    return orjson.dumps(visible_floats(record)) + b"\n"


# --------------------------------------------------------------------------------------------- what an update logs


def choose_sample_episode(episodes: list, skills: list[str | None]) -> int:
    """The episode whose score shift is logged: a won one with a skill, else any with a skill, else the first."""
    for want_won in (True, False):
        for i, (ep, skill) in enumerate(zip(episodes, skills, strict=False)):
            if skill and (ep.won or not want_won):
                return i
    return 0


def sample_record(
    ctx: RLContext, step: int, batch: Batch, scored: Rescored, entropy_threshold: float | None = None
) -> dict | None:
    """The samples.jsonl record of a sampled update (rank 0; every rank calls it and joins the gather): one episode
    (`choose_sample_episode`) with its skill (and the spans of it the leak rule finds) and, per response token, ℓ_old,
    ℓ_skill, the shift, the gate and the entropy at θ (with the update's top-20% `entropy_threshold`). None on other
    ranks and when the update has no episode."""
    if not batch.episodes:
        return None
    chosen = choose_sample_episode(batch.episodes, batch.skills)
    mine = [
        (s.turn_index, s.response_ids, s.old_logp.tolist(), _tolist(s.skill_logp), s.advantage, _tolist(s.entropy))
        for s in scored.mine
        if s.episode_index == chosen
    ]
    rows = [row for part in D.all_gather_object(mine, ctx.info) for row in part]
    if not ctx.info.is_main:
        return None
    episode, beta = batch.episodes[chosen], ctx.plan.opd_beta
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
    find_leaks = ctx.hooks.find_leaks
    leaks = find_leaks([episode], [skill])[0] if (skill and find_leaks) else None
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


def write_dumps(ctx: RLContext, step: int, batch: Batch, scored: Rescored) -> list[Path]:
    """`dump_analyses` (rank 0): `analyses/step_NNNNNN.jsonl`, one line per episode of the update (its analysis
    prompt, the raw answer, the parsed episode and step skills, the rejection reason), and
    `teacher_prompts/step_NNNNNN.jsonl`, one line per turn-sample with a teacher prompt (the prompt with the
    skill inserted, after leak_guard); turns are numbered from 1, as in samples.jsonl. Returns the files written."""
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
