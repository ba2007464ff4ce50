"""One EZPoints episode slot: `EZPointsGame` (the EnvGame of `env.EZPointsEnv.new_game`) plays a game with gym-cards'
steps (`game.EZPoints`); an expert game adds the next character of a winning formula (`expert.solve`). The environment
hands each slot what it reads (the data root, text or image observations): a slot never imports its environment."""

from __future__ import annotations

from pathlib import Path

from seedcli.envs.base import StepResult, Task, encode_png
from seedcli.envs.ezpoints.expert import solve
from seedcli.envs.ezpoints.game import ACTION_NAMES, NO_OP, EZPoints
from seedcli.envs.ezpoints.prompt import cards_text
from seedcli.envs.ezpoints.reward import outcome


class EZPointsGame:
    """One episode slot: a game, gym-cards' steps, and (expert games) the next character of a winning formula."""

    def __init__(self, data_root: str | Path | None = None, image: bool = False, expert: bool = False):
        self.data_root = data_root  # the card images (image observations only)
        self.image = image
        self.expert = expert
        self.game: EZPoints | None = None
        self.total = 0.0

    def reset(self, task: Task) -> StepResult:
        self.game = EZPoints(int(task.task_id), data_root=self.data_root)
        self.total = 0.0
        return self._result(0.0, done=False, info={"truncated": False})

    def step(self, action: str) -> StepResult:
        game = self.game
        if game is None:
            raise RuntimeError("step before reset")
        index = ACTION_NAMES.index(action) if action in ACTION_NAMES else NO_OP
        reward, terminated, truncated, _won = game.step(index)
        self.total += reward
        return self._result(float(reward), done=bool(terminated), info={"truncated": bool(truncated)})

    def _result(self, reward: float, done: bool, info: dict) -> StepResult:
        game = self.game
        won, score = outcome(game)
        expert_action = None
        if self.expert and not done:
            plan = solve(game)
            expert_action = ACTION_NAMES[plan[0]] if plan else "="
        return StepResult(
            observation=game.formula_text(),
            admissible=list(ACTION_NAMES),
            won=won,
            done=done,
            task=cards_text(game.cards),
            expert_action=expert_action,
            reward=reward,  # gym-cards' step reward: logged, not trained on (reward.py)
            score=score,
            info={**info, "cards": list(game.cards), "return": round(self.total, 4)},
            image=encode_png(game.image()) if self.image else None,
        )

    def close(self) -> None:
        self.game = None
