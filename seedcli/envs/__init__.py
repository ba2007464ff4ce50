"""Environments the agent plays, by name. Every stage goes through the protocol in `seedcli.envs.base`:

    from seedcli.envs import get_env, ENV_NAMES
    env = get_env("alfworld", data_root=None)       # cheap: data is read lazily
    tasks = env.select_tasks(env.list_tasks("train"), n=180, seed=0)

Nothing outside `seedcli/envs/` imports an environment's own module; nothing here imports torch. Every environment's
package has the same files (env, game and/or data, episode, prompt, projection, reward, rules, expert; see
`seedcli.envs.base`), and its report copy is its `card` (`seedcli.envs.card.EnvCard`).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from seedcli.envs.base import EnvGame, Environment, StepResult, Task
from seedcli.errors import UserError

logger = logging.getLogger(__name__)

# name -> "module:class"; modules are imported on first use.
_REGISTRY: dict[str, str] = {
    "alfworld": "seedcli.envs.alfworld.env:AlfWorldEnv",
    "webshop": "seedcli.envs.webshop.env:WebShopEnv",
    "search": "seedcli.envs.search.env:SearchEnv",
    "sokoban": "seedcli.envs.sokoban.env:SokobanEnv",
    "ezpoints": "seedcli.envs.ezpoints.env:EZPointsEnv",
}
ENV_NAMES: tuple[str, ...] = tuple(_REGISTRY)
DEFAULT_ENV = "alfworld"


def env_class(name: str) -> type[Environment]:
    """The Environment subclass registered as `name`; an unknown name is a one-line UserError."""
    target = _REGISTRY.get(str(name).strip().lower())
    if target is None:
        raise UserError(f"unknown environment {name!r}: use one of {', '.join(ENV_NAMES)}")
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


def get_env(name: str, **options: Any) -> Environment:
    """An instance of the environment `name` (options: data_root and env-specific keys)."""
    return env_class(name)(**options)


def sample_texts() -> list[str]:
    """Text from every registered environment for the tiny models' tokenizer; an env whose data is missing
    contributes its templates only (with a warning)."""
    texts: list[str] = []
    for name in ENV_NAMES:
        try:
            texts.extend(get_env(name).sample_texts())
        except UserError as err:
            logger.warning(
                "tiny tokenizer trained without %s data (%s); prompts will tokenize less compactly", name, err
            )
    return texts


def template_texts() -> list[str]:
    """The registered environments' rendered prompt templates (`Environment.template_texts`; reads no data)."""
    return [text for name in ENV_NAMES for text in get_env(name).template_texts()]


def tokenizer_texts() -> list[str]:
    """What the tiny tokenizer learns besides the chat boilerplate, in order: every registered environment's
    `sample_texts()`, then their `template_texts()`. Pass it as `build_tiny_model(corpus=...)`."""
    return [*sample_texts(), *template_texts()]


__all__ = [
    "DEFAULT_ENV",
    "ENV_NAMES",
    "EnvGame",
    "Environment",
    "StepResult",
    "Task",
    "env_class",
    "get_env",
    "sample_texts",
    "template_texts",
    "tokenizer_texts",
]
