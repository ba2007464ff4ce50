"""Environments the agent plays, by name. Every stage goes through the protocol in `seedcli.envs.base`:

    from seedcli.envs import get_env, ENV_NAMES
    env = get_env("alfworld", data_root=None)       # cheap: data is read lazily
    tasks = env.select_tasks(env.list_tasks("train"), n=180, seed=0)

Names resolve through one registry (`seedcli.envs.registry`): seedcli's own environments (`ENV_NAMES`), the adapters
of the ecosystem's libraries (textarena, openenv, reasoning_gym; each behind its extra), installed packages' entry
points (group `seedcli.envs`) and `package.module:Class` paths; `env_names()` lists the named ones. An environment of
your own is a `TextEnv` subclass (`seedcli.envs.text`, docs/environments.md).

Nothing outside `seedcli/envs/` imports an environment's own module; nothing here imports torch. Every built-in
environment's package has the same files (env, game and/or data, episode, prompt, projection, reward, rules, expert;
see `seedcli.envs.base`), and its report copy is its `card` (`seedcli.envs.card.EnvCard`).
"""

from __future__ import annotations

import logging
from typing import Any

from seedcli.envs.base import EnvGame, Environment, StepResult, Task
from seedcli.envs.registry import BUILTIN, EnvEntry, entries, entry, env_class, env_names
from seedcli.envs.text import Observation, TextEnv
from seedcli.errors import UserError

logger = logging.getLogger(__name__)

# seedcli's own environments (the ones with data of their own, whose text the tiny tokenizer learns); every name
# `--env` takes, adapters and plug-ins included, is `env_names()`
ENV_NAMES: tuple[str, ...] = tuple(BUILTIN)
DEFAULT_ENV = "alfworld"


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
    "EnvEntry",
    "EnvGame",
    "Environment",
    "Observation",
    "StepResult",
    "Task",
    "TextEnv",
    "entries",
    "entry",
    "env_class",
    "env_names",
    "get_env",
    "sample_texts",
    "template_texts",
    "tokenizer_texts",
]
