"""The bodies of `seed report` and `seed plot`, and the eval stage's writer of its results, report and plot."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import orjson

from seedcli.artifacts import Manifest, atomic_write_bytes, atomic_write_text, manifest_sha256, verify_run
from seedcli.errors import UserError
from seedcli.report.compare import (
    check_seeds,
    compare_runs,
    headline_measure,
    protocol_differences,
    protocol_summary,
    protocol_table,
)
from seedcli.report.markdown import describe_model, render_report
from seedcli.report.plots import METRICS, plot_compare, plot_success_by_type, plot_training_curves
from seedcli.report.results import EPISODES, RESULTS, env_of, load_results, per_game, results_path


def write_eval_outputs(run_dir: Path, results: dict, *, run_id: str, title: str | None = None) -> dict[str, Path]:
    """results.json, report.md and success_by_type.png of an eval run, each written atomically."""
    run_dir = Path(run_dir)
    atomic_write_bytes(run_dir / RESULTS, orjson.dumps(results, option=orjson.OPT_INDENT_2) + b"\n")
    title = title or f"{env_of(results).title} eval — {results['split']}"
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


def _training_source(manifest: dict) -> tuple[dict, dict] | None:
    """The rl or sft run an eval run's model came from, as its manifest lists it among the inputs, with that run's
    config ({} when its manifest is missing or unreadable); None when the eval played a model directory or a policy."""
    inputs = manifest.get("inputs") if isinstance(manifest.get("inputs"), list) else []
    source = next((i for i in inputs if isinstance(i, dict) and i.get("stage") in ("sft", "rl")), None)
    if source is None:
        return None
    config = _read_manifest_dict(Path(str(source.get("path", "")))).get("config")
    return source, config if isinstance(config, dict) else {}


def _source_config(run: str | Path) -> dict | None:
    """The config of the rl or sft run whose model an eval run played (`_training_source`); None when the eval did
    not come from one or that run's manifest is missing."""
    run = Path(run)
    found = _training_source(_read_manifest_dict(run if run.is_dir() else run.parent))
    return (found[1] or None) if found else None


# settings that differ between the seeds of one recipe by design, never a recipe's name
_PER_RUN = frozenset({"seed", "runs_dir", "resume", "from_run"})


def recipe_names(configs: list[dict | None], seeds: int) -> list[str] | None:
    """`seed report --seeds k`: a name per recipe from its runs' training configs: the settings that every run of
    a recipe shares and that tell the recipes apart, as `key=value` (the command line's override syntax, e.g.
    "lr=1e-05 kl_coef=0.1"); None when a run has no training config or no setting tells the recipes apart."""
    known = [c for c in configs if c is not None]
    if len(known) < len(configs) or len(known) < 2 * seeds:
        return None
    groups = [known[g : g + seeds] for g in range(0, len(known), seeds)]
    shown = [
        key
        for key in sorted({k for c in known for k in c} - _PER_RUN)
        if all(len({repr(c.get(key)) for c in group}) == 1 for group in groups)
        and len({repr(group[0].get(key)) for group in groups}) > 1
    ]
    if not shown:
        return None
    return [" ".join(f"{k}={group[0].get(k)}" for k in shown) for group in groups]


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
    found = _training_source(manifest)
    if found is not None:
        source, source_config = found
        algo = source_config.get("algo")
        label = f"{algo.upper()} {source['stage']}" if isinstance(algo, str) else str(source["stage"])
        checkpoint = Path(str(config.get("from_run") or "")).name
        return f"{label} {checkpoint}" if checkpoint.startswith("step_") else label
    model = config.get("model") or agent.get("model_id")
    return _model_name(model) if isinstance(model, str) and model else _run_label(run)


def verified_evals(run_args: list[str | Path]) -> list[Manifest]:
    """The manifest of each eval run `seed report` is given (a run directory or its results.json), once each run is
    checked as a stage checks its input (`verify_run`: complete, every output's sha256, its chain of inputs), the
    files the report reads (results.json, episodes.jsonl) are among those its manifest records, and no run is given
    twice, by directory (`latest` and other links resolved) or as a copy (the same manifest.json)."""
    manifests: list[Manifest] = []
    dirs: dict[Path, int] = {}
    shas: dict[str, int] = {}
    for i, arg in enumerate(run_args):
        run_dir = results_path(arg).parent
        real = run_dir.resolve()
        if real in dirs:
            raise UserError(_twice(run_args, dirs[real], i, "the same run directory as"))
        manifest = verify_run(run_dir, "eval")
        recorded = {o.path for o in manifest.outputs}
        for name in (RESULTS, EPISODES):
            if (run_dir / name).exists() and name not in recorded:
                raise UserError(
                    f"{run_dir / name}: not among the files its run's manifest records, so it cannot be checked; "
                    "rerun `seed eval`"
                )
        sha = manifest_sha256(run_dir)
        if sha in shas:
            raise UserError(_twice(run_args, shas[sha], i, "a copy (the same manifest.json) of"))
        dirs[real], shas[sha] = i, i
        manifests.append(manifest)
    return manifests


def _twice(run_args: list[str | Path], first: int, again: int, how: str) -> str:
    """The one line for an eval run given twice: run numbers count from 1 in the order given."""
    return (
        f"seed report: run {again + 1} ({run_args[again]}) is {how} run {first + 1} ({run_args[first]}); pass each "
        "eval run once (a run given twice counts as two runs that agree, which shrinks the spread and the standard "
        "error)"
    )


REPORT_FILES = ("compare.md", "compare.png", "report.md", "success_by_type.png")


def report_dir(out: str | Path | None) -> Path:
    """Where a report goes, never over an earlier one: `out` when it holds no report yet (made if missing), else a
    one-line error; without `out`, a new reports/<UTC time>/ (.2, .3, ... for a second one in the same second)."""
    if out is not None:
        out = Path(out)
        earlier = [name for name in REPORT_FILES if (out / name).exists()]
        if earlier:
            raise UserError(
                f"--out {out}: it holds an earlier report ({earlier[0]}), which this one would overwrite; pass a new "
                "directory, or leave --out out (each report then gets its own reports/<UTC time>/)"
            )
        out.mkdir(parents=True, exist_ok=True)
        return out
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path, n = Path("reports") / stamp, 1
    while True:
        try:
            path.mkdir(parents=True)  # exclusive: two reports in the same second get two directories
            return path
        except FileExistsError:
            n += 1
            path = path.with_name(f"{stamp}.{n}")


def report_command(
    run_dirs: list[str | Path],
    out_dir: str | Path | None,
    seeds: int = 0,
    allow_mismatch: bool = False,
    warn: Callable[[str], None] | None = None,
) -> dict[str, Path]:
    """`seed report RUN...`: compare.md + compare.png over the runs' results.json; with one run also report.md.
    `seeds` (k > 0): the runs after the first are recipes of k seeds each (`compare.seed_groups`). Every run is
    verified first (`verified_evals`); runs played under different protocols (`compare.PROTOCOL`) are refused
    unless `allow_mismatch`, which adds a table of the differences to compare.md and hands it to `warn`."""
    if seeds:
        check_seeds(len(run_dirs), seeds)
    manifests = verified_evals(run_dirs)
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
    key = "won" if headline_measure(env_of(loaded[0][1])).per_category == "success_rate" else "score"
    per_run = [per_game(run, key) for run, _ in loaded]
    mismatch: list[str] = []
    if len({res.get("env", "alfworld") for _, res in loaded}) == 1:  # else compare_runs refuses the mix
        played = zip(manifests, loaded, per_run, strict=True)
        differences = protocol_differences(
            [(m.config, res, None if g is None else set(g)) for m, (_, res), g in played]
        )
        if differences and not allow_mismatch:
            raise UserError(
                f"seed report: the evals were not played under one protocol ({protocol_summary(differences)}), so "
                "their differences would mix those settings with the models; rerun them with the same settings, or "
                "pass --allow-mismatch to compare them anyway with a table of the differences"
            )
        if differences:
            mismatch = protocol_table([label for label, _ in results_list], differences)
            if warn is not None:
                warn("\n".join(mismatch).strip())
    out = report_dir(out_dir)
    written = {"compare_md": out / "compare.md"}
    games = per_run if len(loaded) > 1 else None
    recipes = recipe_names([_source_config(run) for run, _ in loaded[1:]], seeds) if seeds else None
    atomic_write_text(written["compare_md"], compare_runs(results_list, games, seeds, recipes) + "\n".join(mismatch))
    written["compare_png"] = plot_compare(results_list, out / "compare.png")
    if len(loaded) == 1:
        run, res = loaded[0]
        written["report_md"] = out / "report.md"
        atomic_write_text(
            written["report_md"],
            render_report(
                res,
                title=f"{env_of(res).title} eval — {res['split']}",
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
