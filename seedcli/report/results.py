"""results.json of an eval run: its schema, how `seed eval` builds it from episodes, and how it is read back."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from seedcli.envs import env_class
from seedcli.envs.base import Environment
from seedcli.errors import UserError
from seedcli.records import Trajectory, iter_jsonl

# 2: per-category results under `categories` (schema 1 named them `task_types`; still read), `env`, scores.
RESULTS_SCHEMA_VERSION = 2
RESULTS = "results.json"
EPISODES = "episodes.jsonl"  # beside results.json: one trajectory per line, as `seed eval` played them


def canonical_split(split: str) -> str:
    """'seen' → 'valid_seen', 'unseen' → 'valid_unseen'; other names unchanged."""
    return {"seen": "valid_seen", "unseen": "valid_unseen"}.get(split, split)


def env_of(results: dict) -> type[Environment]:
    """The environment a results.json is of (ALFWorld for results written before it was recorded)."""
    return env_class(results.get("env") or "alfworld")


def ordered_types(types: Iterable[str], env: type[Environment]) -> list[str]:
    """The environment's categories in report order, then any unknown one alphabetically."""
    types = set(types)
    known = list(env.categories)
    return known + sorted(types - set(known))


def _one_or_all(values: list[Any]) -> Any:
    """A field that should be the same in every episode: the value, or the sorted distinct values if mixed."""
    distinct: dict[bytes, Any] = {}
    for v in values:
        distinct.setdefault(orjson.dumps(v, option=orjson.OPT_SORT_KEYS), v)
    if len(distinct) == 1:
        return next(iter(distinct.values()))
    return [distinct[k] for k in sorted(distinct)]


def _ratio(num: float, den: float) -> float | None:
    return round(num / den, 6) if den else None


def summarize_episodes(
    episodes: list[Trajectory],
    *,
    split: str,
    partial: bool,
    expected_games: int,
    wall_time_s: float,
    env: str | None = None,
) -> dict:
    """The content of results.json: success and score per category, their macro averages (ALFWorld's headline),
    micro success and mean score over all episodes (WebShop's), cost. `env` defaults to the episodes' own."""
    env_name = env or (episodes[0].env if episodes else "alfworld")
    cls = env_class(env_name)
    by_type: dict[str, list[Trajectory]] = {}
    for ep in episodes:
        by_type.setdefault(ep.category, []).append(ep)
    categories: dict[str, dict] = {}
    for t in ordered_types(by_type, cls):
        eps = by_type.get(t, [])
        wins = sum(ep.won for ep in eps)
        categories[t] = {
            "games": len(eps),
            "wins": wins,
            "success_rate": _ratio(wins, len(eps)),
            "mean_score": _ratio(sum(ep.score for ep in eps), len(eps)),
        }
    rates = [v["success_rate"] for v in categories.values() if v["games"]]
    scores = [v["mean_score"] for v in categories.values() if v["games"]]
    turns = sum(len(ep.turns) for ep in episodes)
    invalid = sum(ep.invalid_turns for ep in episodes)
    wins = sum(ep.won for ep in episodes)
    agent = (
        {
            field: _one_or_all([getattr(ep, field) for ep in episodes])
            for field in ("policy", "model_id", "model_hash", "engine", "prompt_version", "sampling")
        }
        if episodes
        else {}
    )
    return {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "env": cls.name,
        "split": canonical_split(split) if cls.name == "alfworld" else split,
        "partial": bool(partial),
        "episodes": len(episodes),
        "expected_games": expected_games,
        "categories": categories,
        "macro_success": round(sum(rates) / len(rates), 6) if rates else None,
        "macro_types": len(rates),
        "micro_success": _ratio(wins, len(episodes)),
        "mean_score": _ratio(sum(ep.score for ep in episodes), len(episodes)),
        "macro_score": round(sum(scores) / len(scores), 6) if scores else None,
        "wins": wins,
        "mean_episode_length": _ratio(sum(ep.length for ep in episodes), len(episodes)),
        **({"mean_reward": _ratio(sum(ep.env_return for ep in episodes), len(episodes))} if cls.reports_reward else {}),
        "turns": turns,
        "invalid_turns": invalid,
        "invalid_action_rate": _ratio(invalid, turns),
        "tokens_generated": sum(len(turn.response_ids) for ep in episodes for turn in ep.turns),
        **_action_counts(episodes, cls),
        "wall_time_s": round(float(wall_time_s), 3),
        "agent": agent,
    }


def _action_counts(episodes: list[Trajectory], env: type[Environment]) -> dict:
    """{"per_episode": {label: mean count}} of the actions the environment counts (search calls); {} for none."""
    if not env.counted_actions:
        return {}
    counts = {
        label: _ratio(sum(t.action.startswith(prefix) for ep in episodes for t in ep.turns), len(episodes))
        for label, prefix in env.counted_actions.items()
    }
    return {"per_episode": counts}


def results_path(run: str | Path) -> Path:
    """The results.json an argument names (an eval run directory or the file itself); anything else is a
    UserError."""
    run = Path(run)
    hint = "pass an eval run directory (runs/eval/<id>/) written by `seed eval`"
    if not run.exists():
        raise UserError(f"{run}: no such file or directory; {hint}")
    if run.is_dir() and not (run / RESULTS).exists():
        raise UserError(f"{run}: no {RESULTS}, so not an eval run; {hint}")
    if not run.is_dir() and run.name != RESULTS:
        raise UserError(f"{run}: not a {RESULTS}; {hint}")
    return run / RESULTS if run.is_dir() else run


def load_results(run: str | Path) -> dict:
    """results.json of an eval run (the run directory or the file itself); anything else is a UserError."""
    path = results_path(run)
    try:
        data = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({str(exc).splitlines()[0]}); rerun `seed eval`") from None
    if isinstance(data, dict) and "task_types" in data and "categories" not in data:
        data["categories"] = data.pop("task_types")  # schema 1: ALFWorld only
        data.setdefault("env", "alfworld")
    missing = [k for k in ("categories", "macro_success", "split") if not isinstance(data, dict) or k not in data]
    if missing:
        raise UserError(f"{path}: not a seedcli eval result (missing {', '.join(missing)}); rerun `seed eval`")
    if data.get("schema_version", 0) > RESULTS_SCHEMA_VERSION:
        raise UserError(f"{path}: results schema {data['schema_version']} is newer than this seedcli; upgrade seedcli")
    try:
        env_of(data)
    except UserError:
        raise UserError(
            f"{path}: results of environment {data.get('env')!r}, which this seedcli does not know"
        ) from None
    return data


def paired_gain(diffs: Sequence[float]) -> tuple[float, float]:
    """Two evals of the same games: the mean of the per-game differences (solved after − solved before, each -1, 0
    or 1; or score after − score before) and its standard error sd/√n with the sample standard deviation (0 for
    fewer than two games)."""
    n = len(diffs)
    g = sum(diffs) / n
    se = math.sqrt(statistics.variance(diffs) / n) if n > 1 else 0.0
    return g, se


def seeds_gain(values: Sequence[float], p0: float, n0: int, n: int) -> tuple[float, float, float]:
    """A recipe's gain over the model it started from, read from k seeds' evaluations: (the seeds' mean, mean − p0,
    its standard error). The error adds the start's evaluation error √(p₀(1−p₀)/n₀) to the seed mean's: the seeds'
    spread s/√k for two or more seeds (training noise and evaluation noise together), else the one evaluation's
    √(m(1−m)/n). Measures are fractions in [0, 1]; for a mean score p(1−p) bounds the variance from above, so the
    error is then conservative. The method check's "gain over the start" and `seed report --seeds`."""
    if not values:
        raise ValueError("seeds_gain: no values")
    m = statistics.fmean(values)
    var_mean = statistics.variance(values) / len(values) if len(values) > 1 else m * (1 - m) / max(n, 1)
    se = math.sqrt(var_mean + p0 * (1 - p0) / max(n0, 1))
    return m, m - p0, se


def per_game(run: str | Path, key: str) -> dict[str, float] | None:
    """An eval run's result per game, read from its episodes.jsonl: {task_id: the mean over that task's episodes of
    `key`} (`won` as 1/0, or `score`); None when the run has no episodes file (results.json alone). A line that is
    not JSON, or an episode without those fields, is a UserError naming the file."""
    run = Path(run)
    path = (run if run.is_dir() else run.parent) / EPISODES
    if not path.exists():
        return None
    sums: dict[str, list[float]] = {}
    for n, row in enumerate(iter_jsonl(path), 1):
        try:
            task, value = str(row["task_id"]), float(row[key])
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{path}: episode {n} has no task_id or {key}; rerun `seed eval` for this run") from None
        acc = sums.setdefault(task, [0.0, 0.0])
        acc[0] += value
        acc[1] += 1
    return {task: total / count for task, (total, count) in sums.items()}
