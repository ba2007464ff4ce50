"""Environments the agent plays. ALFWorld (`seedcli.envs.alfworld`) is the real one; nothing here imports torch."""

from seedcli.envs.alfworld import (
    SPLITS,
    TASK_TYPES,
    AlfWorldGame,
    EnvPool,
    Game,
    StepResult,
    list_games,
    resolve_data_root,
    resolve_split,
    select_games,
)

__all__ = [
    "SPLITS",
    "TASK_TYPES",
    "AlfWorldGame",
    "EnvPool",
    "Game",
    "StepResult",
    "list_games",
    "resolve_data_root",
    "resolve_split",
    "select_games",
]
