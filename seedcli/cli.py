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
from rich.console import Console
from rich.table import Table

from seedcli.config import STAGE_CONFIGS, build_config, to_yaml
from seedcli.errors import UserError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="SEED: GRPO + self-evolving on-policy distillation for LLM agents on ALFWorld.",
)
model_app = typer.Typer(no_args_is_help=True, help="Build models (tiny offline models for tests and demos).")
app.add_typer(model_app, name="model")

err_console = Console(stderr=True)

# CLI names that differ from the config field names
_RENAMES = {"from_run": "from"}
_BOOL_FLAGS = {"lora": "--lora/--full"}


def fail(message: str) -> typer.Exit:
    """One line on stderr, exit code 2: the user can fix this."""
    err_console.print(f"[bold red]error:[/] {message}", markup=True, highlight=False, soft_wrap=True)
    return typer.Exit(2)


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
        if field.default is not None and not callable(field.default):
            help_text += f" (default: {field.default})"
        params.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=typer.Option(None, flag, help=help_text, show_default=False),
                annotation=typ | None,
            )
        )
    params += [
        inspect.Parameter(
            "config_file",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(None, "--config", "-c", help="YAML config or preset name (e.g. tiny, paper_qwen25_3b)"),
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
        try:
            cfg = build_config(stage, config_file, kwargs, overrides)
            if print_config:
                sys.stdout.write(to_yaml(cfg))
                return
            manifest = run(cfg)
        except UserError as exc:
            raise fail(str(exc)) from None
        except KeyboardInterrupt:
            err_console.print(f"interrupted; continue with `seed {stage} --resume` and the same options")
            raise typer.Exit(130) from None
        _print_summary(stage, manifest, as_json)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__doc__ = doc
    command.__name__ = stage
    app.command(name=stage, help=doc, context_settings={"allow_interspersed_args": True})(command)


def _lazy(module: str) -> Callable[[Any], Any]:
    """Import a stage only when it runs, so `seed --help` stays fast and stages stay independent."""

    def run(cfg: Any) -> Any:
        import importlib

        return importlib.import_module(f"seedcli.stages.{module}").run(cfg)

    return run


stage_command("collect", _lazy("collect"), "The policy plays ALFWorld games; every episode becomes a trajectory.")
stage_command("annotate", _lazy("annotate"), "An analyzer turns each trajectory into a hindsight skill.")
stage_command("sft", _lazy("sft"), "Fine-tune the policy to write hindsight skills (TRL + PEFT).")
stage_command("rl", _lazy("rl"), "GRPO + self-evolving on-policy distillation.")
stage_command("eval", _lazy("eval"), "Success per task type on ALFWorld's seen / unseen games.")


@model_app.command("init")
def model_init(
    out: Path = typer.Option(..., "--out", help="output directory (Hugging Face format)"),
    preset: str = typer.Option("tiny", "--preset", help="tiny (own BPE tokenizer) | tiny-qwen (real Qwen2.5 tokenizer)"),
    seed: int = typer.Option(0, "--seed", help="initialisation seed"),
    warm_start: str | None = typer.Option(
        None, "--warm-start", help="expert: behaviour-clone ALFWorld's searching expert (+ skill writing)"
    ),
    games: int = typer.Option(240, "--games", help="training games for --warm-start (ALFWorld's train split)"),
    epochs: int = typer.Option(4, "--epochs", help="epochs for --warm-start"),
    noise: float = typer.Option(0.2, "--noise", min=0.0, max=0.9, help="--warm-start: share of random turns"),
) -> None:
    """Build a small model in code (random weights, offline tokenizer) — no model hub needed."""
    try:
        from seedcli.engines.tiny import build_tiny_model
        from seedcli.prompts import tokenizer_corpus

        if preset not in ("tiny", "tiny-qwen"):
            raise UserError(f"unknown preset '{preset}'; use tiny or tiny-qwen")
        path = build_tiny_model(out, preset=preset, seed=seed, corpus=tokenizer_corpus())
        if warm_start:
            if warm_start != "expert":
                raise UserError(f"unknown --warm-start '{warm_start}'; use expert")
            from seedcli.stages.warmstart import warm_start as run_warm_start

            run_warm_start(path, games=games, epochs=epochs, seed=seed, noise=noise)
    except UserError as exc:
        raise fail(str(exc)) from None
    Console().print(f"model written to {path}")


# what `seed runs` shows per stage: the figure a researcher looks for first
_KEY_METRICS = {
    "collect": ("episodes", "success_rate"),
    "annotate": ("annotate/kept", "annotate/rejected"),
    "sft": ("val/loss_before", "val/loss_after"),
    "rl": ("steps", "final_success_rate", "final_opd_loss"),
    "eval": ("games", "macro_success", "partial"),
}


@app.command("runs")
def runs_cmd(
    runs_dir: str = typer.Option("runs", "--runs-dir", help="root of the run directories"),
    stage: str | None = typer.Option(None, "--stage", help="only this stage"),
) -> None:
    """List runs per stage with status, age, key metrics and lineage."""
    from datetime import datetime

    from seedcli.artifacts import list_runs

    rows = [(p, m) for p, m in list_runs(runs_dir) if stage in (None, m.stage)]
    if not rows:
        Console().print(f"no runs under {runs_dir}/")
        return
    table = Table(title=f"runs under {runs_dir}/")
    table.add_column("stage")
    table.add_column("run", no_wrap=True)
    for col in ("status", "age", "key metrics", "inputs"):
        table.add_column(col)
    now = datetime.now(UTC)
    order = {s: i for i, s in enumerate(_KEY_METRICS)}
    rows.sort(key=lambda r: (order.get(r[1].stage, 99), r[1].run_id))
    for _path, m in rows:
        created = datetime.strptime(m.created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        age_s = (now - created).total_seconds()
        age = f"{age_s / 3600:.1f}h" if age_s > 3600 else f"{age_s / 60:.0f}m"
        shown = [(k.split("/")[-1], m.metrics[k]) for k in _KEY_METRICS.get(m.stage, ()) if k in m.metrics]
        metrics = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown)
        lineage = ", ".join(f"{i.stage}/{i.run_id[:16]}" for i in m.inputs)
        table.add_row(m.stage, m.run_id, m.status, age, metrics, lineage)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # a pipe or log file: no need to squeeze into 80 columns
    console.print(table)


@app.command("env")
def env_cmd() -> None:
    """Print versions and devices for bug reports."""
    from seedcli.artifacts import devices, git_info, package_versions

    info = {"versions": package_versions(), "git": git_info(), "devices": devices()}
    import os

    info["ALFWORLD_DATA"] = os.environ.get("ALFWORLD_DATA")
    sys.stdout.write(json.dumps(info, indent=2) + "\n")


@app.command("report")
def report_cmd(
    runs: list[Path] = typer.Argument(..., help="eval run directories"),
    out: Path = typer.Option(Path("reports"), "--out", help="output directory"),
) -> None:
    """Compare eval runs side by side (Markdown table and grouped bar chart)."""
    try:
        from seedcli.reporting import report_command

        written = report_command(runs, out)
    except UserError as exc:
        raise fail(str(exc)) from None
    for name, path in dict(written).items():
        Console().print(f"{name}: {path}")


@app.command("plot")
def plot_cmd(
    runs: list[Path] = typer.Argument(..., help="rl run directories (with metrics.jsonl)"),
    out: Path = typer.Option(Path("plots"), "--out", help="output directory"),
) -> None:
    """Draw training curves from metrics.jsonl to PNG."""
    try:
        from seedcli.reporting import plot_command

        written = plot_command(runs, out)
    except UserError as exc:
        raise fail(str(exc)) from None
    for path in written:
        Console().print(str(path))


@app.command("inspect")
def inspect_cmd(
    run: Path = typer.Argument(..., help="rl run directory"),
    step: int | None = typer.Option(None, "--step", help="update to show (default: the latest with samples)"),
) -> None:
    """Show a sampled episode with its skill and, per response token, ℓ_skill − ℓ_old and the gate, coloured."""
    try:
        from seedcli.rl.inspect import show_samples

        show_samples(run, step)
    except UserError as exc:
        raise fail(str(exc)) from None


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
