"""Sokoban on the environment protocol, as verl-agent and the SEED code run it (visual agents).

A task is a room seed: `train` holds every seed of [0, 2**16 - 1) (drawn as verl-agent draws them), `test` the
fixed list of 512 seeds from [2**16, 2**32 - 1) (`game.test_seeds`; `seed eval --limit N` plays its first N). One
category. The agent sees verl-agent's Sokoban prompt (`prompt.py`: the text grid with history, or the room as an
image) and answers `<think>…</think><action>up|down|left|right</action>`, read by verl-agent's `sokoban_projection`
(`projection.py`). The episode is a success when every box is on a target, at most 15 steps; that success is what
the trainer's reward is made of, while gym-sokoban's step rewards are only logged (`reward.py`). Options
(`env_options`): `observation`, `dim`, `num_boxes`, `search_depth`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from seedcli.envs.base import Environment, EnvOptions, StepResult, Task
from seedcli.envs.card import EnvCard
from seedcli.envs.sokoban import prompt
from seedcli.envs.sokoban.episode import SokobanGame
from seedcli.envs.sokoban.game import TEST_LIST_SIZE, TILE, TRAIN_SEED_HIGH, resolve_data_root, test_seeds
from seedcli.envs.sokoban.hindsight import HINDSIGHT_VERSION, hindsight_skill, plan_length
from seedcli.envs.sokoban.projection import MOVES, sokoban_projection
from seedcli.envs.sokoban.reward import ADVANTAGE_NORM, INVALID_PENALTY, SUCCESS_REWARD, move_spans
from seedcli.envs.sokoban.rules import RULES_VERSION, rules_skill

CATEGORY = "sokoban"

CARD = EnvCard(
    metric_labels={"micro_success": "success"},
    task_noun="room",
    category_label="variant",
    category_names={CATEGORY: "Sokoban"},
    paper_model="Qwen2.5-VL-3B",
    paper_results={"test": {"GRPO": {"micro_success": 0.671}, "SEED": {"micro_success": 0.820}}},
    paper_note=(
        "Paper: Qwen2.5-VL-3B-Instruct on visual Sokoban (6x6, one box, 15 steps, image observations); the "
        "paper reports success only."
    ),
    offline_note="Rooms are generated from seeds as verl-agent generates them; no data files beyond the tiles.",
)


class SokobanOptions(EnvOptions):
    observation: Literal["text", "image"] = Field(
        "text", description="what the agent sees: the text grid, or the room as an image (visual agents)"
    )
    dim: int = Field(6, ge=5, le=10, description="room side in cells (the paper's rooms are 6x6)")
    num_boxes: int = Field(1, ge=1, le=3, description="boxes (and targets) in a room")
    search_depth: int = Field(30, ge=1, le=300, description="reverse-playing depth of the room generator")


class SokobanEnv(Environment):
    """Sokoban (see the module docstring)."""

    name = "sokoban"
    title = "Sokoban"
    prompt_version = prompt.PROMPT_VERSION
    task_line_prefix = prompt.TASK_LINE_PREFIX
    max_steps = 15
    history = 2
    max_step_skills = 2  # the SEED code's analysis_max_step_skills_per_traj for sokoban
    success_reward = SUCCESS_REWARD
    invalid_penalty = INVALID_PENALTY
    advantage_norm = ADVANTAGE_NORM
    gigpo_norm = "mean"  # verl-agent run_sokoban.sh: mode=mean_norm
    splits = {"train": "train", "test": "test", "valid": "test", "validation": "test", "eval": "test"}
    train_split = "train"
    eval_splits = ("test",)
    val_split = "test"
    categories = (CATEGORY,)
    analysis_description = prompt.ANALYSIS_DESCRIPTION
    rules_version = RULES_VERSION
    hindsight_version = HINDSIGHT_VERSION
    observation_modes = ("text", "image")
    reports_reward = True
    options_model = SokobanOptions
    card = CARD

    def __init__(self, data_root: str | None = None, **options: Any):
        super().__init__(data_root, **options)
        opts = SokobanOptions(**self.options)
        self.observation = opts.observation
        self.room = {"dim": (opts.dim, opts.dim), "num_boxes": opts.num_boxes, "search_depth": opts.search_depth}

    def frame_size(self) -> tuple[int, int] | None:
        """gym-sokoban's rgb_array: 16 pixels a cell (96×96 for the paper's 6×6 rooms); None in text mode."""
        rows, cols = self.room["dim"]
        return (rows * TILE, cols * TILE) if self.observation == "image" else None

    def resolve_data_root(self) -> Path:
        return resolve_data_root(self.data_root)

    def list_tasks(self, split: str) -> list[Task]:
        split = self.resolve_split(split)
        if self.observation == "image":
            self.resolve_data_root()  # the tiles must be there before anything plays
        seeds = test_seeds(TEST_LIST_SIZE) if split == "test" else range(TRAIN_SEED_HIGH)
        return [Task(task_id=str(s), category=CATEGORY, split=split, name=f"room {s}") for s in seeds]

    def select_tasks(
        self, tasks: Sequence[Task], n: int, seed: int, categories: Sequence[str] | None = None
    ) -> list[Task]:
        """Test rooms: the fixed list's first `n` (a prefix, as verl-agent's validation plays them). Train rooms:
        seeds drawn as verl-agent draws them (`RandomState(seed).randint(0, 2**16 - 1)`), repeats skipped."""
        if categories is not None:
            super().select_tasks(tasks, 0, seed, categories)  # refuses unknown names
        if n < 0:
            return super().select_tasks(tasks, n, seed)
        if all(t.split == "test" for t in tasks):
            return list(tasks)[:n]
        by_id = {t.task_id: t for t in tasks}
        rng = np.random.RandomState(seed)
        out: dict[str, Task] = {}
        while len(out) < min(n, len(by_id)):
            for s in rng.randint(0, TRAIN_SEED_HIGH, size=max(n, 16)).tolist():
                task = by_id.get(str(s))
                if task is not None and task.task_id not in out and len(out) < n:
                    out[task.task_id] = task
        return list(out.values())

    def new_game(self, expert: bool | str = False) -> SokobanGame:
        image = self.observation == "image"
        return SokobanGame(self.room, self.max_steps, self.data_root, image=image, expert=bool(expert))

    def render_prompt(
        self,
        task: str,
        observation: str,
        admissible: Sequence[str] | None,
        step: int,
        history: Sequence[tuple[str, str]],
        history_length: int,
    ) -> str:
        return prompt.render_prompt(self.observation, observation, step, history, history_length)

    def parse_action(self, response: str) -> tuple[str, bool]:
        return sokoban_projection(response)

    def random_response(self, result: StepResult, rng: random.Random) -> str:
        return self.format_response("I pick a random move.", rng.choice(MOVES))

    def rules_skill(self, trajectory) -> tuple[str, str]:
        return rules_skill(trajectory)

    def hindsight_skill(self, trajectory) -> tuple[str, str]:
        """The move after which the room could not be solved (or that left the shortest plan; a win's last push),
        against the expert's move there (`hindsight.hindsight_skill`)."""
        return hindsight_skill(trajectory, self.hindsight_replay(trajectory, plan_length))

    def leaks(self, trajectory, skill: str) -> list[tuple[int, int]]:
        """Spans of `skill` writing 4 or more consecutive moves of this episode in a row (`reward.move_spans`); the
        episode's moves are its turns' actions without "still" (a reply that moved nothing)."""
        return move_spans([t.action for t in trajectory.turns if t.action in MOVES], skill)

    def template_texts(self) -> list[str]:
        return prompt.template_texts()

    def sample_texts(self) -> list[str]:
        return prompt.sample_texts()
