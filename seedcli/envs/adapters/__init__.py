"""Adapters of the ecosystem's environment libraries, each a `TextEnv` (seedcli.envs.text) behind an extra of its own:

    textarena.py       TextArena's single-player games (`pip install -e '.[textarena]'`)
    openenv.py         an OpenEnv environment server through OpenEnv's own client (`.[openenv]`)
    reasoning_gym.py   reasoning-gym's procedural tasks, scored by each dataset's `score_answer` (`.[reasoning-gym]`)

The library is imported when it is first needed (`require`), never when seedcli starts, so a missing extra is a
one-line error where the adapter is used, and `seed envs` lists the adapter with what to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from seedcli.errors import UserError


def require(module: str, extra: str, pypi: str, title: str) -> ModuleType:
    """The library `module`, imported; when it is missing, a one-line UserError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise UserError(
            f"{title} needs the {pypi.split('==')[0]} package ({exc}); install it with pip install -e '.[{extra}]' "
            f"(or pip install '{pypi}')"
        ) from None


def parse_names(value: object, what: str) -> list[str]:
    """A comma-separated string or a list of names as a list of non-empty names (ValueError when there is none)."""
    items = value.split(",") if isinstance(value, str) else list(value) if isinstance(value, list | tuple) else None
    names = [str(x).strip() for x in items or [] if str(x).strip()]
    if not names:
        raise ValueError(f"give one {what} or several, comma-separated")
    return names
