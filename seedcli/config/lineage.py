"""A stage that reads an earlier run plays what that run played: `seed eval --from`, `seed rl` (`--from`, or the newest
complete sft run) and `seed probe --from` take the environment, its env options and its data root from the run's
manifest (or, for an annotate or sft run, from the collect run it read) when the command does not name them; an
`--env` given that differs is one line naming both. The CLI asks for it (`build_config(...,
inherit=True)`); a config built in code is left as given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from seedcli.envs.registry import canonical_name
from seedcli.errors import UserError

MANIFEST = "manifest.json"
# the stages that play an environment and read an earlier run, with the stages `--from` may name there
READS_RUN = {"eval": ("sft", "rl", "warmstart"), "rl": ("sft", "warmstart"), "probe": ("collect", "eval")}
PLAYED = ("env", "env_options", "data_root")  # what a stage takes from the run it reads


def _manifest(run_dir: Path) -> dict | None:
    try:
        data = orjson.loads((Path(run_dir) / MANIFEST).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("config"), dict) else None


def newest_complete(stage: str, runs_dir: str | Path) -> Path | None:
    """The run a stage's input defaults to: the newest complete run of `stage` under `runs_dir`, from the manifests."""
    best: tuple[str, Path] | None = None
    sdir = Path(runs_dir) / stage
    for d in sdir.iterdir() if sdir.is_dir() else []:
        m = _manifest(d) if d.is_dir() and not d.is_symlink() else None
        if m is not None and m.get("status") == "complete":
            key = (str(m.get("finished") or m.get("created") or ""), d)
            best = key if best is None or key > best else best
    return best[1] if best else None


def input_run(stage: str, values: dict[str, Any]) -> tuple[Path, str] | None:
    """(the run directory a stage's config reads, how the command named it) for `--from` (a checkpoint inside a run
    counts as its run) or rl's default, the newest complete sft run; None when it reads none or it is not there."""
    if stage not in READS_RUN:
        return None
    given = values.get("from_run")
    if given:
        path = Path(str(given))
        run_dir = path if (path / MANIFEST).exists() else path.parent.parent  # runs/rl/<id>/checkpoints/step_N
        return (run_dir.resolve(), f"--from {given}") if (run_dir / MANIFEST).exists() else None
    if stage == "rl" and not values.get("model"):
        found = newest_complete("sft", values.get("runs_dir") or "runs")
        return (found.resolve(), f"the newest sft run ({found})") if found is not None else None
    return None


def played(run_dir: Path, runs_dir: str | Path | None = None, depth: int = 0) -> tuple[Path, dict] | None:
    """(run directory, manifest) of the run whose config names the environment `run_dir`'s episodes came from: its
    own (collect, eval, rl), else that of the runs it read (annotate, sft: their collect run); None when none says."""
    manifest = _manifest(run_dir)
    if manifest is None:
        return None
    if manifest["config"].get("env"):
        return Path(run_dir), manifest
    for ref in manifest.get("inputs") or [] if depth < 4 else []:
        found = _locate(ref, run_dir, runs_dir)
        out = played(found, runs_dir, depth + 1) if found is not None else None
        if out is not None:
            return out
    return None


def _locate(ref: dict, reader: Path, runs_dir: str | Path | None) -> Path | None:
    """An input run as the manifest records it: its absolute path, else by stage and id under the runs root."""
    roots = [Path(runs_dir)] if runs_dir else []
    roots.append(Path(reader).absolute().parent.parent)
    candidates = [Path(str(ref.get("path", "")))]
    for root in roots:
        if ref.get("runs_path"):
            candidates.append(root / str(ref["runs_path"]))
        candidates.append(root / str(ref.get("stage", "")) / str(ref.get("run_id", "")))
    return next((c for c in candidates if (c / MANIFEST).exists()), None)


def conflict(stage: str, given_env: str, other: str, named: str, run_dir: Path) -> str:
    """The one line for an `--env` that is not the environment of the run the stage reads, naming both; the
    `--model` way round only where the run holds a model (an eval or collect run holds none)."""
    model = run_dir / "model"
    weights = (
        f", or --model {model} to start from its weights on purpose" if stage != "probe" and model.is_dir() else ""
    )
    return (
        f"--env {given_env}, but {named} played {other}: this {stage} run would play another environment than the "
        f"run it reads; drop --env (the run's {other} is used), or pass --from a run of {given_env}{weights}"
    )


def inherit_env(stage: str, values: dict[str, Any]) -> dict[str, Any]:
    """`values` (a stage's config values, before validation) with the environment, env options and data root of the
    run it reads filled in where they are not given; an `env` given that differs is a UserError naming both."""
    found = input_run(stage, values)
    source = played(found[0], values.get("runs_dir")) if found is not None else None
    if source is None:
        return values
    run_dir, manifest = source
    config = manifest["config"]
    other = canonical_name(config["env"])
    if values.get("env") is not None and canonical_name(values["env"]) != other:
        raise UserError(conflict(stage, str(values["env"]), other, found[1], found[0]))
    out = dict(values)
    out["env"] = other
    if "env_options" not in values and config.get("env_options"):
        out["env_options"] = dict(config["env_options"])
    if values.get("data_root") is None and config.get("data_root"):
        out["data_root"] = str(_as_meant(run_dir, manifest, str(config["data_root"])))
    return out


def _as_meant(run_dir: Path, manifest: dict, value: str) -> Path:
    """A relative path of a run's config as that run meant it: relative to the directory it was started from."""
    path = Path(value)
    if path.is_absolute():
        return path
    workdir = manifest.get("workdir")
    return Path(workdir) / path if workdir and Path(workdir).is_dir() else path
