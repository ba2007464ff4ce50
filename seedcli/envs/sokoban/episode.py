"""One Sokoban episode slot: `SokobanGame` (the EnvGame of `env.SokobanEnv.new_game`) plays a room with gym-sokoban's
moves (`game.Sokoban`); an expert game adds the shortest plan's next move (`expert.solve`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from seedcli.envs.base import StepResult, Task, encode_png
from seedcli.envs.sokoban.expert import solve
from seedcli.envs.sokoban.game import ACTION_NAMES, Sokoban
from seedcli.envs.sokoban.projection import MOVES
from seedcli.envs.sokoban.prompt import TASK
from seedcli.envs.sokoban.reward import outcome

if TYPE_CHECKING:  # the environment makes its slots; a slot only reads its options
    from seedcli.envs.sokoban.env import SokobanEnv

_ACTION_IDS = {name: i for i, name in ACTION_NAMES.items()}


class SokobanGame:
    """One episode slot: a room, gym-sokoban's steps, and (expert games) the shortest plan's next move."""

    def __init__(self, env: SokobanEnv, expert: bool = False):
        self.env = env
        self.expert = expert
        self.game: Sokoban | None = None
        self.total = 0.0

    def reset(self, task: Task) -> StepResult:
        data_root = self.env.resolve_data_root() if self.env.observation == "image" else self.env.data_root
        self.game = Sokoban(int(task.task_id), max_steps=self.env.max_steps, data_root=data_root, **self.env.room)
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
            image=encode_png(game.image()) if self.env.observation == "image" else None,
        )

    def close(self) -> None:
        self.game = None
