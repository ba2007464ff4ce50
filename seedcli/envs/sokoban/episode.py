"""One Sokoban episode slot: `SokobanGame` (the EnvGame of `env.SokobanEnv.new_game`) plays a room with gym-sokoban's
moves (`game.Sokoban`); an expert game adds the shortest plan's next move (`expert.solve`). The environment hands each
slot what it reads (the room's shape, the step limit, the data root, text or image observations): a slot never
imports its environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seedcli.envs.base import StepResult, Task, encode_png
from seedcli.envs.sokoban.expert import solve
from seedcli.envs.sokoban.game import ACTION_NAMES, Sokoban, resolve_data_root
from seedcli.envs.sokoban.projection import MOVES
from seedcli.envs.sokoban.prompt import TASK
from seedcli.envs.sokoban.reward import outcome

_ACTION_IDS = {name: i for i, name in ACTION_NAMES.items()}


class SokobanGame:
    """One episode slot: a room, gym-sokoban's steps, and (expert games) the shortest plan's next move."""

    def __init__(
        self,
        room: dict[str, Any],
        max_steps: int,
        data_root: str | Path | None = None,
        image: bool = False,
        expert: bool = False,
    ):
        self.room = room  # gym-sokoban's dim, num_boxes, search_depth
        self.max_steps = max_steps
        self.data_root = data_root  # the tiles (image observations only; resolved when a room is made)
        self.image = image
        self.expert = expert
        self.game: Sokoban | None = None
        self.total = 0.0

    def reset(self, task: Task) -> StepResult:
        data_root = resolve_data_root(self.data_root) if self.image else self.data_root
        self.game = Sokoban(int(task.task_id), max_steps=self.max_steps, data_root=data_root, **self.room)
        self.total = 0.0
        return self._result(0.0, done=False, info={})

    def step(self, action: str) -> StepResult:
        game = self.game
        if game is None:
            raise RuntimeError("step before reset")
        reward, done, won, effective = game.step(_ACTION_IDS.get(action, 0))
        self.total += reward
        info = {"effective": bool(effective), "boxes_on_target": int(game.boxes_on_target)}
        return self._result(float(reward), done=bool(done or won), info=info)

    def _result(self, reward: float, done: bool, info: dict) -> StepResult:
        game = self.game
        won, score = outcome(game)
        expert_action = None
        if self.expert and not (won or done):
            plan = solve(game, max_len=64)  # the shortest plan, even one longer than the steps left
            expert_action = ACTION_NAMES[plan[0]] if plan else "still"
        return StepResult(
            observation=game.text(),
            admissible=list(MOVES),
            won=won,
            done=done,
            task=TASK,
            expert_action=expert_action,
            reward=reward,  # gym-sokoban's step reward: logged, not trained on (reward.py)
            score=score,
            info={**info, "return": round(self.total, 4)},
            image=encode_png(game.image()) if self.image else None,
        )

    def close(self) -> None:
        self.game = None
