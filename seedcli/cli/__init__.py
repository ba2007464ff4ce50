"""The `seed` command: one thin command per stage. Options are generated from the stage's pydantic config, so
`--help`, YAML keys and `key=value` overrides always agree; the stage modules do the work."""

from __future__ import annotations

import inspect
import json
import sys
import typing
from collections.abc import Callable
from datetime import UTC
from pathlib import Path
from typing import Any

import typer
from pydantic_core import PydanticUndefined
from rich.console import Console
from rich.table import Table
from rich.text import Text

from seedcli.cli.common import OneLineErrors, cli_errors, err_console, out_dir
from seedcli.cli.model import model_app, retriever_app
from seedcli.config import STAGE_CONFIGS, build_config, to_yaml
from seedcli.errors import UserError

app = typer.Typer(
    cls=OneLineErrors,  # a bad option or value is one `error:` line (exit 2), as every other error
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="SEED: GRPO + self-evolving on-policy distillation for LLM agents on ALFWorld, WebShop, Search-QA, "
    "Sokoban and EZPoints (`seed envs` describes each environment, its data and options).",
)
# `seed model` and `seed retriever` live in cli/model.py
app.add_typer(model_app, name="model")
app.add_typer(retriever_app, name="retriever")

# CLI names that differ from the config field names
_RENAMES = {"from_run": "from"}
_BOOL_FLAGS = {"lora": "--lora/--full"}


def preflight(stage: str, cfg: Any) -> None:
    """Checks that need no run directory: the device, the engine and the model directory the options name, so a
    run that cannot start leaves nothing behind."""
    from seedcli.engines.base import check_device, check_engine, check_model_dir

    check_from_env(stage, cfg)
    local_model = stage != "annotate" or getattr(cfg, "analyzer", None) == "policy"
    if not local_model or getattr(cfg, "print_memory_plan", False):  # (rl: a plan needs no engine or device here)
        return
    if getattr(cfg, "device", None):
        check_device(cfg.device)
    if getattr(cfg, "engine", None):
        check_engine(cfg.engine)
    if getattr(cfg, "model", None):
        check_model_dir(cfg.model)


def run_env(run_dir: Path, runs_dir: str | None = None) -> str | None:
    """The environment a run's episodes came from: its config's `env` (collect, eval, rl), else that of the runs it
    read (annotate, sft: their collect run); None when no manifest on the way says."""
    from seedcli.config.lineage import played

    found = played(Path(run_dir), runs_dir)
    return str(found[1]["config"]["env"]) if found is not None else None


def check_from_env(stage: str, cfg: Any) -> None:
    """A config built in code (the CLI's inherits it: `lineage.inherit_env`) whose input run (`--from`, or rl's
    default: the newest sft run) played another environment is refused in one line naming both: `--from` continues a
    lineage, and a lineage plays one environment. Crossing environments on purpose goes through `--model`, which
    starts from the weights without claiming the lineage."""
    from seedcli.config.lineage import READS_RUN, conflict, input_run

    if stage not in READS_RUN:
        return
    found = input_run(stage, {"from_run": cfg.from_run, "model": cfg.model, "runs_dir": cfg.runs_dir})
    if found is None or (stage != "probe" and cfg.model and not cfg.from_run):  # (probe: --from is its episodes)
        return
    other = run_env(found[0], cfg.runs_dir)
    if other is not None and other != cfg.env:
        raise UserError(conflict(stage, cfg.env, other, found[1], found[0]))


def _option_type(annotation: Any) -> Any:
    """Map a config field's type to what the CLI parses (pydantic validates the value afterwards)."""
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)) and args:
        return _option_type(args[0])
    if annotation is bool:
        return bool
    if annotation in (int, float):
        return annotation
    return str


def _print_summary(stage: str, manifest, as_json: bool) -> None:
    summary = {"stage": stage, "run_id": manifest.run_id, "status": manifest.status, "metrics": manifest.metrics}
    if as_json:
        sys.stdout.write(json.dumps(summary, default=str) + "\n")
        return
    console = Console()
    table = Table(title=f"{stage} {manifest.run_id}: {manifest.status}", show_header=False)
    for key, value in manifest.metrics.items():
        if isinstance(value, (dict, list)):
            value = json.dumps(value, default=str)
            value = value if len(value) < 120 else value[:117] + "..."
        elif isinstance(value, float):
            value = f"{value:.4g}"
        table.add_row(key, str(value))
    console.print(table)


def stage_command(stage: str, run: Callable[[Any], Any], doc: str, extra_args: bool = True) -> None:
    """Register `seed <stage>` with one option per config field."""
    cls = STAGE_CONFIGS[stage]
    params = []
    for name, field in cls.model_fields.items():
        flag = _BOOL_FLAGS.get(name) or "--" + _RENAMES.get(name, name).replace("_", "-")
        typ = _option_type(field.annotation)
        help_text = field.description or ""
        if name == "env":  # the choices are the registered environments
            from seedcli.envs import env_names

            help_text = f"environment: {' | '.join(env_names())} | package.module:Class (`seed envs` describes each)"
        # a default that depends on the environment is described in the help text itself, not as one number
        env_default = (
            (field.json_schema_extra or {}).get("env_default") if isinstance(field.json_schema_extra, dict) else None
        )
        if field.default not in (None, PydanticUndefined) and not callable(field.default) and not env_default:
            help_text += f" (default: {field.default})"
        params.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=typer.Option(None, flag, help=help_text, show_default=False),
                annotation=typ | None,
            )
        )
    for old, new in cls.old_names.items():  # the old spelling of a renamed option: works, hidden, warned
        params.append(
            inspect.Parameter(
                old,
                inspect.Parameter.KEYWORD_ONLY,
                default=typer.Option(None, "--" + old.replace("_", "-"), hidden=True, help=f"the old name of {new}"),
                annotation=_option_type(cls.model_fields[new].annotation) | None,
            )
        )
    params += [
        inspect.Parameter(
            "config_file",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(
                None, "--config", "-c", help="YAML config or preset name (e.g. tiny, paper_qwen25_3b)"
            ),
            annotation=str | None,
        ),
        inspect.Parameter(
            "print_config",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(False, "--print-config", help="print the resolved config and exit"),
            annotation=bool,
        ),
        inspect.Parameter(
            "as_json",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(False, "--json", help="print the result summary as JSON on stdout"),
            annotation=bool,
        ),
        inspect.Parameter(
            "overrides",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Argument(None, help="key=value config overrides", show_default=False),
            annotation=list[str] | None,
        ),
    ]

    def command(**kwargs: Any) -> None:
        config_file = kwargs.pop("config_file")
        print_config = kwargs.pop("print_config")
        as_json = kwargs.pop("as_json")
        overrides = kwargs.pop("overrides")
        cfg = None
        with cli_errors(stage, lambda: getattr(cfg, "runs_dir", None), lambda: _interrupted(stage)):
            cfg = build_config(stage, config_file, kwargs, overrides, inherit=True)
            if print_config:
                sys.stdout.write(to_yaml(cfg))
                return
            preflight(stage, cfg)
            manifest = run(cfg)
        _print_summary(stage, manifest, as_json)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__doc__ = doc
    command.__name__ = stage
    app.command(name=stage, help=doc, context_settings={"allow_interspersed_args": True})(command)


def _interrupted(stage: str) -> None:
    """Ctrl-C in a stage: how to continue, or that nothing was kept."""
    from seedcli.artifacts import CURRENT_RUN

    if CURRENT_RUN is not None and CURRENT_RUN.is_dir():
        err_console.print(f"interrupted; continue with `seed {stage} --resume {CURRENT_RUN}`")
    else:  # stopped before the run wrote anything: its directory was removed, there is nothing to resume
        err_console.print(f"interrupted before anything was written; nothing was kept, so start `seed {stage}` again")


def _lazy(module: str) -> Callable[[Any], Any]:
    """Import a stage only when it runs, so `seed --help` stays fast and stages stay independent."""

    def run(cfg: Any) -> Any:
        import importlib

        return importlib.import_module(f"seedcli.stages.{module}").run(cfg)

    return run


stage_command(
    "collect", _lazy("collect"), "The policy plays an environment's tasks; every episode becomes a trajectory."
)
stage_command("annotate", _lazy("annotate"), "An analyzer turns each trajectory into a hindsight skill.")
stage_command("sft", _lazy("sft"), "Fine-tune the policy to write hindsight skills (TRL + PEFT).")
stage_command("rl", _lazy("rl"), "GRPO + self-evolving on-policy distillation.")
stage_command(
    "eval",
    _lazy("eval"),
    "The environment's metrics per category on an evaluation split (ALFWorld seen / unseen, WebShop test, "
    "search test / dev, Sokoban and EZPoints test).",
)
stage_command(
    "warmstart",
    _lazy("warmstart"),
    "Behaviour-clone an environment's expert into a model (acting + skill writing), before Stage 1; its model/ is "
    "what collect, sft, rl and eval take (`seed model init --warm-start expert` is the short form).",
)

stage_command(
    "probe",
    _lazy("probe"),
    "What a skill does to the teacher, without training: re-score a collect or eval run's response tokens under no "
    "skill, a null text, the episode's own skill, another task's, and the oracle's (privileged), and with --play N "
    "play N tasks again under each (runs/probe/<id>/probe.json, probe.png); --measure absorption reads what "
    "distillation moved off the student on a panel of expert-played states (the expert's action tokens with no "
    "skill, the oracle teacher's gap on its own samples), paired against a --baseline probe.",
)

# what `seed runs` shows per stage: the figure a researcher looks for first
_KEY_METRICS = {
    "collect": ("env", "episodes", "success_rate", "mean_score"),
    "annotate": ("annotate/kept", "annotate/rejected", "skills/leak_frac"),
    "sft": ("val/loss_before", "val/loss_after"),
    "rl": ("steps", "final_success_rate", "final_opd_loss"),
    "eval": ("env", "games", "macro_success", "mean_score", "partial"),
    "probe": ("episodes", "delta_action/oracle", "delta_action/own", "absorption/expert_action_logp"),
}


@app.command("runs")
def runs_cmd(
    runs_dir: str = typer.Option("runs", "--runs-dir", help="root of the run directories"),
    stage: str | None = typer.Option(None, "--stage", help="only this stage"),
    show_all: bool = typer.Option(False, "--all", help="also list damaged run directories, with the reason"),
    verify: bool = typer.Option(
        False,
        "--verify",
        help="check every output file's sha256 against its run's manifest (reads every byte: about 0.7 s per GB); "
        "without it each file is checked by its size only",
    ),
) -> None:
    """List runs per stage with status (running, interrupted, complete, modified, failed), age, key metrics and
    lineage. A complete run whose files or inputs no longer match its manifest is listed as modified."""
    from datetime import datetime

    from seedcli.artifacts import damaged_runs, list_runs, run_state

    rows = [(p, m) for p, m in list_runs(runs_dir) if stage in (None, m.stage)]
    damaged = [(p, why) for p, why in damaged_runs(runs_dir) if stage in (None, p.parent.name)]
    if not rows and not (show_all and damaged):
        Console().print(
            f"no runs under {runs_dir}/" + (f" ({len(damaged)} damaged: `seed runs --all`)" if damaged else "")
        )
        return
    table = Table(title=f"runs under {runs_dir}/")
    table.add_column("stage")
    table.add_column("run", no_wrap=True)
    for col in ("status", "age", "key metrics", "inputs", "files"):
        table.add_column(col)
    now = datetime.now(UTC)
    order = {s: i for i, s in enumerate(_KEY_METRICS)}
    rows.sort(key=lambda r: (order.get(r[1].stage, 99), r[1].run_id))
    for path, m in rows:
        created = datetime.strptime(m.created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        age_s = (now - created).total_seconds()
        age = f"{age_s / 3600:.1f}h" if age_s > 3600 else f"{age_s / 60:.0f}m"
        shown = [(k.split("/")[-1], m.metrics[k]) for k in _KEY_METRICS.get(m.stage, ()) if k in m.metrics]
        if m.stage == "rl":  # which method the run is: its algorithm, and the analyzer that wrote its skills
            algo = m.config.get("algo", "seed")
            method = [("algo", algo)] + ([] if algo in ("grpo", "gigpo") else [("analyzer", m.config.get("analyzer"))])
            shown = method + shown
        metrics = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown)
        lineage = ", ".join(f"{i.stage}/{i.run_id[:16]}" for i in m.inputs)
        state, files = run_state(path, m), ""
        if state == "complete":
            state, files = _files_check(path, m, runs_dir, verify)
        table.add_row(m.stage, m.run_id, state, age, metrics, lineage, files)
    if show_all:
        for path, why in damaged:
            table.add_row(path.parent.name, path.name, "damaged", "", why, "", "")
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # a pipe or log file: no need to squeeze into 80 columns
    console.print(table)
    if not verify:
        console.print(
            "files: each output checked by its size only, sha256 not checked; `seed runs --verify` checks every byte"
        )
    if damaged and not show_all:
        console.print(
            f"{len(damaged)} damaged run director{'y' if len(damaged) == 1 else 'ies'} not shown: `seed runs --all`"
        )


def _files_check(path: Path, manifest, runs_dir: str, verify: bool) -> tuple[str, str]:
    """(status, files cell) of a complete run: `modified` and the first problem when its outputs or its inputs'
    manifests no longer match (`artifacts.run_problems`), else complete and how its files were checked: by size, or
    by sha256 with --verify."""
    from seedcli.artifacts import run_problems

    problems = run_problems(path, manifest, runs_dir, hashes=verify)
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return "modified", problems[0] + more
    return "complete", "sha256 ok" if verify else "sizes ok"


@app.command("env")
def env_cmd() -> None:
    """Print versions and devices for bug reports."""
    from seedcli.artifacts import devices, git_info, package_versions

    info: dict[str, Any] = {"versions": package_versions(), "git": git_info(), "devices": devices()}
    info["data_roots"] = data_roots()
    sys.stdout.write(json.dumps(info, indent=2) + "\n")


@app.command("envs")
def envs_cmd(
    as_json: bool = typer.Option(False, "--json", help="print the description as JSON on stdout"),
    data_root: str | None = typer.Option(None, "--data-root", help="describe the data at this folder instead"),
    env: str | None = typer.Option(None, "--env", help="only this environment"),
) -> None:
    """Every registered environment: its splits and task counts (per category), data root, turns, observations,
    and env options with their types, defaults and meaning. Missing data is one line per environment."""
    with cli_errors("envs"):
        from seedcli.envs import entry, env_names

        names = list(env_names())
        if data_root is not None and env is None:
            raise UserError("--data-root describes one environment's data: add --env NAME")
        if env is not None:
            names = [entry(env).name]  # a module:Class path too; an unknown name is one line
        described = [describe_env(name, data_root) for name in names]
    if as_json:
        sys.stdout.write(json.dumps(described, indent=2, default=str) + "\n")
        return
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(width=160, highlight=False)  # a pipe or log file: no need to squeeze into 80 columns
    say = lambda text: console.print(text, markup=False, soft_wrap=True)  # noqa: E731 - split names hold [brackets]
    for d in described:
        say(f"{d['name']} ({d['title']}; {d['origin']}): {d['turns']} turns, history {d['history']}, observations: "
            f"{', '.join(d['observation_modes'])}; categories: {d['category_label']}")  # fmt: skip
        say(f"  data: {d['data_root']}" if d["data_root"] else f"  data: missing: {d['data_missing']}")
        names = []
        for split in d["splits"]:
            role = ", ".join(split["roles"])
            aliases = f" (also: {', '.join(split['aliases'])})" if split["aliases"] else ""
            head = f"{split['name']}{aliases}" + (f" [{role}]" if role else "")
            names.append(head)
            if d["data_root"] is None:
                continue
            if "error" in split:
                say(f"  split {head}: {split['error']}")
                continue
            cats = ", ".join(f"{c} {n}" for c, n in split["categories"].items())
            say(f"  split {head}: {split['tasks']} {d['task_noun']}s ({cats})")
        if d["data_root"] is None:
            say(f"  splits (no data to count): {'; '.join(names)}")
        if d["free_split"]:
            say(f"  split FILE: {d['free_split']}")
        if not d["options"]:
            say("  env options: none")
            continue
        table = Table(show_header=True, box=None, padding=(0, 2, 0, 4))
        for col in ("env option", "type", "default", "meaning"):
            table.add_column(col)
        for opt in d["options"]:
            default = "-" if opt["default"] is None else str(opt["default"])
            table.add_row(*(Text(x) for x in (opt["name"], opt["type"], default, opt["meaning"])))
        console.print(table)


def describe_env(name: str, data_root: str | None = None) -> dict[str, Any]:
    """What `seed envs` shows of one environment; data that is missing is described by the error's one line."""
    from collections import Counter

    from seedcli.envs import entry, env_class

    cls = env_class(name)
    env = cls(data_root=data_root)
    out: dict[str, Any] = {
        "name": cls.name,
        "title": cls.title,
        "origin": entry(name).origin,
        "turns": cls.max_steps,
        "history": cls.history,
        "observation_modes": list(cls.observation_modes),
        "category_label": cls.card.category_label,
        "task_noun": cls.card.task_noun,
        "data_root": None,
        "data_missing": None,
        "splits": [],
        "free_split": cls.split_file or None,
        "options": [
            {"name": n, "type": t, "default": default, "meaning": meaning}
            for n, t, default, meaning in cls.option_specs()
        ],
    }
    try:
        out["data_root"] = str(env.resolve_data_root())
    except UserError as exc:
        out["data_missing"] = str(exc)
    canonical = list(dict.fromkeys(cls.splits.values()))
    for split in canonical:
        roles = [r for r, on in (("train", split == cls.train_split), ("eval" + (" default" if cls.eval_splits[:1] == (split,) else ""), split in cls.eval_splits), ("rl validation", split == cls.val_split)) if on]  # fmt: skip
        entry: dict[str, Any] = {
            "name": split,
            "aliases": [a for a, c in cls.splits.items() if c == split and a != split],
            "roles": roles,
        }
        if out["data_root"] is None:
            entry["error"] = "no data"
        else:
            try:
                tasks = env.list_tasks(split)
                counts = Counter(t.category for t in tasks)
                order = [c for c in cls.categories if c in counts] + sorted(set(counts) - set(cls.categories))
                entry.update(tasks=len(tasks), categories={c: counts[c] for c in order})
            except UserError as exc:
                entry["error"] = " ".join(str(exc).split())
        out["splits"].append(entry)
    return out


def data_roots() -> dict[str, str]:
    """Each environment's data root as the stages would resolve it now, or why it is not found."""
    from seedcli.envs import ENV_NAMES, get_env

    out: dict[str, str] = {}
    for name in ENV_NAMES:
        try:
            out[name] = str(get_env(name).resolve_data_root())
        except UserError as exc:
            out[name] = f"not found: {exc}"
        except Exception as exc:  # noqa: BLE001 - a report for bug reports must not itself crash
            out[name] = f"error: {type(exc).__name__}: {exc}"
    return out


@app.command("report")
def report_cmd(
    runs: list[Path] = typer.Argument(..., help="eval run directories"),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="output directory (default: a new reports/<UTC time>/ per report); one that holds an earlier report is "
        "refused, so no report overwrites another",
    ),
    seeds: int = typer.Option(
        0,
        "--seeds",
        min=0,
        help="the runs after the first are seeds of recipes, this many each: adds each recipe's mean and its gain "
        "over the first run with a standard error that includes the seeds' spread",
    ),
    allow_mismatch: bool = typer.Option(
        False,
        "--allow-mismatch",
        help="compare evals played under different settings (tasks, split, turn limit, sampling, environment "
        "options) anyway; the differences are printed and added to compare.md",
    ),
) -> None:
    """Compare eval runs side by side (Markdown table and grouped bar chart); runs that played the same games get
    their paired gain over the first run, with its standard error. `--seeds K`: START, then K runs per recipe. Every
    run is checked against its manifest first; a run given twice, or evals played under different settings, are
    refused (the latter unless --allow-mismatch)."""
    with cli_errors("report"):
        from seedcli.report.commands import report_command

        if out is not None:
            out_dir(out, "report")

        written = report_command(runs, out, seeds, allow_mismatch, warn=lambda table: typer.echo(table, err=True))
    for name, path in dict(written).items():
        Console().print(f"{name}: {path}")


@app.command("plot")
def plot_cmd(
    runs: list[Path] = typer.Argument(..., help="rl run directories (with metrics.jsonl)"),
    out: Path = typer.Option(Path("plots"), "--out", help="output directory"),
) -> None:
    """Draw training curves from metrics.jsonl to PNG."""
    with cli_errors("plot"):
        from seedcli.report.commands import plot_command

        out_dir(out, "figures")

        written = plot_command(runs, out)
    for path in written:
        Console().print(str(path))


@app.command("inspect")
def inspect_cmd(
    run: Path = typer.Argument(..., help="a collect, eval or rl run directory"),
    step: int | None = typer.Option(None, "--step", help="rl: the update to show (default: the latest with samples)"),
    episode: str | None = typer.Option(None, "--episode", help="collect/eval: the episode to show in full (its id)"),
    failed: bool = typer.Option(False, "--failed", help="collect/eval: list only the episodes that were not won"),
    plays: bool = typer.Option(
        False, "--plays", help="collect/eval: the commonest action sequences, each with its episodes won and lost"
    ),
) -> None:
    """Read a run's episodes. Collect or eval run: a table of its episodes (id, category, won, score, length), then
    one in full (turns, observations, actions, validity, reward, score); with --plays the commonest action
    sequences instead. Rl run: a sampled episode with its skill and, per response token, ℓ_skill − ℓ_old and the
    gate, coloured."""
    with cli_errors("inspect"):
        from seedcli.inspection import inspect_run

        inspect_run(run, step=step, episode=episode, failed=failed, plays=plays)


def _normalise_resume(argv: list[str]) -> list[str]:
    """A bare `--resume` means `--resume auto` (newest incomplete run of the same config)."""
    out = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg == "--resume":
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is None or nxt.startswith("-") or "=" in nxt:
                out.append("auto")
    return out


def main() -> None:
    import os

    # the stages draw their own progress; transformers' per-shard load/save bars only add noise to logs
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    sys.argv[1:] = _normalise_resume(sys.argv[1:])
    app()


if __name__ == "__main__":
    main()
