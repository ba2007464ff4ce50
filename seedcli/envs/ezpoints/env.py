"""EZPoints on the environment protocol, as verl-agent (gym_cards) and the SEED code run it (visual agents).

A task is a game seed: `train` holds every seed of [0, 2**16 - 1) (drawn as verl-agent draws them), `test` the
first 512 validation seeds (`game.test_seeds`; `seed eval --limit N` plays the first N). One category. The agent
sees verl-agent's EZPoints template with the current formula (`prompt.py`): in `image` mode the 300×300 canvas
(`StepResult.image`, a PNG) with the cards, in `text` mode a text-only variant of the same template that names
the two cards in words instead of showing them (not in the paper: the paper's agent sees the image). Replies are
JSON with `thoughts` and `action`, read by verl-agent's `gym_projection` (`projection.py`). A success is `=` making
12 with both cards (`reward.py`); the episode ends at `=` (verl-agent passes only `terminated` on), at most 8 steps
(the SEED launcher's `env.max_steps`). The observation in records is the formula text; the task line names the cards.
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
from seedcli.envs.ezpoints import prompt
from seedcli.envs.ezpoints.episode import EZPointsGame
from seedcli.envs.ezpoints.expert import demo_thought, oracle_formula
from seedcli.envs.ezpoints.game import ACTION_NAMES, CANVAS_SIZE, TRAIN_SEED_RANGE, resolve_data_root, test_seeds
from seedcli.envs.ezpoints.hindsight import HINDSIGHT_VERSION, hindsight_skill, winnable
from seedcli.envs.ezpoints.projection import format_response, gym_projection
from seedcli.envs.ezpoints.reward import ADVANTAGE_NORM, INVALID_PENALTY, SUCCESS_REWARD, card_spans
from seedcli.envs.ezpoints.rules import RULES_VERSION, rules_skill
from seedcli.prompts import ORACLE_PREFIX

CATEGORY = "ezpoints"
TEST_SIZE = 512

CARD = EnvCard(
    metric_labels={"micro_success": "success"},
    task_noun="game",
    category_label="variant",
    category_names={CATEGORY: "EZPoints"},
    paper_model="Qwen2.5-VL-3B",
    paper_results={"test": {"GRPO": {"micro_success": 0.869}, "SEED": {"micro_success": 1.0}}},
    paper_note="Paper: Qwen2.5-VL-3B-Instruct on EZPoints with image observations (8 steps).",
    offline_note="Games are generated from seeds as gym-cards generates them; the card images come from gym-cards.",
)


class EZPointsOptions(EnvOptions):
    observation: Literal["text", "image"] = Field(
        "text", description="what the agent sees: the cards named in words (text), or the card image (visual agents)"
    )


class EZPointsEnv(Environment):
    """EZPoints (see the module docstring)."""

    name = "ezpoints"
    title = "EZPoints"
    prompt_version = prompt.PROMPT_VERSION
    task_line_prefix = prompt.TASK_LINE_PREFIX
    max_steps = 8
    history = 0
    max_step_skills = 0  # the SEED code's analysis_max_step_skills_per_traj for ezpoints
    success_reward = SUCCESS_REWARD
    invalid_penalty = INVALID_PENALTY
    advantage_norm = ADVANTAGE_NORM
    gigpo_norm = "mean"  # verl-agent run_ezpoints.sh: mode=mean_norm
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
    options_model = EZPointsOptions
    card = CARD

    def __init__(self, data_root: str | None = None, **options: Any):
        super().__init__(data_root, **options)
        self.observation = EZPointsOptions(**self.options).observation

    def frame_size(self) -> tuple[int, int] | None:
        """gym-cards' 300×300 canvas in image mode; None in text mode."""
        return (CANVAS_SIZE[1], CANVAS_SIZE[0]) if self.observation == "image" else None

    def resolve_data_root(self) -> Path:
        return resolve_data_root(self.data_root)

    def list_tasks(self, split: str) -> list[Task]:
        split = self.resolve_split(split)
        if self.observation == "image":
            self.resolve_data_root()  # the card images must be there before anything plays
        seeds = test_seeds(TEST_SIZE) if split == "test" else range(*TRAIN_SEED_RANGE)
        return [Task(task_id=str(s), category=CATEGORY, split=split, name=f"game {s}") for s in seeds]

    def select_tasks(
        self, tasks: Sequence[Task], n: int, seed: int, categories: Sequence[str] | None = None
    ) -> list[Task]:
        """Test games: the fixed list's first `n`. Train games: seeds drawn as verl-agent draws them
        (`RandomState(seed).randint(0, 2**16 - 1)`), repeats skipped."""
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
            for s in rng.randint(*TRAIN_SEED_RANGE, size=max(n, 16)).tolist():
                task = by_id.get(str(s))
                if task is not None and task.task_id not in out and len(out) < n:
                    out[task.task_id] = task
        return list(out.values())

    def new_game(self, expert: bool | str = False) -> EZPointsGame:
        return EZPointsGame(self.data_root, image=self.observation == "image", expert=bool(expert))

    def render_prompt(
        self,
        task: str,
        observation: str,
        admissible: Sequence[str] | None,
        step: int,
        history: Sequence[tuple[str, str]],
        history_length: int,
    ) -> str:
        return prompt.render_prompt(self.observation, observation, task)

    def parse_action(self, response: str) -> tuple[str, bool]:
        return gym_projection(response)

    def format_response(self, think: str, action: str) -> str:
        return format_response(think, action)

    def demo_thought(self, trajectory, turn, action: str) -> str | None:
        """The arithmetic the expert's move follows from (`expert.demo_thought`: card values, the formula that
        makes 12, the formula so far and so the next character)."""
        return demo_thought(trajectory.task, turn.observation, action)

    def random_response(self, result: StepResult, rng: random.Random) -> str:
        return self.format_response("I pick a random character.", rng.choice(ACTION_NAMES))

    def rules_skill(self, trajectory) -> tuple[str, str]:
        return rules_skill(trajectory)

    def hindsight_skill(self, trajectory) -> tuple[str, str]:
        """The turn after which 12 was out of reach (or the one that chose the operator of a win), against the
        expert's next character there (`hindsight.hindsight_skill`)."""
        return hindsight_skill(trajectory, self.hindsight_replay(trajectory, winnable))

    def oracle_skill(self, trajectory) -> str | None:
        """The formula for this game's cards (`expert.oracle_formula`): the values, the operator that makes 12 and
        the four characters to append. Privileged: what the expert computes before playing."""
        formula = oracle_formula(trajectory.task)
        return f"{ORACLE_PREFIX}{formula}" if formula else None

    def leaks(self, trajectory, skill: str) -> list[tuple[int, int]]:
        """Spans of `skill` naming this game's cards (a card's name, or both values side by side: "5 and 7", "5+7";
        `reward.card_spans`), read from the trajectory's task line. The winning formula holds both values, so a
        written move sequence ("5", "+", "7", "=") is caught too."""
        return card_spans(trajectory.task, skill)

    def template_texts(self) -> list[str]:
        return prompt.template_texts()

    def sample_texts(self) -> list[str]:
        return prompt.sample_texts()
