"""Eval results, markdown reports, run comparisons and plots: pure functions over records and files.

`seed eval` plays the tasks and then calls `summarize_episodes` → results.json, `render_report` → report.md and
`plot_success_by_type` → success_by_type.png (or `write_eval_outputs` for all three). Categories, metric names and
the paper's numbers come from the environment (`seedcli.envs`), named by results.json's `env`. `seed report RUN...` compares
eval runs (`report_command`); `seed plot RUN...` draws training curves from rl runs' metrics.jsonl (`plot_command`).

No torch here. matplotlib is imported inside the plotting functions and draws with the Agg canvas (no display).
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from seedcli.artifacts import atomic_write_bytes, atomic_write_text
from seedcli.envs import env_class
from seedcli.envs.base import Environment
from seedcli.errors import UserError
from seedcli.records import Trajectory

# 2: per-category results under `categories` (schema 1 named them `task_types`; still read), `env`, scores.
RESULTS_SCHEMA_VERSION = 2
RESULTS = "results.json"
METRICS = "metrics.jsonl"

# ALFWorld's, kept for older callers; each environment declares its own (Environment.categories, .card.paper_results).
TASK_TYPES_ORDER = ["pick", "look", "clean", "heat", "cool", "pick_two"]
TASK_TYPE_NAMES = {
    "pick": "Pick",
    "look": "Look",
    "clean": "Clean",
    "heat": "Heat",
    "cool": "Cool",
    "pick_two": "Pick Two",
}
PAPER_MODEL = "Qwen2.5-3B"
PAPER_RESULTS: dict[str, dict[str, dict[str, float]]] = env_class("alfworld").card.paper_results

# The paper's baseline rows on the text environments come from SDAR's paper (the authors confirmed it in the official
# repository's issue #2), and the two papers ran ALFWorld with different episode lengths.
SDAR_SHARED_ENVS = ("alfworld", "webshop", "search")
BASELINE_NOTE = (
    "The paper's baseline rows are shared with SDAR's paper (confirmed by the SEED authors in the official "
    "repository's issue #2)."
)
ALFWORLD_STEPS_NOTE = " SDAR runs ALFWorld with 50 steps per episode, SEED with 30."

# Metrics a results.json holds and how they are shown; environments pick theirs (`card.metric_labels`).
_METRIC_KEYS = ("macro_success", "micro_success", "mean_score", "macro_score")

# Training-curve families: (file stem, panel title, y label, [(series suffix, metric keys tried in order)]).
# A run contributes the first key of a series that it logged at all; keys it never logged are skipped.
CURVE_FAMILIES: list[tuple[str, str, str, list[tuple[str, list[str]]]]] = [
    ("reward", "Reward", "reward/mean", [("", ["reward/mean"])]),
    (
        "success_rate",
        "Success rate",
        "success rate",
        [("train", ["rollout/success_rate", "env/success_rate"]), ("val", ["val/success_rate"])],
    ),
    # the env's score in [0, 1] (WebShop: purchase reward; search: exact match; ALFWorld: = success)
    ("score", "Score", "mean score", [("train", ["reward/score_mean"]), ("val", ["val/score"])]),
    ("episode_length", "Episode length", "steps", [("", ["env/episode_length", "rollout/episode_length"])]),
    ("opd_loss", "OPD loss", "opd/loss", [("", ["opd/loss"])]),
    ("gate_mean", "OPD gate mean", "opd/gate_mean", [("", ["opd/gate_mean"])]),
    ("kl", "KL(θ‖ref)", "actor/kl", [("", ["actor/kl"])]),
]


# ---------------------------------------------------------------------------------------------------------------
# results.json


def canonical_split(split: str) -> str:
    """'seen' → 'valid_seen', 'unseen' → 'valid_unseen'; other names unchanged."""
    return {"seen": "valid_seen", "unseen": "valid_unseen"}.get(split, split)


def type_name(task_type: str, env: Environment | type[Environment] | None = None) -> str:
    """Display name of a category (ALFWorld task type by default)."""
    if env is not None:
        return env.card.category_name(task_type)
    return TASK_TYPE_NAMES.get(task_type, task_type.replace("_", " ").title())


def _env_of(results: dict) -> type[Environment]:
    return env_class(results.get("env") or "alfworld")


def _ordered_types(types: Iterable[str], env: type[Environment] | None = None) -> list[str]:
    """The environment's categories in report order, then any unknown one alphabetically."""
    types = set(types)
    known = list(env.categories) if env is not None else TASK_TYPES_ORDER
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
    for t in _ordered_types(by_type, cls):
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


def load_results(run: str | Path) -> dict:
    """results.json of an eval run (the run directory or the file itself); anything else is a UserError."""
    run = Path(run)
    hint = "pass an eval run directory (runs/eval/<id>/) written by `seed eval`"
    if not run.exists():
        raise UserError(f"{run}: no such file or directory; {hint}")
    if run.is_dir() and not (run / RESULTS).exists():
        raise UserError(f"{run}: no {RESULTS}, so not an eval run; {hint}")
    if not run.is_dir() and run.name != RESULTS:
        raise UserError(f"{run}: not a {RESULTS}; {hint}")
    path = run / RESULTS if run.is_dir() else run
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
        _env_of(data)
    except UserError:
        raise UserError(
            f"{path}: results of environment {data.get('env')!r}, which this seedcli does not know"
        ) from None
    return data


def describe_model(results: dict) -> str:
    """One line naming the policy that produced the results."""
    agent = results.get("agent") or {}
    policy = agent.get("policy", "model")
    if policy != "model":
        return f"{policy} policy (no model)" if isinstance(policy, str) else f"mixed policies {policy}"
    model = agent.get("model_id", "unknown model")
    parts = [str(model)]
    if isinstance(agent.get("model_hash"), str):
        parts.append(f"sha {agent['model_hash'][:12]}")
    if isinstance(agent.get("engine"), str):
        parts.append(f"engine {agent['engine']}")
    sampling = agent.get("sampling")
    if isinstance(sampling, dict) and "temperature" in sampling:
        parts.append(f"temperature {sampling['temperature']}")
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------------------------
# markdown


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _duration(s: float | None) -> str:
    if s is None:
        return "—"
    if s < 60:
        return f"{s:.1f} s"
    h, rem = divmod(int(round(s)), 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else f"{m}m {sec:02d}s"


def _num(x: float | None, fmt: str = "{:.1f}") -> str:
    return "—" if x is None else fmt.format(x)


def partial_line(results: dict) -> str | None:
    """The warning for a result that does not cover the whole split, or None."""
    n, m = results.get("episodes", 0), results.get("expected_games", 0)
    tasks = _plural(_env_of(results).card.task_noun)
    if results.get("partial"):
        return f"Partial result: {n} of {m} {tasks} (--limit) — not comparable with the paper"
    if m and n < m:
        return f"Incomplete result: {n} of {m} {tasks} were played — not comparable with the paper"
    return None


def _plural(noun: str) -> str:
    return noun[:-1] + "ies" if noun.endswith("y") else noun + "s"


def _marked(label: str, results: dict) -> str:
    return f"{label} (partial)" if partial_line(results) else label


def _metric_cell(results: dict, key: str) -> str:
    v = results.get(key)
    return _pct(v) if "success" in key else _num(None if v is None else 100 * v)


def metric_text(results: dict, key: str) -> str:
    """A results.json metric as reports show it: success as a percentage, a score ×100 ("88.5")."""
    return _metric_cell(results, key)


def _metric_label(key: str, env: type[Environment]) -> str:
    return env.card.metric_labels.get(key) or key.replace("_", " ")


class _Measure(NamedTuple):
    headline: str  # results.json key of the environment's headline (its first metric label)
    per_category: str  # the per-category key behind it: success_rate or mean_score
    overall: str  # the bar beside the categories in a comparison: "Macro", "All goals", "Average"
    axis: str  # the y-axis label


def _measure(env: type[Environment]) -> _Measure:
    """How a comparison shows the environment's headline: ALFWorld success per task type and the macro average,
    WebShop score per category and over all goals, search exact match per data source and their average."""
    headline = next(iter(env.card.metric_labels))
    label = _metric_label(headline, env).split(" (")[0]
    if headline.endswith("_success"):
        return _Measure(headline, "success_rate", "Macro" if headline.startswith("macro") else "All", "success rate")
    overall = "Average" if headline.startswith("macro") else f"All {_plural(env.card.task_noun)}"
    return _Measure(headline, "mean_score", overall, label)


def render_report(results: dict, *, title: str, model_desc: str, run_id: str) -> str:
    """report.md of one eval run: per-category table, our headline metrics beside the paper's, episode statistics."""
    env = _env_of(results)
    split = results["split"]
    cats = results["categories"]
    with_score = any(k.endswith("_score") for k in env.card.metric_labels)
    # an environment that reports no success (search: exact match) shows its score alone, under its own name
    with_success = any(k.endswith("_success") for k in env.card.metric_labels)
    score_name = "Score" if with_success else _metric_label(next(iter(env.card.metric_labels)), env).split(" (")[0]
    score_name = score_name[:1].upper() + score_name[1:]
    noun = env.card.category_label
    lines = [f"# {title}", ""]
    lines.append(
        f"- Environment: {env.title}; split: {split} ({results.get('episodes', 0)} of "
        f"{results.get('expected_games', '?')} {_plural(env.card.task_noun)})"
    )
    lines.append(f"- Model: {model_desc}")
    lines += setup_lines(results)
    lines.append(f"- Run: {run_id}")
    warn = partial_line(results)
    if warn:
        lines += ["", f"> **{warn}.**"]
    score_head, score_rule = (f" {score_name} |", "--:|") if with_score else ("", "")
    success_head, success_rule = (" Success |", "--:|") if with_success or not with_score else ("", "")
    heading = "Success" if with_success or not with_score else score_name
    if with_score and with_success:
        heading = f"{score_name} and success"  # WebShop: the score is the headline, success beside it
    headline = next(iter(env.card.metric_labels))

    def cell(key: str, text: str) -> str:
        return f" **{text}** |" if key == headline else f" {text} |"

    lines += [
        "",
        f"## {heading} by {noun}",
        "",
        f"| {noun.capitalize()} | {_plural(env.card.task_noun).capitalize()} | Wins |{success_head}{score_head}",
        f"|---|--:|--:|{success_rule}{score_rule}",
    ]
    for t, row in cats.items():
        if not row["games"]:  # a category this run had no tasks of (a partial run, --datasets, another split)
            continue
        score = f" {_num(None if row.get('mean_score') is None else 100 * row['mean_score'])} |" if with_score else ""
        success = f" {_pct(row['success_rate'])} |" if success_head else ""
        lines.append(f"| {type_name(t, env)} | {row['games']} | {row['wins']} |{success}{score}")
    # the environment's headline in bold: ALFWorld macro success, WebShop score (all goals), search the average
    macro_score = cell("macro_score", _metric_cell(results, "macro_score")) if with_score else ""
    micro_score = cell("mean_score", _metric_cell(results, "mean_score")) if with_score else ""
    macro_success = cell("macro_success", _pct(results["macro_success"])) if success_head else ""
    micro_success = cell("micro_success", _pct(results.get("micro_success"))) if success_head else ""
    macro_name, micro_name = (
        ("**Macro average**", "Micro average")
        if headline.startswith("macro")
        else ("Macro average", "**Micro average**")
    )
    lines.append(f"| {macro_name} | | |{macro_success}{macro_score}")
    lines.append(
        f"| {micro_name} | {results.get('episodes', 0)} | {results.get('wins', '—')} |{micro_success}{micro_score}"
    )
    lines += [
        "",
        f"Macro = mean over the {results.get('macro_types', '?')} {_plural(noun)} that had {_plural(env.card.task_noun)}; "
        f"micro = all {_plural(env.card.task_noun)} pooled"
        + (f"; {score_name.lower()} = mean reward in [0, 100]" if with_score else "")
        + f". Headline: {_metric_label(headline, env)}.",
    ]

    paper = env.card.paper_results.get(split)
    lines += ["", f"## Paper ({env.card.paper_model}, DESIGN.md §1)", ""]
    if paper:
        keys = [k for k in env.card.metric_labels if any(k in row for row in paper.values())]
        lines += [
            "| Method | " + " | ".join(f"{_metric_label(k, env).capitalize()} ({split})" for k in keys) + " |",
            "|---|" + "--:|" * len(keys),
        ]
        mine = " | ".join(f"**{_metric_cell(results, k)}**" for k in keys)
        lines.append(f"| **This run**{' (partial)' if warn else ''} | {mine} |")
        for method, row in paper.items():
            cells = " | ".join(_metric_cell(row, k) if k in row else "—" for k in keys)
            lines.append(f"| {method} (paper) | {cells} |")
        lines += ["", env.card.paper_note]
        if env.name in SDAR_SHARED_ENVS and any(method != "SEED" for method in paper):
            lines += ["", BASELINE_NOTE + (ALFWORLD_STEPS_NOTE if env.name == "alfworld" else "")]
    else:
        known = ", ".join(env.card.paper_results) or "none"
        lines.append(f"The paper reports no {env.title} numbers for split `{split}` (only {known}).")
    if env.card.offline_note and not _options(results).get("search_url"):
        lines += ["", env.card.offline_note]  # it speaks of the offline corpus, which a search_url run did not use

    invalid = results.get("invalid_turns")
    turns = results.get("turns")
    counts = f" ({invalid} of {turns} turns)" if invalid is not None and turns is not None else ""
    lines += [
        "",
        "## Episodes",
        "",
        f"- Mean episode length: {_num(results.get('mean_episode_length'))} steps",
        *([f"- Mean episode reward: {_num(results['mean_reward'], '{:.2f}')}"] if "mean_reward" in results else []),
        *(f"- Mean {label} per episode: {_num(v, '{:.2f}')}" for label, v in results.get("per_episode", {}).items()),
        f"- Invalid-action rate: {_pct(results.get('invalid_action_rate'))}{counts}",
        f"- Tokens generated: {results.get('tokens_generated', 0):,}",
        f"- Wall time: {_duration(results.get('wall_time_s'))}",
        "",
    ]
    return "\n".join(lines)


def _options(results: dict) -> dict:
    setup = results.get("setup")
    options = setup.get("env_options") if isinstance(setup, dict) else None
    return options if isinstance(options, dict) else {}


def setup_lines(results: dict) -> list[str]:
    """Report lines on what the numbers depend on beyond the model: the retriever (search), env options, data."""
    setup = results.get("setup")
    if not isinstance(setup, dict):
        return []  # results written before seedcli recorded it
    options = _options(results)
    lines = []
    if options.get("search_url"):
        lines.append(
            f"- Retriever: {options['search_url']} (`env_options.search_url`, a Search-R1 /retrieve server); "
            "whether it serves wiki-18's 21M passages, as the paper's does, is up to that server"
        )
    elif _env_of(results).name == "search":
        corpus = options.get("corpus") or (f"{setup['data_root']}/corpus.jsonl" if setup.get("data_root") else "?")
        lines.append(f"- Retriever: in-process BM25 over {corpus}")
    shown = {k: v for k, v in options.items() if k not in ("search_url", "corpus")}
    if shown:
        lines.append("- Environment options: " + ", ".join(f"{k}={v}" for k, v in sorted(shown.items())))
    if setup.get("data_root"):
        lines.append(f"- Data: {setup['data_root']}")
    return lines


def _all_types(results_list: list[tuple[str, dict]]) -> list[str]:
    """Categories that some run played, in the environment's order (sources without data are left out)."""
    env = _env_of(results_list[0][1]) if results_list else None
    played = {t for _, r in results_list for t, row in r["categories"].items() if row.get("games")}
    return [t for t in _ordered_types((t for _, r in results_list for t in r["categories"]), env) if t in played]


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
    env = _env_of(results_list[0][1])
    header = "| | " + " | ".join(_marked(label, r) for label, r in results_list) + " |"
    lines = ["# Eval comparison", "", header, "|---|" + "--:|" * len(results_list)]

    def row(name: str, cells: list[str]) -> None:
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    row("Split", [r["split"] for _, r in results_list])
    row("Games", [f"{r.get('episodes', 0)} / {r.get('expected_games', '?')}" for _, r in results_list])
    measure = _measure(env)
    for t in _all_types(results_list):
        cells = []
        for _, r in results_list:
            cell = r["categories"].get(t)
            value = _pct(cell["success_rate"]) if measure.per_category == "success_rate" else None
            if cell and cell["games"] and value is None:
                value = _num(None if cell.get("mean_score") is None else 100 * cell["mean_score"])
            cells.append(f"{value} ({cell['wins']}/{cell['games']})" if cell and cell["games"] else "—")
        row(type_name(t, env), cells)

    def bold(key: str, name: str, cells: list[str]) -> None:
        """The environment's headline row in bold."""
        if key == measure.headline:
            row(f"**{name}**", [f"**{c}**" for c in cells])
        else:
            row(name, cells)

    if any(k.endswith("_success") for k in env.card.metric_labels):
        bold("macro_success", "Macro", [_pct(r["macro_success"]) for _, r in results_list])
        bold("micro_success", "Micro", [_pct(r.get("micro_success")) for _, r in results_list])
        if "mean_score" in env.card.metric_labels:
            bold("mean_score", "Score", [_metric_cell(r, "mean_score") for _, r in results_list])
    else:  # search: exact match is the only measure; one row per way of averaging it
        for key in env.card.metric_labels:
            name = _metric_label(key, env)
            bold(key, name[:1].upper() + name[1:], [_metric_cell(r, key) for _, r in results_list])
    row("Mean length", [_num(r.get("mean_episode_length")) for _, r in results_list])
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
        paper_str = ", ".join(f"{m} {_metric_cell(v, headline)}" for m, v in paper.items() if headline in v)
        notes.append(f"Paper {_metric_label(headline, env)} ({env.card.paper_model}, DESIGN.md §1): {paper_str}.")
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# plots


def _new_figure(width: float, height: float):
    """A matplotlib Figure on the Agg canvas, without pyplot's global state."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _save_png(fig, path: Path) -> Path:
    """Render to memory, then write atomically, so a reader never sees half a PNG."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    atomic_write_bytes(Path(path), buf.getvalue())
    return Path(path)


def _percent_axis(ax) -> None:
    from matplotlib.ticker import PercentFormatter

    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    ax.set_ylim(0, 1.08)
    ax.grid(axis="y", alpha=0.3)


def plot_success_by_type(results: dict, path: Path) -> Path:
    """Bar chart of success per category plus the macro average (and score bars for environments that report a
    score); the title says so when the result is partial."""
    env = _env_of(results)
    types = [t for t, row in results["categories"].items() if row["games"]]  # no bars for categories not played
    fig = _new_figure(max(8, 0.6 * len(types)), 4.2)
    ax = fig.add_subplot()
    names = [type_name(t, env) for t in types] + ["Macro"]
    rates = [results["categories"][t]["success_rate"] for t in types] + [results["macro_success"]]
    colors = ["#4C72B0"] * len(types) + ["#DD8452"]
    heights = [r if r is not None else 0.0 for r in rates]
    bars = ax.bar(names, heights, color=colors)
    rows = [results["categories"][t] for t in types]
    labels = [f"{r['wins']}/{r['games']}" if r["games"] else "none" for r in rows] + [_pct(rates[-1])]
    with_success = any(k.endswith("_success") for k in env.card.metric_labels)
    scores: list[float | None] = [None] * len(names)
    if "mean_score" in env.card.metric_labels and with_success:
        scores = [results["categories"][t].get("mean_score") for t in types] + [results.get("macro_score")]
        ax.plot(
            range(len(names)),
            [x if x is not None else float("nan") for x in scores],
            "D",
            color="#55A868",
            label="mean score",
        )
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # outside: never over a bar's label
    for bar, label, score in zip(bars, labels, scores, strict=True):
        top, offset = bar.get_height(), 2
        if score is not None and score >= top - 0.04:  # the score mark sits on or above the bar: label above it
            top, offset = max(top, score), 7
        ax.annotate(
            label,
            (bar.get_x() + bar.get_width() / 2, top),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, offset),
            textcoords="offset points",
        )
    _percent_axis(ax)
    if any(x is not None for x in scores):
        ax.set_ylim(0, 1.15)  # room for a label above a score mark at 100%
    # success and score are one number where the env reports no success (search: exact match, 0 or 1)
    measure = "success" if with_success else _metric_label(next(iter(env.card.metric_labels)), env).split(" (")[0]
    ax.set_ylabel(measure if with_success else measure + " (= success)")
    if len(names) > 8:
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    title = f"{env.title}: {measure} by {env.card.category_label} — {results['split']}"
    if partial_line(results):
        played = f"{results.get('episodes', 0)} of {results.get('expected_games', '?')} {_plural(env.card.task_noun)}"
        title += f"\nPARTIAL: {played}"
    ax.set_title(title)
    return _save_png(fig, path)


def _tick_labels(ax, names: list[str]) -> None:
    """Category names under the bars, slanted when they would otherwise run together."""
    if len(names) > 8 or sum(len(n) for n in names) > 70:
        ax.tick_params(axis="x", labelsize=8)
        for label in ax.get_xticklabels():
            label.set_rotation(30)
            label.set_horizontalalignment("right")
            label.set_rotation_mode("anchor")


def plot_compare(results_list: list[tuple[str, dict]], path: Path) -> Path:
    """Grouped bar chart of the environment's headline measure: one group per category that some run played plus
    the overall value (ALFWorld: success and its macro average; WebShop: score and all goals; search: exact match
    and the average over data sources), one bar per run."""
    if not results_list:
        raise UserError("nothing to compare: pass at least one eval run")
    types = _all_types(results_list)
    env = _env_of(results_list[0][1])
    measure = _measure(env)
    groups = [type_name(t, env) for t in types] + [measure.overall]
    fig = _new_figure(max(8, 1.2 * len(groups) * max(1, len(results_list)) / 2), 4.5)
    ax = fig.add_subplot()
    width = 0.8 / len(results_list)
    for i, (label, r) in enumerate(results_list):
        values = [(r["categories"].get(t) or {}).get(measure.per_category) for t in types]
        values.append(r.get(measure.headline))
        xs = [g + (i - (len(results_list) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [x if x is not None else 0.0 for x in values], width, label=_marked(label, r))
    ax.set_xticks(range(len(groups)), groups)
    _tick_labels(ax, groups)
    _percent_axis(ax)
    if measure.per_category == "mean_score":  # a score reads 0-100, as the reports print it
        from matplotlib.ticker import FuncFormatter

        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{100 * v:.0f}"))
    ax.set_ylabel(measure.axis)
    splits = sorted({r["split"] for _, r in results_list})
    title = f"{env.title}: {measure.axis.removesuffix(' rate')} by {env.card.category_label} — {', '.join(splits)}"
    if any(partial_line(r) for _, r in results_list):
        title += " (PARTIAL runs marked)"
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save_png(fig, path)


def plot_histogram(
    values: list[float],
    path: Path,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    color: str = "tab:blue",
    log: bool = False,
    bins: int = 60,
) -> Path:
    """A histogram with a vertical line at 0 (e.g. per-token score shifts ℓ_skill − ℓ_old); `log`: log counts."""
    fig = _new_figure(7, 3.5)
    ax = fig.add_subplot()
    ax.hist(values, bins=bins, color=color, alpha=0.85)
    ax.axvline(0.0, color="black", linewidth=0.8)
    if log:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return _save_png(fig, path)


def plot_lines(
    lines: list[tuple[list[float], list[float], str, float | None]],
    path: Path,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
) -> Path:
    """Thin curves on one panel, each (xs, ys, label, alpha or None), with a legend (e.g. a loss per batch)."""
    fig = _new_figure(7, 3.5)
    ax = fig.add_subplot()
    for xs, ys, label, alpha in lines:
        ax.plot(xs, ys, linewidth=0.8, alpha=alpha, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save_png(fig, path)


# ---------------------------------------------------------------------------------------------------------------
# training curves


def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def read_metrics(path: Path) -> list[dict]:
    """metrics.jsonl records; NaN/Infinity tolerated, a half-written last line (run in progress) ignored."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: file not found; `seed plot` takes rl runs (runs/rl/<id>/) that wrote {METRICS}")
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    records: list[dict] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = orjson.loads(line)
        except orjson.JSONDecodeError:
            try:  # json.dumps writes NaN/Infinity, which orjson refuses
                data = json.loads(line)
            except ValueError:
                if lineno == len(lines) and not raw.endswith(b"\n"):
                    break  # the line being written by a live run
                raise UserError(
                    f"{path}:{lineno}: not a JSON line; {METRICS} holds one JSON object per line — "
                    "pass the metrics.jsonl written by `seed rl`"
                ) from None
        if not isinstance(data, dict):
            raise UserError(f"{path}:{lineno}: a JSON {type(data).__name__}, not an object of metrics")
        records.append(data)
    if not records:
        raise UserError(f"{path}: empty, no metrics logged yet; plot again after the run's first update")
    return records


def _series(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one metric; a record without a usable step counts by its position (1-based)."""
    xs, ys = [], []
    for i, rec in enumerate(records, start=1):
        y = _finite(rec.get(key))
        if y is None:
            continue
        x = _finite(rec.get("step"))
        xs.append(x if x is not None else float(i))
        ys.append(y)
    return xs, ys


def _curve_data(runs: list[tuple[str, list[dict]]]) -> list[tuple[str, str, str, list[tuple]]]:
    """Per family present in any run: (stem, title, ylabel, [(run label, series suffix, key, xs, ys)])."""
    out = []
    for stem, title, ylabel, series in CURVE_FAMILIES:
        lines = []
        for label, records in runs:
            for suffix, keys in series:
                key = next((k for k in keys if any(k in rec for rec in records)), None)
                if key is None:
                    continue
                xs, ys = _series(records, key)
                if ys:
                    lines.append((label, suffix, key, xs, ys))
        if lines:
            out.append((stem, title, ylabel, lines))
    return out


def _draw_family(ax, title: str, ylabel: str, lines: list, colors: dict[str, Any]) -> None:
    for run, suffix, _key, xs, ys in lines:
        val = suffix == "val"
        ax.plot(
            xs,
            ys,
            color=colors[run],
            linestyle="--" if val else "-",
            marker="o" if val or len(ys) <= 30 else None,
            markersize=3,
            linewidth=1.4,
            label=f"{run} ({suffix})" if suffix else run,
        )
    ax.set_title(title)
    ax.set_xlabel("step")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole updates: no 0.5 ticks on short runs
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if "success" in title.lower():
        from matplotlib.ticker import PercentFormatter

        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    ax.legend(fontsize=7)


def plot_training_curves(metrics_paths: list[tuple[str, Path]], out_dir: Path) -> list[Path]:
    """One PNG per metric family (one line per run) plus a multi-panel curves.png; families no run logged are skipped."""
    if not metrics_paths:
        raise UserError("nothing to plot: pass at least one rl run")
    runs: list[tuple[str, list[dict]]] = []
    labels_seen: dict[str, int] = {}
    for label, path in metrics_paths:
        n = labels_seen[label] = labels_seen.get(label, 0) + 1
        runs.append((label if n == 1 else f"{label} #{n}", read_metrics(Path(path))))
    families = _curve_data(runs)
    if not families:
        known = ", ".join(k for *_, series in CURVE_FAMILIES for _, keys in series for k in keys)
        raise UserError(
            f"{', '.join(str(p) for _, p in metrics_paths)}: none of the plotted metrics ({known}) were logged; "
            "pass the metrics.jsonl of an rl run"
        )
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    colors = {label: cmap(i % 10) for i, (label, _) in enumerate(runs)}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, title, ylabel, lines in families:
        fig = _new_figure(7, 4)
        _draw_family(fig.add_subplot(), title, ylabel, lines, colors)
        written.append(_save_png(fig, out_dir / f"{stem}.png"))
    ncols = min(3, len(families))
    nrows = math.ceil(len(families) / ncols)
    fig = _new_figure(5.2 * ncols, 3.6 * nrows)
    for i, (_stem, title, ylabel, lines) in enumerate(families):
        _draw_family(fig.add_subplot(nrows, ncols, i + 1), title, ylabel, lines, colors)
    fig.suptitle("Training curves: " + ", ".join(label for label, _ in runs))
    fig.tight_layout()
    written.append(_save_png(fig, out_dir / "curves.png"))
    return written


# ---------------------------------------------------------------------------------------------------------------
# thin entry points for the CLI and the eval stage


def write_eval_outputs(run_dir: Path, results: dict, *, run_id: str, title: str | None = None) -> dict[str, Path]:
    """results.json, report.md and success_by_type.png of an eval run, each written atomically."""
    run_dir = Path(run_dir)
    atomic_write_bytes(run_dir / RESULTS, orjson.dumps(results, option=orjson.OPT_INDENT_2) + b"\n")
    title = title or f"{_env_of(results).title} eval — {results['split']}"
    atomic_write_text(
        run_dir / "report.md", render_report(results, title=title, model_desc=describe_model(results), run_id=run_id)
    )
    png = plot_success_by_type(results, run_dir / "success_by_type.png")
    return {"results": run_dir / RESULTS, "report": run_dir / "report.md", "plot": png}


def _run_label(run: Path) -> str:
    """The run directory's name, prefixed by its algorithm when the manifest says (e.g. 'seed 20250101T…')."""
    run = Path(run)
    d = run if run.is_dir() else run.parent
    label = d.resolve().name or str(d)  # `runs/rl/latest` is labelled by the run it points to
    try:
        data = orjson.loads((d / "manifest.json").read_bytes())
        algo = (data.get("config") or {}).get("algo")
        if isinstance(algo, str):
            return f"{algo.upper()} {label}"
    except (OSError, orjson.JSONDecodeError, AttributeError):
        pass
    return label


def _read_manifest_dict(run_dir: Path) -> dict:
    try:
        data = orjson.loads((run_dir / "manifest.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _model_name(model: str) -> str:
    """A short name for a model directory: its own name, or the checkpoint's for `.../step_000120/model`."""
    parts = [p for p in Path(str(model)).parts if p not in ("model", "/", ".")]
    return parts[-1] if parts else str(model)


def eval_label(run: str | Path, results: dict) -> str:
    """A comparison's name for an eval run: its policy (expert, random) or its model, named by the run it came from
    and that run's algorithm (e.g. 'SEED rl', 'GRPO rl step_000040', 'sft'), else the model directory's name."""
    run = Path(run)
    d = run if run.is_dir() else run.parent
    manifest = _read_manifest_dict(d)
    config = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
    agent = results.get("agent") if isinstance(results.get("agent"), dict) else {}
    policy = config.get("policy") or agent.get("policy") or "model"
    if policy != "model":
        return f"{policy} policy" if isinstance(policy, str) else "mixed policies"
    inputs = manifest.get("inputs") if isinstance(manifest.get("inputs"), list) else []
    source = next((i for i in inputs if isinstance(i, dict) and i.get("stage") in ("sft", "rl")), None)
    if source is not None:
        algo = (_read_manifest_dict(Path(str(source.get("path", "")))).get("config") or {}).get("algo")
        label = f"{algo.upper()} {source['stage']}" if isinstance(algo, str) else str(source["stage"])
        checkpoint = Path(str(config.get("from_run") or "")).name
        return f"{label} {checkpoint}" if checkpoint.startswith("step_") else label
    model = config.get("model") or agent.get("model_id")
    return _model_name(model) if isinstance(model, str) and model else _run_label(run)


def report_command(run_dirs: list[str | Path], out_dir: str | Path) -> dict[str, Path]:
    """`seed report RUN...`: compare.md + compare.png over the runs' results.json; with one run also report.md."""
    loaded = [(Path(r), load_results(r)) for r in run_dirs]
    if not loaded:
        raise UserError("seed report: pass at least one eval run directory")
    names = [eval_label(run, res) for run, res in loaded]
    # runs of the same policy/model are told apart by their run directory
    names = [
        f"{name} · {(run if run.is_dir() else run.parent).resolve().name}" if names.count(name) > 1 else name
        for name, (run, _) in zip(names, loaded, strict=True)
    ]
    labels: dict[str, int] = {}
    results_list = []
    for label, (_run, res) in zip(names, loaded, strict=True):
        n = labels[label] = labels.get(label, 0) + 1
        results_list.append((label if n == 1 else f"{label} #{n}", res))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {"compare_md": out / "compare.md"}
    atomic_write_text(written["compare_md"], compare_runs(results_list))
    written["compare_png"] = plot_compare(results_list, out / "compare.png")
    if len(loaded) == 1:
        run, res = loaded[0]
        written["report_md"] = out / "report.md"
        atomic_write_text(
            written["report_md"],
            render_report(
                res,
                title=f"{_env_of(res).title} eval — {res['split']}",
                model_desc=describe_model(res),
                run_id=results_list[0][0],
            ),
        )
        written["success_png"] = plot_success_by_type(res, out / "success_by_type.png")
    return written


def plot_command(run_dirs: list[str | Path], out_dir: str | Path) -> list[Path]:
    """`seed plot RUN...`: training curves from each run's metrics.jsonl (a run directory or the file itself)."""
    pairs = []
    for r in run_dirs:
        r = Path(r)
        path = r / METRICS if r.is_dir() else r
        if not path.exists():
            raise UserError(f"{r}: no {METRICS}; `seed plot` takes rl runs (runs/rl/<id>/) or their {METRICS}")
        pairs.append((_run_label(r), path))
    return plot_training_curves(pairs, Path(out_dir))
