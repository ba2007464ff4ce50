"""Comparisons of eval runs of one environment: the table `seed report` writes (compare.md), and the headline
measure it and the comparison's bar chart show."""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Collection
from typing import NamedTuple

import orjson

from seedcli.envs.base import Environment
from seedcli.errors import UserError
from seedcli.report.markdown import marked, metric_label, metric_text, num, partial_line, pct, plural, type_name
from seedcli.report.results import env_of, ordered_types, paired_gain, seeds_gain


class Measure(NamedTuple):
    """What a comparison shows of an environment's headline metric, per category and overall."""

    headline: str  # results.json key of the environment's headline (its first metric label)
    per_category: str  # the per-category key behind it: success_rate or mean_score
    overall: str  # the bar beside the categories in a comparison: "Macro", "All goals", "Average"
    axis: str  # the y-axis label


def headline_measure(env: type[Environment]) -> Measure:
    """How a comparison shows the environment's headline: ALFWorld success per task type and the macro average,
    WebShop score per category and over all goals, search exact match per data source and their average."""
    headline = next(iter(env.card.metric_labels))
    label = metric_label(headline, env).split(" (")[0]
    if headline.endswith("_success"):
        return Measure(headline, "success_rate", "Macro" if headline.startswith("macro") else "All", "success rate")
    overall = "Average" if headline.startswith("macro") else f"All {plural(env.card.task_noun)}"
    return Measure(headline, "mean_score", overall, label)


def all_types(results_list: list[tuple[str, dict]]) -> list[str]:
    """Categories that some run played, in the environment's order (sources without data are left out)."""
    if not results_list:
        return []
    env = env_of(results_list[0][1])
    played = {t for _, r in results_list for t, row in r["categories"].items() if row.get("games")}
    return [t for t in ordered_types((t for _, r in results_list for t in r["categories"]), env) if t in played]


def paired_over_first(
    first: dict[str, float], other: dict[str, float] | None
) -> tuple[float, float, int, int, int] | None:
    """A run's gain over the first on the games both played (per game: {task_id: result}, `results.per_game`): the
    mean difference and its paired standard error (`paired_gain`), the games that went up and down, and how many games
    were shared; None when fewer than two are."""
    common = sorted(set(first) & set(other or {}))
    if len(common) < 2:
        return None
    d = [other[g] - first[g] for g in common]  # type: ignore[index]
    g, se = paired_gain(d)
    return g, se, sum(x > 0 for x in d), sum(x < 0 for x in d), len(common)


def paired_cells(games: list[dict[str, float] | None]) -> list[str] | None:
    """Each run's gain over the first on the games both played: the mean per-game difference ± its paired standard
    error (`paired_gain`), with how many games went up and down; None when the first run's games are unknown or no
    other run shares two of them. `games`: per run, {task_id: result} (`results.per_game`) or None."""
    first = games[0] if games else None
    if not first or len(games) < 2:
        return None
    cells, shared = ["reference"], False
    for other in games[1:]:
        paired = paired_over_first(first, other)
        if paired is None:
            cells.append("—")
            continue
        shared = True
        g, se, up, down, n = paired
        mark = " ↑" if g > 2 * se else " ↓" if g < -2 * se else ""
        cells.append(f"{100 * g:+.1f} ± {100 * se:.1f}{mark} ({up} up, {down} down, of {n})")
    return cells if shared else None


# how an eval was played, beyond the model: what two evals must share for their numbers, and their per-game pairing,
# to compare the models (`seed report` refuses others without --allow-mismatch). Engine, dtype and batch sizes are
# how the play was computed, not what was played, and may differ.
PROTOCOL = ("split", "tasks", "max_steps", "temperature", "top_p", "history", "max_new_tokens", "env_options")


def _setting_text(value: object) -> str:
    if isinstance(value, dict | list):
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode() if value else "none"
    return "default" if value is None else str(value)


def protocol_differences(runs: list[tuple[dict, dict, Collection[str] | None]]) -> list[tuple[str, list[str]]]:
    """The settings of `PROTOCOL` in which eval runs differ: (setting, its value in each run), [] when they agree.
    `runs`: per run, its saved config (the manifest's), its results.json and the task ids it played (None when it
    has no episodes file). `tasks` is the set of task ids when every run has them (their count and a digest of the
    sorted ids), else what the config chose (`--limit`, `--categories`, and the seed that picks a limited set)."""
    values: dict[str, list[str]] = {key: [] for key in PROTOCOL}
    known = all(tasks is not None for _, _, tasks in runs)
    for config, results, tasks in runs:
        values["split"].append(str(results.get("split")))
        if known:
            ids = sorted(tasks or ())
            digest = hashlib.sha256("\n".join(ids).encode()).hexdigest()[:8]
            values["tasks"].append(f"{len(ids)} (ids {digest})")
        else:
            limit = config.get("limit")
            chosen = [f"limit {limit} (seed {config.get('seed')})" if limit else "all"]
            categories = config.get("categories") or config.get("datasets")  # (its old name)
            if categories:
                chosen.append(f"categories {','.join(categories)}")
            values["tasks"].append(", ".join(chosen))
        for key in PROTOCOL[2:]:
            values[key].append(_setting_text(config.get(key)))
    return [(key, vals) for key, vals in values.items() if len(set(vals)) > 1]


def protocol_summary(differences: list[tuple[str, list[str]]]) -> str:
    """One line for the refusal: each differing setting with its values and the runs (numbered from 1) that have
    them, e.g. "max_steps 3 (run 1) vs 8 (runs 2, 3)"."""
    parts = []
    for key, vals in differences:
        by_value: dict[str, list[str]] = {}
        for i, v in enumerate(vals, 1):
            by_value.setdefault(v, []).append(str(i))
        parts.append(
            f"{key} "
            + " vs ".join(f"{v} (run{'s' if len(ns) > 1 else ''} {', '.join(ns)})" for v, ns in by_value.items())
        )
    return "; ".join(parts)


def protocol_table(labels: list[str], differences: list[tuple[str, list[str]]]) -> list[str]:
    """The Markdown table of the settings in which the runs differ, one column per run (`--allow-mismatch`)."""
    lines = [
        "",
        "## Protocol differences (compared with --allow-mismatch)",
        "",
        "| setting | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    lines += [f"| {key} | " + " | ".join(vals) + " |" for key, vals in differences]
    lines += [
        "",
        "- These runs were not played under one protocol: their differences, paired gains included, mix the "
        "settings above with the models.",
        "",
    ]
    return lines


def check_seeds(n_runs: int, seeds: int) -> None:
    """`seed report --seeds K` needs the start and then K runs per recipe."""
    if seeds < 1 or n_runs < 1 + seeds or (n_runs - 1) % seeds:
        raise UserError(
            f"seed report --seeds {seeds}: {n_runs - 1} run(s) after the first do not make groups of {seeds}; pass "
            f"the start's eval run, then {max(seeds, 1)} eval runs (one per seed) for each recipe"
        )


def seed_groups(
    results_list: list[tuple[str, dict]],
    games: list[dict[str, float] | None] | None,
    seeds: int,
    measure: Measure,
    recipes: list[str] | None = None,
) -> list[str]:
    """`seed report START R1 … Rk R'1 … R'k --seeds k`: each recipe's mean headline over its k seeds and its gain over
    the start, with a standard error that includes the seeds' spread (`seeds_gain`, the method check's), and how many
    of its runs gained or lost beyond twice their own paired error on the games they share with the start.
    `recipes`: a name per recipe (`commands.recipe_names`: the settings that tell them apart), beside the runs'."""
    check_seeds(len(results_list), seeds)
    start_label, start = results_list[0]
    p0 = start.get(measure.headline)
    if p0 is None:
        return []
    n0 = int(start.get("episodes") or 0)
    first = games[0] if games else None
    lines = [
        "",
        f"## Recipes over seeds (gain over {start_label})",
        "",
        "| runs | seeds | each run | mean ± std | gain (points) | standard error | gain / SE | runs beyond 2 SE (paired) |",
        "|---|--:|---|--:|--:|--:|--:|--:|",
    ]
    for g0 in range(1, len(results_list), seeds):
        group = results_list[g0 : g0 + seeds]
        vals = [r.get(measure.headline) for _, r in group]
        if any(v is None for v in vals):
            lines.append(f"| {g0 + 1}–{g0 + seeds} | {seeds} | a run without {measure.headline} | — | — | — | — | — |")
            continue
        n = min(int(r.get("episodes") or 0) for _, r in group)
        m, gain, se = seeds_gain(vals, p0, n0, n)
        std = statistics.stdev(vals) if len(vals) > 1 else 0.0
        beyond = "—"
        if first is not None and games is not None:
            up = down = counted = 0
            for other in games[g0 : g0 + seeds]:
                paired = paired_over_first(first, other)
                if paired is None:
                    continue
                g, e = paired[:2]
                counted += 1
                up += g > 2 * e
                down += g < -2 * e
            beyond = f"{up} up, {down} down, of {counted}" if counted else "—"
        names = {label.split(" · ")[0] for label, _ in group}
        tags = ([names.pop()] if len(names) == 1 else []) + ([recipes[(g0 - 1) // seeds]] if recipes else [])
        name = f"{g0 + 1}–{g0 + seeds}" + (f" ({'; '.join(tags)})" if tags else "")
        ratio = f"{round(gain / se, 2) + 0.0:+.2f}" if se > 0 else "—"  # + 0.0: no "-0.00" from rounding error
        lines.append(
            f"| {name} | {seeds} | {' '.join(pct(v) for v in vals)} | {pct(m)} ± {100 * std:.1f} | "
            f"{round(100 * gain, 1) + 0.0:+.1f} | "
            f"{100 * se:.1f} | {ratio} | {beyond} |"
        )
    lines += [
        "",
        f"- Recipes over seeds: the runs after the first, {seeds} at a time, are seeds of one recipe; runs are "
        "numbered from 1 in the order given. Gain = the seeds' mean − the start; its standard error adds the start's "
        "evaluation error √(p₀(1−p₀)/n₀) to the seed mean's, s/√k (the seeds' spread: training and evaluation noise "
        "together). A recipe learns, on these games, when its gain exceeds twice that error.",
    ]
    return lines


def compare_runs(
    results_list: list[tuple[str, dict]],
    games: list[dict[str, float] | None] | None = None,
    seeds: int = 0,
    recipes: list[str] | None = None,
) -> str:
    """Markdown table with one column per run: per-category success, macro, micro, mean episode length; with
    `games` (per run, its result per game: `results.per_game`), each run's paired gain over the first; with `seeds`
    (k), the runs after the first as recipes of k seeds each and each recipe's gain over the first (`seed_groups`),
    named by `recipes` when given."""
    if not results_list:
        raise UserError("nothing to compare: pass at least one eval run")
    envs = {r.get("env", "alfworld") for _, r in results_list}
    if len(envs) > 1:
        raise UserError(
            f"seed report: the runs are of different environments ({', '.join(sorted(envs))}); compare "
            "runs of one environment at a time"
        )
    env = env_of(results_list[0][1])
    header = "| | " + " | ".join(marked(label, r) for label, r in results_list) + " |"
    lines = ["# Eval comparison", "", header, "|---|" + "--:|" * len(results_list)]

    def row(name: str, cells: list[str]) -> None:
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    row("Split", [r["split"] for _, r in results_list])
    row("Games", [f"{r.get('episodes', 0)} / {r.get('expected_games', '?')}" for _, r in results_list])
    measure = headline_measure(env)
    for t in all_types(results_list):
        cells = []
        for _, r in results_list:
            cell = r["categories"].get(t)  # None: this run played no game of category t
            value = pct(cell["success_rate"]) if cell and measure.per_category == "success_rate" else None
            if cell and cell["games"] and value is None:
                value = num(None if cell.get("mean_score") is None else 100 * cell["mean_score"])
            cells.append(f"{value} ({cell['wins']}/{cell['games']})" if cell and cell["games"] else "—")
        row(type_name(t, env), cells)

    def bold(key: str, name: str, cells: list[str]) -> None:
        """The environment's headline row in bold."""
        if key == measure.headline:
            row(f"**{name}**", [f"**{c}**" for c in cells])
        else:
            row(name, cells)

    if any(k.endswith("_success") for k in env.card.metric_labels):
        bold("macro_success", "Macro", [pct(r["macro_success"]) for _, r in results_list])
        bold("micro_success", "Micro", [pct(r.get("micro_success")) for _, r in results_list])
        if "mean_score" in env.card.metric_labels:
            bold("mean_score", "Score", [metric_text(r, "mean_score") for _, r in results_list])
    else:  # search: exact match is the only measure; one row per way of averaging it
        for key in env.card.metric_labels:
            name = metric_label(key, env)
            bold(key, name[:1].upper() + name[1:], [metric_text(r, key) for _, r in results_list])
    row("Mean length", [num(r.get("mean_episode_length")) for _, r in results_list])
    notes = []
    splits = {r["split"] for _, r in results_list}
    paired = paired_cells(games) if games and len(splits) == 1 else None
    if paired:
        unit = "success" if measure.per_category == "success_rate" else "score"
        row(f"Gain over {results_list[0][0]} (paired)", paired)
        notes.append(
            f"Gain (paired): per game, {unit} of the run minus {unit} of the first run, over the games both played; "
            "mean ± its standard error sd(d)/√n, in points. ↑ or ↓: beyond twice the standard error; "
            "otherwise the two runs are not told apart on these games."
        )
    if len(splits) > 1:
        notes.append(
            f"The runs are on different splits ({', '.join(sorted(splits))}): their numbers are not comparable."
        )
    for label, r in results_list:
        warn = partial_line(r)
        if warn:
            notes.append(f"{label}: {warn}.")
    if len(splits) == 1 and (paper := env.card.paper_results.get(next(iter(splits)))):
        headline = next(iter(env.card.metric_labels))
        paper_str = ", ".join(f"{m} {metric_text(v, headline)}" for m, v in paper.items() if headline in v)
        notes.append(f"Paper {metric_label(headline, env)} ({env.card.paper_model}, docs/design.md §1): {paper_str}.")
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    if seeds:
        if len(splits) > 1:
            raise UserError("seed report --seeds: the runs are on different splits; compare seeds of one split")
        lines += seed_groups(results_list, games, seeds, measure, recipes)
    lines.append("")
    return "\n".join(lines)
