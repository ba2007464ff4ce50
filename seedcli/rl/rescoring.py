"""Turn-samples and their re-scoring (DESIGN.md §1, Stage 2 steps 1, 3, 4).

Every turn of every episode becomes one turn-sample: prompt ids = the exact ids the policy saw (the chat template
applied to that turn's user message), response ids = the tokens it sampled. Re-scoring runs the same response
tokens through a model under a context, without gradient: ℓ_old (ordinary prompt, π_old), ℓ_skill (the prompt with
the skill block inserted after the task line, π_old) and ℓ_ref (the frozen starting model). Batches are packed by
length (`pack_by_length`) and right-padded only to the longest sample of their micro-batch.

Also here: the static skill library (`--analyzer static:FILE`, the SDAR / static-library ablations) and the probe
that proves the rollout engine holds the trainer's weights.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from seedcli.errors import UserError
from seedcli.prompts import insert_skill
from seedcli.rl.advantages import group_advantages, turn_scores
from seedcli.rl.logprobs import pack_by_length
from seedcli.rl.sampler import hash_seed

# ALFWorld's six task types (the game folder prefixes) and the short names users tend to write.
TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
_ALIASES = {
    "pick": "pick_and_place_simple",
    "look": "look_at_obj_in_light",
    "clean": "pick_clean_then_place_in_recep",
    "heat": "pick_heat_then_place_in_recep",
    "cool": "pick_cool_then_place_in_recep",
    "pick_two": "pick_two_obj_and_place",
    "pick2": "pick_two_obj_and_place",
}
MIN_SKILL_WORDS = 5

# A score function: (input_ids [B, T], attention_mask [B, T], response_mask [B, T]) → per-token log-probs [B, T].
ScoreFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


# --------------------------------------------------------------------------------------------- static skills


@dataclass
class SkillLibrary:
    """Skills per task type from a fixed file; `skill_for` picks one per episode (stable across runs)."""

    path: str
    skills: dict[str, list[str]]

    def skill_for(self, task_type: str, episode_id: str) -> str | None:
        options = self.skills.get(canonical_task_type(task_type) or task_type)
        if not options:
            return None
        return options[hash_seed("static-skill", episode_id) % len(options)]


def canonical_task_type(name: str) -> str | None:
    """The ALFWorld task type for a folder prefix or a short alias (pick, look, clean, heat, cool, pick_two)."""
    key = name.strip().lower().replace("-", "_").replace(" ", "_")
    if key in TASK_TYPES:
        return key
    return _ALIASES.get(key)


def load_skill_library(path: str | Path) -> SkillLibrary:
    """Read `static:FILE`: a JSON object {task_type: skill or [skills]}, a JSON list or JSONL of
    {"task_type", "skill"} records, or an annotate run's skills.jsonl (kept records' `episode_skill`)."""
    path = Path(path)
    if path.is_dir() and (path / "skills.jsonl").exists():
        path = path / "skills.jsonl"
    if not path.is_file():
        raise UserError(
            f"--analyzer static:{path}: file not found; pass a JSON/JSONL skill library (e.g. data/static_skills.json) "
            "or an annotate run's skills.jsonl"
        )
    text = path.read_text(encoding="utf-8")
    records: list[tuple[str, object, str]] = []  # (task type, skill, where)
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
    for task_type, skill, where in records:
        canon = canonical_task_type(str(task_type))
        if canon is None:
            raise UserError(
                f"{path} ({where}): unknown task type '{task_type}'; use one of {', '.join(TASK_TYPES)} "
                f"(or {', '.join(sorted(_ALIASES))})"
            )
        if not isinstance(skill, str) or len(skill.split()) < MIN_SKILL_WORDS:
            raise UserError(f"{path} ({where}): the skill must be text of at least {MIN_SKILL_WORDS} words")
        if skill.strip() not in skills[canon]:
            skills[canon].append(" ".join(skill.split()))
    if not skills:
        raise UserError(f"{path}: no skills found; see data/static_skills.json for the format")
    return SkillLibrary(str(path), dict(skills))


def _record(rec: object, where: str, path: Path) -> list[tuple[str, object, str]]:
    if not isinstance(rec, dict) or "task_type" not in rec:
        raise UserError(f"{path} ({where}): expected an object with 'task_type' and 'skill' (or 'episode_skill')")
    if rec.get("reason"):  # a rejected annotate record
        return []
    skill = rec.get("skill", rec.get("episode_skill"))
    if skill is None:
        return []
    return [(rec["task_type"], skill, where)]


# --------------------------------------------------------------------------------------------- turn-samples


@dataclass
class TurnSample:
    """One training sample: one turn of one episode, and the scores re-scoring fills in (each [R] fp32, CPU)."""

    episode_index: int
    turn_index: int
    group_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    skill_prompt_ids: list[int] | None
    score: float
    advantage: float = 0.0
    old_logp: torch.Tensor | None = field(default=None, repr=False)
    ref_logp: torch.Tensor | None = field(default=None, repr=False)
    skill_logp: torch.Tensor | None = field(default=None, repr=False)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def skill_length(self) -> int:
        return len(self.skill_prompt_ids or ()) + len(self.response_ids)


def build_turn_samples(
    episodes: Sequence,
    skills: Sequence[str | None],
    render: Callable[[str], list[int]],
    *,
    with_skill_context: bool = True,
    win_reward: float = 10.0,
    invalid_penalty: float = 0.1,
) -> list[TurnSample]:
    """Turn-samples of `episodes` (Trajectory records) with GRPO advantages: each turn scores
    `win_reward·won − invalid_penalty·invalid`, normalised over all turn-samples of its group. `skills[i]` is
    episode i's skill (None: no valid skill, so no teacher context and no OPD on its tokens). Turns without
    response tokens are dropped."""
    samples: list[TurnSample] = []
    for ei, (ep, skill) in enumerate(zip(episodes, skills, strict=True)):
        for ti, turn in enumerate(ep.turns):
            if not turn.response_ids:
                continue
            skill_ids = render(insert_skill(turn.prompt, skill)) if (skill and with_skill_context) else None
            samples.append(
                TurnSample(
                    episode_index=ei,
                    turn_index=ti,
                    group_id=ep.group_id,
                    prompt_ids=list(render(turn.prompt)),
                    response_ids=list(turn.response_ids),
                    skill_prompt_ids=list(skill_ids) if skill_ids is not None else None,
                    score=turn_scores(ep.won, turn.valid, win_reward=win_reward, invalid_penalty=invalid_penalty),
                )
            )
    if samples:
        adv = group_advantages(
            torch.tensor([s.score for s in samples], dtype=torch.float64), [s.group_id for s in samples]
        )
        for s, a in zip(samples, adv.tolist(), strict=False):
            s.advantage = float(a)
    return samples


def pad_right(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B, T], attention_mask [B, T]) with each row right-padded to the longest."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


@torch.no_grad()
def score_responses(
    score_fn: ScoreFn,
    contexts: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    max_tokens: int,
    pad_id: int,
    device: torch.device | str = "cpu",
) -> list[torch.Tensor]:
    """Log-prob of each response token given its prompt, for (prompt_ids, response_ids) pairs; returns one fp32
    CPU tensor [R_i] per pair. Pairs are packed into micro-batches by length (count × longest ≤ `max_tokens`)."""
    out: list[torch.Tensor | None] = [None] * len(contexts)
    lengths = [len(p) + len(r) for p, r in contexts]
    for batch in pack_by_length(lengths, max_tokens):
        rows = [list(contexts[i][0]) + list(contexts[i][1]) for i in batch]
        ids, attn = pad_right(rows, pad_id)
        resp = torch.zeros_like(ids, dtype=torch.float32)  # [B, T]
        for b, i in enumerate(batch):
            p, r = len(contexts[i][0]), len(contexts[i][1])
            resp[b, p : p + r] = 1
        logp = score_fn(ids.to(device), attn.to(device), resp.to(device)).float().cpu()  # [B, T]
        for b, i in enumerate(batch):
            p, r = len(contexts[i][0]), len(contexts[i][1])
            out[i] = logp[b, p : p + r].clone()
    return out  # type: ignore[return-value]


def rescore_samples(
    samples: Sequence[TurnSample],
    *,
    old_fn: ScoreFn,
    ref_fn: ScoreFn | None,
    teacher: bool,
    max_tokens: int,
    pad_id: int,
    device: torch.device | str = "cpu",
    timings: dict[str, float] | None = None,
) -> None:
    """Fill ℓ_old, ℓ_ref (when `ref_fn`) and ℓ_skill (when `teacher`, for samples with a skill prompt) in place.
    `timings` (if given) receives seconds for 'old', 'ref' and 'teacher'."""
    import time

    def timed(key: str, fn):
        t0 = time.perf_counter()
        result = fn()
        if timings is not None:
            timings[key] = timings.get(key, 0.0) + time.perf_counter() - t0
        return result

    kw = dict(max_tokens=max_tokens, pad_id=pad_id, device=device)
    plain = [(s.prompt_ids, s.response_ids) for s in samples]
    for s, lp in zip(samples, timed("old", lambda: score_responses(old_fn, plain, **kw)), strict=False):
        s.old_logp = lp
    if ref_fn is not None:
        for s, lp in zip(samples, timed("ref", lambda: score_responses(ref_fn, plain, **kw)), strict=False):
            s.ref_logp = lp
    if teacher:
        with_skill = [s for s in samples if s.skill_prompt_ids is not None]
        ctx = [(s.skill_prompt_ids, s.response_ids) for s in with_skill]
        for s, lp in zip(with_skill, timed("teacher", lambda: score_responses(old_fn, ctx, **kw)), strict=False):
            s.skill_logp = lp


# --------------------------------------------------------------------------------------------- weight-sync probe


class WeightSyncError(UserError):
    """The rollout engine's log-probs disagree with the trainer's after a refresh: its rollouts would be stale."""


def probe_agreement(engine_logp: Sequence[float], trainer_logp: Sequence[float]) -> tuple[float, float]:
    """(mean, max) absolute difference of two per-token log-prob lists of the same probe."""
    if len(engine_logp) != len(trainer_logp) or not trainer_logp:
        raise WeightSyncError(
            f"weight-sync probe: the engine scored {len(engine_logp)} tokens, the trainer {len(trainer_logp)}; "
            "the engine and the trainer disagree on the probe's tokens"
        )
    diffs = [abs(float(a) - float(b)) for a, b in zip(engine_logp, trainer_logp, strict=False)]
    if any(math.isnan(d) for d in diffs):
        return math.inf, math.inf
    return sum(diffs) / len(diffs), max(diffs)


def check_probe(engine_logp: Sequence[float], trainer_logp: Sequence[float], tol: float, step: int) -> dict[str, float]:
    """Raise WeightSyncError when the mean absolute difference exceeds `tol`; else the sync metrics."""
    mean_diff, max_diff = probe_agreement(engine_logp, trainer_logp)
    if not mean_diff <= tol:
        raise WeightSyncError(
            f"update {step}: after the weight refresh the rollout engine's log-probs on the probe differ from the "
            f"trainer's by {mean_diff:.4g} on average (max {max_diff:.4g}, tolerance {tol:g}); the engine did not "
            "receive the new weights, so its rollouts would be stale. Stopped; resume with --resume once fixed "
            "(raise sync_tol=... only if the difference is numerical noise of a lower-precision engine)"
        )
    return {"sync/probe_mean_abs_diff": mean_diff, "sync/probe_max_abs_diff": max_diff}
