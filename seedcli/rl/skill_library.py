"""The static skill library (`--analyzer static:FILE`, the SDAR / static-library ablations): skills per category of
an environment from a fixed file, instead of the live analyzer. No torch here, and no environment: the stage hands
in the environment's categories (`SkillCategories`).

Accepted files: a JSON object {category: skill or [skills]}, a JSON list or JSONL of {"category" (or "task_type"),
"skill"} records, or an annotate run's skills.jsonl (kept records' `episode_skill`). Category names go through the
environment's `canonical_category` (ALFWorld accepts both `pick` and `pick_and_place_simple`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from seedcli.errors import UserError
from seedcli.rl.sampler import hash_seed

MIN_SKILL_WORDS = 5
_KEYS = ("category", "task_type")


@dataclass(frozen=True)
class SkillCategories:
    """An environment's categories as a skill library sees them (the stage builds it from the environment):
    `canonical(name)` is the category a user-written name means (aliases allowed) or None; `known`, `noun` and
    `owner` word the error for an unknown name ("unknown task type 'x' for ALFWorld; use one of pick, ...")."""

    canonical: Callable[[str], str | None]
    known: tuple[str, ...] = ()
    noun: str = "category"
    owner: str = "this environment"


@dataclass
class SkillLibrary:
    """Skills per category from a fixed file; `skill_for` picks one per episode (stable across runs)."""

    path: str
    skills: dict[str, list[str]]
    canonical: Callable[[str], str | None] = field(default=lambda name: None, repr=False, compare=False)

    def skill_for(self, category: str, episode_id: str) -> str | None:
        options = self.skills.get(self.canonical(category) or category)
        if not options:
            return None
        return options[hash_seed("static-skill", episode_id) % len(options)]


def load_skill_library(path: str | Path, categories: SkillCategories) -> SkillLibrary:
    """Read `static:FILE`; every key must name one of `categories`."""
    path = Path(path)
    if path.is_dir() and (path / "skills.jsonl").exists():
        path = path / "skills.jsonl"
    if not path.is_file():
        raise UserError(
            f"--analyzer static:{path}: file not found; pass a JSON/JSONL skill library (e.g. data/static_skills.json) "
            "or an annotate run's skills.jsonl"
        )
    text = path.read_text(encoding="utf-8")
    records: list[tuple[str, object, str]] = []  # (category, skill, where)
    try:
        data = json.loads(text)
        if isinstance(data, dict):
            for k, v in data.items():
                for s in v if isinstance(v, list) else [v]:
                    records.append((k, s, f"key '{k}'"))
        elif isinstance(data, list):
            for i, rec in enumerate(data):
                records.extend(_record(rec, f"item {i}", path))
        else:
            raise UserError(f"{path}: expected a JSON object or list of skills, got {type(data).__name__}")
    except json.JSONDecodeError:
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise UserError(f"{path}:{lineno}: not valid JSON; a skill library is JSON or JSON Lines") from None
            records.extend(_record(rec, f"line {lineno}", path))

    skills: dict[str, list[str]] = defaultdict(list)
    for category, skill, where in records:
        canon = categories.canonical(str(category))
        if canon is None:
            known = ", ".join(categories.known) or "the categories of its tasks"
            raise UserError(
                f"{path} ({where}): unknown {categories.noun} '{category}' for {categories.owner}; use one of {known}"
            )
        if not isinstance(skill, str) or len(skill.split()) < MIN_SKILL_WORDS:
            raise UserError(f"{path} ({where}): the skill must be text of at least {MIN_SKILL_WORDS} words")
        if " ".join(skill.split()) not in skills[canon]:
            skills[canon].append(" ".join(skill.split()))
    if not skills:
        raise UserError(f"{path}: no skills found; see data/static_skills.json for the format")
    return SkillLibrary(str(path), dict(skills), categories.canonical)


def _record(rec: object, where: str, path: Path) -> list[tuple[str, object, str]]:
    key = next((k for k in _KEYS if isinstance(rec, dict) and k in rec), None)
    if key is None:
        raise UserError(f"{path} ({where}): expected an object with 'category' and 'skill' (or 'episode_skill')")
    if rec.get("reason"):  # a rejected annotate record
        return []
    skill = rec.get("skill", rec.get("episode_skill"))
    if skill is None:
        return []
    return [(rec[key], skill, where)]


def default_library_path(env: str) -> Path:
    """The shipped library SDAR uses by default: data/static_skills.json (ALFWorld) or data/static_skills_<env>.json."""
    data = Path(__file__).resolve().parents[2] / "data"
    return data / ("static_skills.json" if env == "alfworld" else f"static_skills_{env}.json")
