"""Stage configs: one pydantic model per stage (extra="forbid", every field described), YAML presets, overrides.

Resolution order, later wins: the model's defaults (the paper's numbers where the paper gives one) → a preset or
`--config FILE` (a YAML mapping, optionally with one section per stage) → CLI options → `key=value` overrides.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import yaml
from pydantic import BaseModel, ValidationError

from seedcli.config.base import (  # noqa: F401 - the names every caller imports from seedcli.config
    CONFIGS_DIR,
    StageConfig,
    hash_key,
    nearest,
    renamed,
)
from seedcli.config.lineage import inherit_env
from seedcli.config.probe import ProbeConfig
from seedcli.config.rl import RLConfig
from seedcli.config.stages import (  # noqa: F401
    AnnotateConfig,
    CollectConfig,
    EvalConfig,
    RolloutConfig,
    SFTConfig,
    WarmStartConfig,
)
from seedcli.errors import UserError

STAGE_CONFIGS: dict[str, type[StageConfig]] = {
    "collect": CollectConfig,
    "annotate": AnnotateConfig,
    "sft": SFTConfig,
    "rl": RLConfig,
    "eval": EvalConfig,
    "warmstart": WarmStartConfig,
    "probe": ProbeConfig,
}


def parse_overrides(pairs: list[str] | None) -> dict[str, Any]:
    """`key=value` strings → dict; values parsed as YAML scalars (numbers, booleans, null, lists)."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise UserError(f"override '{pair}' is not key=value (example: temperature=0.7)")
        key, value = pair.split("=", 1)
        try:
            out[key.strip().replace("-", "_")] = yaml.safe_load(value) if value != "" else None
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise UserError(f"config file {path} not found; list presets with `ls {CONFIGS_DIR}`")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)}); fix the file") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of config keys, got {type(data).__name__}")
    return data


def resolve_preset(name_or_path: str) -> Path:
    """A preset name (e.g. `tiny`, `alfworld/paper_qwen25_3b`) or a file path."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    for candidate in (CONFIGS_DIR / f"{name_or_path}.yaml", CONFIGS_DIR / "alfworld" / f"{name_or_path}.yaml"):
        if candidate.exists():
            return candidate
    names = sorted(str(f.relative_to(CONFIGS_DIR).with_suffix("")) for f in CONFIGS_DIR.rglob("*.yaml"))
    raise UserError(f"config '{name_or_path}' not found; presets: {', '.join(names)} (or pass a YAML file path)")


# shared keys whose value is a mapping (a preset's top level may hold them beside the stage sections)
MAPPING_FIELDS = ("env_options",)

# sections a preset may hold for the scripts around the stages (not read by any stage), with their keys
SCRIPT_SECTIONS: dict[str, tuple[str, ...]] = {
    # the older spelling of the `warmstart:` stage section (scripts/method_check.sh reads either)
    "warm_start": ("games", "epochs", "noise", "seed", "lr"),
    "method_check": ("seeds", "arms"),  # scripts/method_check.sh: the seeds and the rl arguments of each arm
    "model": ("preset",),  # scripts/method_check.sh: the `seed model init` preset the check starts from
    "stage1": ("heldout_tasks",),  # scripts/method_check.sh: Stage 1 (collect → annotate → sft) before Stage 2
    # scripts/positive_control.py: the start model, seeds, the rl pool and the panels, and the rl arguments of each arm
    "positive_control": ("start", "seeds", "train_tasks", "heldout_panel", "heldout_limit", "arms"),
}


def _all_fields() -> set[str]:
    return {name for cls in STAGE_CONFIGS.values() for name in (*cls.model_fields, *cls.old_names)}


def check_yaml_keys(data: dict, path: Path) -> None:
    """Every key of a config file must mean something: a stage section holding that stage's fields, or a shared
    field of some stage. A typo is a one-line error naming the key and the nearest valid one."""
    shared_valid = sorted(_all_fields())
    for key, value in data.items():
        key = str(key)
        if key in STAGE_CONFIGS:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise UserError(f"{path}: section '{key}' must be a mapping of {key} config keys")
            fields = list(STAGE_CONFIGS[key].model_fields)
            for sub in value:
                if str(sub) not in fields and str(sub) not in STAGE_CONFIGS[key].old_names:
                    raise UserError(
                        f"{path}: unknown key '{key}.{sub}'{nearest(str(sub), fields)} "
                        f"(`seed {key} --help` lists the keys)"
                    )
        elif key in SCRIPT_SECTIONS and isinstance(value, dict):
            for sub in value:
                if str(sub) not in SCRIPT_SECTIONS[key]:
                    raise UserError(
                        f"{path}: unknown key '{key}.{sub}'{nearest(str(sub), SCRIPT_SECTIONS[key])} "
                        f"(valid: {', '.join(SCRIPT_SECTIONS[key])})"
                    )
        elif isinstance(value, dict) and key not in MAPPING_FIELDS:
            raise UserError(
                f"{path}: unknown section '{key}'{nearest(key, list(STAGE_CONFIGS))} "
                f"(sections: {', '.join(STAGE_CONFIGS)})"
            )
        elif key not in shared_valid:
            raise UserError(f"{path}: unknown key '{key}'{nearest(key, shared_valid)}")


def saved_config(run_dir: Path) -> dict:
    """The config a run was made with: its config.yaml (or, failing that, the manifest's copy)."""
    cfg_file = Path(run_dir) / "config.yaml"
    if cfg_file.exists():
        return load_yaml(cfg_file)
    manifest = Path(run_dir) / "manifest.json"
    if manifest.exists():
        try:
            return dict(orjson.loads(manifest.read_bytes()).get("config") or {})
        except (orjson.JSONDecodeError, AttributeError):
            pass
    raise UserError(f"--resume {run_dir}: no config.yaml or manifest.json; pass a run directory under runs/<stage>/")


def run_workdir(run_dir: Path, saved: dict | None = None) -> Path | None:
    """The directory a run was started from (relative paths in its config are relative to it): the manifest's
    `workdir`, else worked out from a relative runs_dir as `<workdir>/<runs_dir>/<stage>/<run id>`; None if unknown."""
    run_dir = Path(run_dir)
    try:
        recorded = orjson.loads((run_dir / "manifest.json").read_bytes()).get("workdir")
    except (OSError, orjson.JSONDecodeError, AttributeError):
        recorded = None
    if recorded and Path(recorded).is_dir():
        return Path(recorded)
    # not recorded (older runs), or gone (the project moved, runs and all): where a relative runs_dir puts it
    runs_dir = (saved if saved is not None else saved_config(run_dir)).get("runs_dir") or "runs"
    parts = Path(str(runs_dir)).parts
    root = run_dir.absolute().parent.parent
    if not parts:  # runs_dir "."
        return root
    if Path(str(runs_dir)).is_absolute() or ".." in parts or root.parts[-len(parts) :] != parts:
        return None
    return Path(*root.parts[: -len(parts)])


def _resume_values(stage: str, run_dir: Path, given: dict[str, Any], source: str) -> dict[str, Any]:
    """`--resume DIR`: the run's saved config, with the options given again checked against it. Options that do not
    change what the run computes (workers, batch sizes, device) may differ; any other difference is refused."""
    cls = STAGE_CONFIGS[stage]
    if run_dir.is_symlink():  # runs/<stage>/latest: resume the run it points to, not the pointer
        run_dir = run_dir.parent / run_dir.readlink()
    if not run_dir.is_dir():
        raise UserError(
            f"--resume {run_dir}: not a directory; pass a run directory (or a bare --resume for the newest)"
        )
    saved = {k: v for k, v in renamed(cls, saved_config(run_dir)).items() if k in cls.model_fields}
    unhashed = {n for n, f in cls.model_fields.items() if (f.json_schema_extra or {}).get("hash") is False}
    # a value given again counts as equal when pydantic normalises both to the same thing (e.g. "a,b" vs [a, b])
    try:
        normal = cls(**{**saved, **given}).model_dump(mode="json")
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "?"
        raise UserError(f"{stage} config ({source}): field '{loc}': {_message(err)}") from None
    differ = sorted(k for k in given if k not in unhashed and k in saved and normal[k] != saved[k])
    if differ:
        shown = ", ".join(f"{k} (run: {saved[k]!r}, given: {normal[k]!r})" for k in differ)
        raise UserError(
            f"--resume {run_dir}: options differ from the run's saved config: {shown}; drop them — "
            f"`seed {stage} --resume {run_dir}` reads {run_dir / 'config.yaml'} — or start a new run without --resume"
        )
    values = {**saved, **given}
    # the run's own runs root, wherever it was made from; absolute, as the working directory may change below
    values["runs_dir"] = str(Path(given.get("runs_dir") or run_dir.parent.parent).absolute())
    values["resume"] = str(run_dir.absolute())
    # continue in the directory the run was started from, so every relative path in its saved config (model,
    # from_run, data_root, static:FILE, ...) means what it meant then, whichever directory `--resume` is typed in;
    # the config, and so its hash, stay exactly as saved
    workdir = run_workdir(run_dir, saved_config(run_dir))
    if workdir is not None and workdir.is_dir() and workdir.resolve() != Path.cwd().resolve():
        os.chdir(workdir)
    return values


def build_config(
    stage: str,
    config_file: str | None = None,
    cli: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
    inherit: bool = False,
) -> StageConfig:
    """Resolve a stage config; a bad key or value is a one-line UserError naming the field and the source.
    With `resume=DIR` the run's saved config is the base, options given again must agree with it, and the process
    moves to the directory the run was started from (its relative paths resolve as they did then). With `inherit`
    (the CLI), a stage that reads an earlier run takes what it played from it (`lineage.inherit_env`). An old
    spelling of a field (`old_names`) is read as its new name, with a warning."""
    cls = STAGE_CONFIGS[stage]
    values: dict[str, Any] = {}
    source = "defaults"
    if config_file:
        path = resolve_preset(config_file)
        data = load_yaml(path)
        check_yaml_keys(data, path)
        # a preset holds one section per stage plus optional shared keys
        shared = {
            k: v for k, v in data.items() if k not in STAGE_CONFIGS and (not isinstance(v, dict) or k in MAPPING_FIELDS)
        }
        section = data.get(stage, {}) or {}
        shared = {k: v for k, v in shared.items() if k in cls.model_fields or k in cls.old_names}
        values.update(renamed(cls, shared, str(path)))
        values.update(renamed(cls, section, f"{path}, section {stage}"))
        source = str(path)
    given = {k: v for k, v in (cli or {}).items() if v is not None}
    values.update(renamed(cls, given, " ".join(f"--{k.replace('_', '-')}" for k in given if k in cls.old_names)))
    values.update(renamed(cls, parse_overrides(overrides), "key=value"))
    for key in values:
        if key not in cls.model_fields:
            article = "an" if stage[0] in "aeiou" else "a"
            raise UserError(
                f"{stage} config ({source} + options): field '{key}' is not {article} {stage} key"
                f"{nearest(key, list(cls.model_fields))} (valid keys: {', '.join(cls.model_fields)})"
            )
    resume = values.get("resume")
    if resume and resume != "auto":
        values = _resume_values(stage, Path(str(resume)), {k: v for k, v in values.items() if k != "resume"}, source)
    elif inherit:
        values = inherit_env(stage, values)
    try:
        return cls(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "?"
        hint = ""
        if err["type"] == "extra_forbidden":
            hint = f"{nearest(loc, list(cls.model_fields))} (valid keys: {', '.join(cls.model_fields)})"
        raise UserError(f"{stage} config ({source} + options): field '{loc}': {_message(err)}{hint}") from None


def _message(err: Any) -> str:
    """pydantic's message of one error, without the "Value error, " it puts before our validators' own text."""
    if err["type"] == "finite_number":  # every float of a config is finite (`allow_inf_nan=False` in StageConfig)
        return f"{err['msg']}, not {err['input']}; give a finite value"
    return str(err["msg"]).removeprefix("Value error, ")


def to_yaml(cfg: BaseModel) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
