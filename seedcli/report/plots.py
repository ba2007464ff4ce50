"""PNG figures of eval results and training curves, and the metrics.jsonl reader behind the curves.

matplotlib is imported inside the drawing functions (importing this module does not load it) and draws on the Agg
canvas, without pyplot's global state; every PNG is written atomically.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import orjson

from seedcli.artifacts import atomic_write_bytes
from seedcli.errors import UserError
from seedcli.report.compare import all_types, headline_measure
from seedcli.report.markdown import marked, metric_label, partial_line, pct, plural, type_name
from seedcli.report.results import env_of

METRICS = "metrics.jsonl"

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
    # a reply's largest per-token term: the token mean above hides the one token that decides a short action
    ("kl_max", "Largest per-token KL(θ‖ref) of a reply", "actor/kl_max", [("", ["actor/kl_max"])]),
    # the same for the skill: does it move the token that decides the move? (the token mean dilutes it)
    (
        "teacher_gap_max",
        "Largest |ℓ_skill − ℓ_θ| of a reply",
        "opd/teacher_gap_absmax",
        [("", ["opd/teacher_gap_absmax"])],
    ),
]


# ---------------------------------------------------------------------------------------------------------------
# eval results


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
    env = env_of(results)
    types = [t for t, row in results["categories"].items() if row["games"]]  # no bars for categories not played
    fig = _new_figure(max(8, 0.6 * len(types)), 4.2)
    ax = fig.add_subplot()
    names = [type_name(t, env) for t in types] + ["Macro"]
    rates = [results["categories"][t]["success_rate"] for t in types] + [results["macro_success"]]
    colors = ["#4C72B0"] * len(types) + ["#DD8452"]
    heights = [r if r is not None else 0.0 for r in rates]
    bars = ax.bar(names, heights, color=colors)
    rows = [results["categories"][t] for t in types]
    labels = [f"{r['wins']}/{r['games']}" if r["games"] else "none" for r in rows] + [pct(rates[-1])]
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
    measure = "success" if with_success else metric_label(next(iter(env.card.metric_labels)), env).split(" (")[0]
    ax.set_ylabel(measure if with_success else measure + " (= success)")
    if len(names) > 8:
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    title = f"{env.title}: {measure} by {env.card.category_label} — {results['split']}"
    if partial_line(results):
        played = f"{results.get('episodes', 0)} of {results.get('expected_games', '?')} {plural(env.card.task_noun)}"
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
    types = all_types(results_list)
    env = env_of(results_list[0][1])
    measure = headline_measure(env)
    groups = [type_name(t, env) for t in types] + [measure.overall]
    fig = _new_figure(max(8, 1.2 * len(groups) * max(1, len(results_list)) / 2), 4.5)
    ax = fig.add_subplot()
    width = 0.8 / len(results_list)
    for i, (label, r) in enumerate(results_list):
        values = [(r["categories"].get(t) or {}).get(measure.per_category) for t in types]
        values.append(r.get(measure.headline))
        xs = [g + (i - (len(results_list) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [x if x is not None else 0.0 for x in values], width, label=marked(label, r))
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
