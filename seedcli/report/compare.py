"""Comparisons of eval runs of one environment: the table `seed report` writes (compare.md), and the headline
measure it and the comparison's bar chart show."""

from __future__ import annotations

from typing import NamedTuple

from seedcli.envs.base import Environment
from seedcli.errors import UserError
from seedcli.report.markdown import marked, metric_label, metric_text, num, partial_line, pct, plural, type_name
from seedcli.report.results import env_of, ordered_types


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


def compare_runs(results_list: list[tuple[str, dict]]) -> str:
    """Markdown table with one column per run: per-category success, macro, micro, mean episode length."""
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
    lines.append("")
    return "\n".join(lines)
