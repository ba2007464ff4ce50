"""Where an environment comes from, and the one registry every stage resolves `--env` through.

    env_class("sokoban")                 # built in: seedcli's own environments
    env_class("textarena")               # built in, an adapter of an ecosystem library (needs its extra)
    env_class("mygame")                  # an installed package's entry point in the group `seedcli.envs`
    env_class("my_pkg.games:Guess")      # any importable module: `module:Class`

The name a class is resolved by is the name its records carry (`Trajectory.env`, the config's `env`, the pool's
workers), so a plug-in is rebuilt the same way in a worker process and in a later stage. A plug-in class whose own
`name` differs is given a subclass that carries the registry name; nothing else changes. A plug-in that cannot be
imported, or that lacks what the protocol needs, is a one-line UserError naming the package and what is missing.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import inspect
import logging
import os
import sys
from dataclasses import dataclass
from functools import cache

from seedcli.envs.base import MAX_STEPS, Environment
from seedcli.errors import UserError

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "seedcli.envs"
DOCS = "docs/environments.md"

# seedcli's own environments, with their data (name -> "module:Class"); modules are imported on first use
BUILTIN: dict[str, str] = {
    "alfworld": "seedcli.envs.alfworld.env:AlfWorldEnv",
    "webshop": "seedcli.envs.webshop.env:WebShopEnv",
    "search": "seedcli.envs.search.env:SearchEnv",
    "sokoban": "seedcli.envs.sokoban.env:SokobanEnv",
    "ezpoints": "seedcli.envs.ezpoints.env:EZPointsEnv",
}
# adapters of the ecosystem's environment libraries: name -> ("module:Class", the pyproject extra that installs it)
ADAPTERS: dict[str, tuple[str, str]] = {
    "textarena": ("seedcli.envs.adapters.textarena:TextArenaEnv", "textarena"),
    "openenv": ("seedcli.envs.adapters.openenv:OpenEnvEnv", "openenv"),
    "reasoning_gym": ("seedcli.envs.adapters.reasoning_gym:ReasoningGymEnv", "reasoning-gym"),
}
# what every environment class must declare (a TextEnv subclass gets them all by default)
REQUIRED_ATTRIBUTES = (
    "title",
    "prompt_version",
    "task_line_prefix",
    "max_steps",
    "history",
    "splits",
    "eval_splits",
    "val_split",
    "categories",
    "analysis_description",
    "card",
)


@dataclass(frozen=True)
class EnvEntry:
    """One environment the registry knows: its name, the class it names (`module:Class`) and where it came from."""

    name: str
    target: str
    origin: str  # "built in", "built in (extra: X)", "entry point (package P)", "module path"
    package: str = ""  # the distribution or top-level package a plug-in comes from


def canonical_name(name: object) -> str:
    """A registry name as records carry it: lower case, or a `module:Class` path as written."""
    text = str(name).strip()
    return text if ":" in text else text.lower()


@cache
def _entry_points() -> dict[str, EnvEntry]:
    """Installed packages' environments (read once a process)."""
    found: dict[str, EnvEntry] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        name = canonical_name(ep.name)
        dist = ep.dist.name if ep.dist is not None else ep.value.split(":")[0].split(".")[0]
        if name in BUILTIN or name in ADAPTERS:
            logger.warning("entry point %r of package %s is shadowed by seedcli's own environment", name, dist)
            continue
        found.setdefault(name, EnvEntry(name, ep.value, f"entry point (package {dist})", dist))
    return found


def entries() -> dict[str, EnvEntry]:
    """Every named environment: the built-in ones, the adapters, then installed packages' entry points."""
    out = {n: EnvEntry(n, t, "built in", "seedcli") for n, t in BUILTIN.items()}
    out.update({n: EnvEntry(n, t, f"built in (extra: {x})", "seedcli") for n, (t, x) in ADAPTERS.items()})
    out.update(_entry_points())
    return out


def env_names() -> tuple[str, ...]:
    """Every environment name `--env` takes (a `module:Class` path is taken too)."""
    return tuple(entries())


def entry(name: object) -> EnvEntry:
    """The registry entry of a name or `module:Class` path; an unknown name is a one-line UserError."""
    key = canonical_name(name)
    if ":" in key:
        module = key.split(":", 1)[0]
        return EnvEntry(key, key, "module path", module.split(".")[0])
    found = entries().get(key)
    if found is None:
        names = env_names()
        close = difflib.get_close_matches(key, names, n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise UserError(
            f"unknown environment {name!r}{hint} (use one of {', '.join(names)}, or `package.module:Class` for a class of "
            f"your own; `seed envs` lists them, {DOCS} shows how to write one)"
        )
    return found


def env_class(name: object) -> type[Environment]:
    """The Environment subclass `name` resolves to, with `name` as its registry name (see the module docstring)."""
    return _load(entry(name))


@cache
def _load(found: EnvEntry) -> type[Environment]:
    cls = _import(found)
    problem = protocol_problem(cls)
    if problem:
        raise UserError(f"{_who(found)}: {problem}; see {DOCS}")
    if getattr(cls, "name", None) == found.name:
        return cls
    # the records' name for it, so workers and later stages rebuild it the same way
    return type(cls.__name__, (cls,), {"name": found.name, "__module__": cls.__module__, "__doc__": cls.__doc__})


def _who(found: EnvEntry) -> str:
    if found.origin == "module path":
        return f"environment {found.name} (package {found.package})"
    if found.origin.startswith("entry point"):
        return f"environment {found.name!r} ({found.origin}, {found.target})"
    return f"environment {found.name!r}"


def _import(found: EnvEntry) -> type:
    module_name, _, attr = found.target.partition(":")
    if not module_name or not attr:
        raise UserError(f"{_who(found)}: {found.target!r} is not `package.module:Class`")
    if found.origin == "module path":
        _cwd_on_path()
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing = getattr(exc, "name", None)
        if found.name in ADAPTERS:  # the adapter itself is seedcli's; its library is imported lazily, so this is rare
            raise UserError(
                f"{_who(found)}: {exc}; install it with pip install -e '.[{ADAPTERS[found.name][1]}]'"
            ) from None
        why = f"No module named {missing!r}" if missing else " ".join(str(exc).split())
        hint = (
            f"check the path and that {module_name.split('.')[0]} is importable from this directory or PYTHONPATH"
            if missing and module_name.startswith(missing)
            else f"install what {found.package} needs"
        )
        raise UserError(f"{_who(found)}: importing {module_name} failed ({why}); {hint}") from None
    except Exception as exc:  # noqa: BLE001 - a plug-in's own error while importing: one line that names it
        raise UserError(
            f"{_who(found)}: importing {module_name} raised {type(exc).__name__}: {' '.join(str(exc).split())}"
        ) from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise UserError(f"{_who(found)}: module {module_name} has no attribute {attr!r}")
    return cls


def _cwd_on_path() -> None:
    """A `module:Class` in the working directory imports as it would under `python -m` (uvicorn's convention; a
    worker process, started with `python -c`, has the directory on its path already)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def protocol_problem(cls: object) -> str:
    """What `cls` lacks to be an environment ("" when nothing): an Environment subclass, every abstract method
    written (a TextEnv: tasks, reset and step), the class attributes the protocol reads, a turn limit within
    `MAX_STEPS`."""
    if not (inspect.isclass(cls) and issubclass(cls, Environment)):
        what = f"class {cls.__name__}" if inspect.isclass(cls) else type(cls).__name__
        return f"{what} is not a subclass of seedcli.envs.TextEnv (or seedcli.envs.Environment)"
    abstract = sorted(getattr(cls, "__abstractmethods__", ()))
    if abstract:
        return f"{cls.__name__} does not define {', '.join(abstract)}"
    absent = [a for a in REQUIRED_ATTRIBUTES if not hasattr(cls, a)]
    if absent:
        return f"{cls.__name__} does not set {', '.join(absent)} (TextEnv sets them all by default)"
    steps = cls.max_steps
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= MAX_STEPS:
        return (
            f"{cls.__name__}.max_steps = {steps!r}: the turn limit must be a whole number from 1 to {MAX_STEPS} "
            "(an episode that never ends would show no progress)"
        )
    return ""
