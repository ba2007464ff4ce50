"""The base of every stage config: the config hash (which fields count, and when), the dtype field, the environment
field's check and the defaults that come from the environment."""

from __future__ import annotations

import difflib
import hashlib
import sys
from pathlib import Path
from typing import Any, ClassVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from seedcli.envs import ENV_NAMES, env_class, env_names
from seedcli.envs.base import yaml_words
from seedcli.envs.registry import canonical_name
from seedcli.errors import UserError
from seedcli.precision import normalise

CONFIGS_DIR = Path(__file__).resolve().parent.parent.parent / "configs"


def nearest(key: str, valid: list[str] | tuple[str, ...]) -> str:
    """'; did you mean X?' for the closest valid key, or '' when none is close."""
    match = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.5)
    return f"; did you mean '{match[0]}'?" if match else ""


def _nohash(description: str, default: Any = None, **kw: Any) -> Any:
    """A field that does not change what a run computes (resume flags, worker counts): left out of the config hash."""
    return Field(default, description=description, json_schema_extra={"hash": False}, **kw)


def _dtype_field(what: str) -> Any:
    """The compute dtype of a stage that runs a model (seedcli/precision.py): hashed only when not auto."""
    return Field(
        "auto",
        description=f"compute dtype of {what}: auto (bf16 on a GPU or on a CPU with AVX512-BF16/AMX, else fp32) | "
        "float32 | bfloat16 (bf16 and fp32 accepted); trained weights and AdamW state stay fp32, the loss "
        "arithmetic is fp32",
        json_schema_extra={"hash": "if_changed"},
    )


def _dtype_value(value: Any) -> Any:
    try:
        return normalise(value) if isinstance(value, str) or value is None else value
    except ValueError as exc:
        raise ValueError(str(exc)) from None


# GiGPO's settings: in the config hash only with step_advantage gigpo
GIGPO_FIELDS = ("gigpo_gamma", "step_advantage_w", "gigpo_norm", "gigpo_similarity", "gigpo_similarity_threshold")


def _env_name(v: Any) -> str:
    """An environment's registry name (case and spaces ignored) or `module:Class` path, checked where it is read: an
    unknown name is a ValueError listing the names, a plug-in that does not load is its one line."""

    name = canonical_name(v)
    names = env_names()
    if ":" not in name and name not in names:
        raise ValueError(
            f"unknown environment {v!r}{nearest(name, names)} (use one of {', '.join(names)}, or "
            "`package.module:Class` for a class of your own; `seed envs` lists them)"
        )
    if name not in ENV_NAMES:  # a plug-in or adapter that does not import or lacks the protocol: say so now
        try:
            env_class(name)
        except UserError as exc:
            raise ValueError(str(exc)) from None
    return name


def hash_key(cls: type[BaseModel], name: str) -> str:
    """The key a field has in the config hash: its own name, or the name it had when its runs were first hashed."""
    field_info = cls.model_fields.get(name)
    extra = field_info.json_schema_extra if field_info is not None else None
    return str(extra.get("hash_as", name)) if isinstance(extra, dict) else name


def renamed(cls: type[BaseModel], values: Any, warn: str | None = None) -> Any:
    """`values` with a config's old spellings (`old_names`) under their new names (a saved config, a preset, options,
    a config built in code); with `warn` (where they came from) a warning on stderr for each. Both at once is an
    error."""
    old_names: dict[str, str] = getattr(cls, "old_names", {})
    if not isinstance(values, dict) or not any(k in values for k in old_names):
        return values
    out = dict(values)
    for old, new in old_names.items():
        if old not in out:
            continue
        if new in out:
            raise UserError(f"'{old}' is the old name of '{new}'; give one of them ({warn or 'config'})")
        out[new] = out.pop(old)
        if warn:
            print(f"warning: '{old}' is now '{new}' ({warn}); the old name still works", file=sys.stderr)
    return out


# marks a field whose default is the environment's (`_env_defaults`): the CLI's help says so instead of one number
_ENV_DEFAULT = {"env_default": True}


class StageConfig(BaseModel):
    """Fields every stage has."""

    # every float of every stage config is finite: `lr=inf` or `opd_beta=nan` is refused where it is read, not met
    # as NaN weights in a run that then ends "complete"
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    # one name for one idea across stages: {an old spelling: the field it became}; the old one still
    # works (`renamed`: the CLI and presets warn), and the field hashes under its old name (`hash_as`), so no run's
    # config hash changed
    old_names: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _yaml_words(cls, data: Any) -> Any:
        # `leak_guard=off` (as the docs and the errors write it) is YAML's False: read it back as the option `off`
        return yaml_words(cls, renamed(cls, data))

    runs_dir: str = _nohash("root of the run directories", "runs")
    seed: int = Field(0, description="seed for sampling, task selection and initialisation")
    resume: str | None = _nohash(
        "continue an interrupted run: 'auto' = the newest incomplete run of the same config, or a run directory"
    )
    logger: str = _nohash(
        "metric loggers, comma-separated: jsonl (metrics.jsonl, always on), tensorboard, wandb", "jsonl"
    )

    def hashed(self) -> dict:
        """The part of the config that decides what the run computes."""
        fields = type(self).model_fields
        skip = {name for name, f in fields.items() if (f.json_schema_extra or {}).get("hash") is False}
        # fields added later count only when set, so the hashes of configs that do not use them stay as they were
        if_set = {name for name, f in fields.items() if (f.json_schema_extra or {}).get("hash") == "if_set"}
        # ... or only when they differ from their default (`dtype: auto` keeps every earlier hash)
        if_changed = {name for name, f in fields.items() if (f.json_schema_extra or {}).get("hash") == "if_changed"}
        return {
            hash_key(type(self), k): v
            for k, v in self.model_dump(mode="json").items()
            if k not in skip
            and not (k in if_set and v in (None, {}, []))
            and not (k in if_changed and v == fields[k].default)
        }

    def config_hash(self) -> str:
        blob = orjson.dumps(self.hashed(), option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(blob).hexdigest()


def _env_defaults(cls: type, data: dict) -> dict:
    """Fill the fields whose default depends on the environment (turns, history, splits, advantage mode) when the
    config does not set them. The field defaults are ALFWorld's, so its configs and hashes are unchanged."""

    if str(data.get("env", "alfworld")).strip().lower() == "alfworld":
        return data
    try:
        env = env_class(data.get("env", "alfworld"))
    except UserError:
        return data  # the env field's validator reports it
    defaults = {
        "max_steps": env.max_steps,
        "history": env.history,
        "val_split": env.val_split,
        "advantage_norm": env.advantage_norm,
        "max_step_skills": env.max_step_skills,
        "gigpo_norm": env.gigpo_norm,
        "gigpo_similarity": env.gigpo_similarity_threshold is not None,
        "gigpo_similarity_threshold": env.gigpo_similarity_threshold or 0.95,
    }
    defaults["split"] = env.eval_splits[0] if cls.__name__ == "EvalConfig" else env.train_split
    out = dict(data)
    for key, value in defaults.items():
        if key in cls.model_fields and out.get(key) is None:
            out[key] = value
    return out
