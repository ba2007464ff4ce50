"""One ALFWorld episode slot, played in this process: `AlfWorldGame` (the EnvGame of `env.AlfWorldEnv.new_game`).

    game = AlfWorldGame(expert=True)
    first = game.reset(games[0])                    # a Game (data.list_games) or the path of a game.tw-pddl
    after = game.step(first.expert_action)

One TextWorld environment (`game.build_env`) is reused across resets; `expert` adds the expert's next action to every
StepResult (`expert.AlfWorldExpert`). This module never imports torch; alfworld is imported on the first reset.
"""

from __future__ import annotations

import os
from pathlib import Path

from seedcli.envs.alfworld.data import game_path
from seedcli.envs.alfworld.expert import EXPERT_MODES, AlfWorldExpert
from seedcli.envs.alfworld.game import BANNER, TASK_RE, build_env
from seedcli.envs.alfworld.reward import outcome
from seedcli.envs.base import StepResult, Task
from seedcli.errors import UserError


class AlfWorldGame:
    """One ALFWorld game played in this process; one TextWorld environment is reused across resets."""

    def __init__(self, expert: bool | str = False, data_root: str | os.PathLike | None = None):
        if expert not in EXPERT_MODES:
            raise ValueError(f"expert must be one of {sorted(map(str, EXPERT_MODES))}, got {expert!r}")
        self.expert = bool(expert)
        self.data_root = data_root
        self._expert = AlfWorldExpert(search_only=expert == "search") if self.expert else None
        self._env = None
        self._path: Path | None = None
        self._task = ""
        self._admissible: list[str] = []
        self._won = False
        self._steps = 0

    def reset(self, game: Task | str | os.PathLike) -> StepResult:
        """Start `game` (a Game or the absolute path of a game.tw-pddl); the first observation has no banner."""
        path = game_path(game, self.data_root)
        if not path.is_file():
            raise UserError(f"ALFWorld game not found: {path}; check ALFWORLD_DATA / --data-root")
        if self._env is None:
            self._env = build_env(self.data_root, facts=self.expert)  # the hand-coded expert reads facts
        self._env.load(str(path))
        state = self._env.reset()
        self._path = path
        self._steps = 0
        observation = state.feedback.replace(BANNER, "", 1).strip()
        m = TASK_RE.search(observation)
        self._task = m.group(1).strip() if m else ""
        if self._expert is not None:
            self._expert.reset(self._env, path, state)
        return self._result(state, observation)

    def step(self, action: str) -> StepResult:
        """Send `action` as given (an inadmissible one gets "Nothing happens.")."""
        if self._env is None or self._path is None:
            raise RuntimeError("AlfWorldGame.step() before reset()")
        admissible_before = self._admissible
        state, _, _ = self._env.step(action)
        self._steps += 1
        if self._expert is not None:
            self._expert.follow(action.strip(), admissible_before)
            self._expert.watch(state, action, self._path, self._steps)
        return self._result(state, state.feedback.strip())

    def close(self) -> None:
        """Release the TextWorld environment."""
        if self._env is not None:
            self._env.close()
            self._env = None

    def _result(self, state, observation: str) -> StepResult:
        self._admissible = [c for c in state["admissible_commands"] if c != "help"]
        self._won, score = outcome(bool(state["won"]))
        return StepResult(
            observation=observation,
            admissible=list(self._admissible),
            won=self._won,
            done=self._won,
            task=self._task,
            expert_action=None if self._expert is None else self._expert.next_action(self._won, self._admissible),
            reward=score,
            score=score,
        )
