"""The skill-leak audit (issue 19 §2): how many hindsight skills carry facts the policy cannot know when it acts.

What a leak is belongs to each environment, next to its reward (`Environment.leaks(trajectory, skill)`: search's
golden answer, WebShop's goal product, ALFWorld's numbered instances, Sokoban's moves, EZPoints' cards); this
module only counts (an oracle skill, which starts with `ORACLE_PREFIX`, leaks whole: it is privileged by design). It
is handed the environment object and imports none, so a stage and the rl loop can both use it:

    metrics.update(leak_metrics(env, trajectories, skills))  # skills[i]: episode i's skill, or None
    # -> {"skills/leak_frac": 0.25, "skills/leak_frac/<category>": ..., ...}
    metrics.update(leak_char_metrics(env, trajectories, skills))  # -> {"skills/leak_chars_frac": 0.04}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from seedcli.prompts import ORACLE_PREFIX

LEAK_FRAC = "skills/leak_frac"
LEAK_CHARS_FRAC = "skills/leak_chars_frac"


def find_leaks(env: Any, trajectories: Sequence, skills: Sequence[str | None]) -> list[list[tuple[int, int]] | None]:
    """Per episode, the spans of its skill that leak (sorted, overlaps merged), or None where it has no skill (None
    or blank). `env.leaks` may raise the environment's UserError when the data it needs is missing."""
    out: list[list[tuple[int, int]] | None] = []
    for traj, skill in zip(trajectories, skills, strict=True):
        if skill is None or not skill.strip():
            out.append(None)
            continue
        if skill.startswith(ORACLE_PREFIX):  # `--analyzer oracle`: privileged from end to end, whatever the rule finds
            out.append([(0, len(skill))])
            continue
        merged: list[tuple[int, int]] = []
        for start, end in sorted(env.leaks(traj, skill)):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        out.append(merged)
    return out


def leak_fraction(env: Any, trajectories: Sequence, skills: Sequence[str | None]) -> tuple[float, dict[str, float]]:
    """(share of skills with at least one leak, the same per trajectory category). Episodes without a skill are not
    counted; a category without one is absent; 0.0 when there is no skill at all."""
    leaked: dict[str, list[bool]] = {}
    for traj, spans in zip(trajectories, find_leaks(env, trajectories, skills), strict=True):
        if spans is not None:
            leaked.setdefault(traj.category, []).append(bool(spans))
    flags = [f for fs in leaked.values() for f in fs]
    frac = sum(flags) / len(flags) if flags else 0.0
    return frac, {c: sum(fs) / len(fs) for c, fs in sorted(leaked.items())}


def leak_metrics(env: Any, trajectories: Sequence, skills: Sequence[str | None]) -> dict[str, float]:
    """`skills/leak_frac` and `skills/leak_frac/<category>` (rounded to 4 places) for a metrics record."""
    frac, per_category = leak_fraction(env, trajectories, skills)
    return {LEAK_FRAC: round(frac, 4), **{f"{LEAK_FRAC}/{c}": round(f, 4) for c, f in per_category.items()}}


def leak_char_metrics(env: Any, trajectories: Sequence, skills: Sequence[str | None]) -> dict[str, float]:
    """`skills/leak_chars_frac`: the share of the skills' characters that lie inside a leaked span (how much of each
    skill names the answer, where `skills/leak_frac` counts the skills that name any of it); 0.0 without a skill."""
    leaked = total = 0
    for skill, spans in zip(skills, find_leaks(env, trajectories, skills), strict=True):
        if spans is not None:
            total += len(skill or "")
            leaked += sum(end - start for start, end in spans)
    return {LEAK_CHARS_FRAC: round(leaked / total, 4) if total else 0.0}
