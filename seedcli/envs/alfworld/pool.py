"""ALFWorld game slots in worker processes with ALFWorld's own signature (the warm start, bench/expert_check.py):
`seedcli.envs.pool.EnvPool` over `AlfWorldEnv`, whose resets also take the paths of game files.

    with EnvPool(workers=2, expert=True) as pool:
        first = pool.reset_many([(slot, game) for slot, game in enumerate(games)])
        after = pool.step_many([(slot, r.expert_action) for slot, r in enumerate(first)])
"""

from __future__ import annotations

import os

from seedcli.envs.alfworld.data import game_path, resolve_data_root
from seedcli.envs.alfworld.env import AlfWorldEnv
from seedcli.envs.base import Task
from seedcli.envs.pool import EnvPool as _GenericPool


class EnvPool(_GenericPool):
    """ALFWorld game slots hosted by `workers` worker processes (`seedcli.envs.pool.EnvPool` with ALFWorld's
    signature). reset_many takes Games or paths of game.tw-pddl files."""

    def __init__(
        self,
        workers: int,
        expert: bool | str = False,
        data_root: str | os.PathLike | None = None,
        timeout_s: float = 300.0,
    ):
        self.data_root = resolve_data_root(data_root)
        super().__init__(
            AlfWorldEnv(data_root=str(self.data_root)),
            workers,
            expert=expert,
            timeout_s=timeout_s,
            worker_environ={"ALFWORLD_DATA": str(self.data_root)},
        )

    def _task_arg(self, task):
        return task if isinstance(task, Task) else str(game_path(task, self.data_root))
