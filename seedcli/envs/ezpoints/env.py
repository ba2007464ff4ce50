"""EZPoints on the environment protocol, as verl-agent (gym_cards) and the SEED code run it (visual agents).

A task is a game seed: `train` holds every seed of [0, 2**16 - 1) (drawn as verl-agent draws them), `test` the
first 512 validation seeds (`game.test_seeds`; `seed eval --limit N` plays the first N). One category. The agent
sees verl-agent's EZPoints template with the current formula: in `image` mode the 300×300 canvas
(`StepResult.image`, a PNG) with the cards, in `text` mode a text-only variant of the same template that names
the two cards in words instead of showing them (not in the paper: the paper's agent sees the image). Replies are
JSON with `thoughts` and `action`, read by verl-agent's `gym_projection` (quirks kept: everything from the first
`"action":` on is searched for the 13 action names, "10" first; exactly one name found is a valid reply, anything
else is invalid and plays no action; with no `"action":` at all only the reply's last character is searched).
Reward 10 when `=` makes 12 with both cards; the episode ends at `=` (verl-agent passes only `terminated` on), at
most 8 steps (the SEED launcher's `env.max_steps`). The observation in records is the formula text; the task line
names the cards.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from seedcli.envs.base import Environment, EnvOptions, StepResult, Task, encode_png
from seedcli.envs.ezpoints.expert import solve
from seedcli.envs.ezpoints.game import (
    ACTION_NAMES,
    CANVAS_SIZE,
    NO_OP,
    TRAIN_SEED_RANGE,
    EZPoints,
    card_words,
    resolve_data_root,
)
from seedcli.envs.ezpoints.game import test_seeds as _test_seeds
from seedcli.envs.ezpoints.rules import RULES_VERSION, card_spans, rules_skill

PROMPT_VERSION = "ezpoints-v1"  # bump whenever the prompt text changes
CATEGORY = "ezpoints"
TEST_SIZE = 512
TASK_LINE_PREFIX = "You are an expert card game player"
ANALYSIS_DESCRIPTION = (
    "You are an expert analyst of card-game agents in EZPoints (two playing cards; the agent appends one number or "
    "operator at a time to build a formula that evaluates to 12, using each card's number once)."
)

# verl-agent agent_system/environments/prompts/gym_cards.py GYM_CARDS_EZPOINTS_TEMPLATE, character for character.
EZPOINTS_TEMPLATE = """
<image>You are an expert card game player helping to build a math formula that evaluates to **12**, using only the two numbers shown on the playing cards in the image. You may choose from the following actions: one of the two available card numbers, the operators '+' or '*', or the equals sign '='. You must build the formula step by step, adding only one character at a time to the end of the current formula.

Card Rules:
1. The image shows exactly two playing cards.
2. Each card represents one number:
   - Number cards (2–10) equal their face value.
   - Face cards ('J', 'Q', 'K') are treated as the number 10.
   - Ace ('A') is treated as 1.
3. You can only use these two card numbers — no other numbers are allowed.
4. Each number can be used only once in the formula.

Formula Rules:
1. At each step, you append only one character: a number (from the two card values), an operator ('+' or '*'), or '='.
2. Once you add '=', the formula is evaluated and the game ends.

Rewards:
+10: if the formula evaluates exactly to 12.
0: otherwise (e.g., using a number not shown on the cards, reusing a number, incorrect syntax, not evaluating to 12).

Now, you are given two card numbers as shown in the image, and the current formula is: '{text_formula}'
It's your turn to append the next character.

Your response MUST be a valid JSON object in the following format:
{{
  "thoughts": "Start by identifying the two card numbers shown in the image. Then review the current formula. Based on the remaining available characters and the goal of reaching 12, reason step-by-step to choose the next valid character to add.",
  "action": "next character (number, '+', '*', or '=') to append"
}}
"""

# The text-only variant (seedcli's, not the paper's): the same template with the image replaced by the cards' names.
_TEXT_EDITS = (
    ("<image>You are", "You are"),
    ("shown on the playing cards in the image.", "on the two playing cards named below."),
    ("1. The image shows exactly two playing cards.", "1. The two playing cards are: {cards}."),
    ("two card numbers as shown in the image,", "the two cards {cards},"),
    ("identifying the two card numbers shown in the image.", "identifying the two card numbers from the cards."),
)
EZPOINTS_TEXT_TEMPLATE = EZPOINTS_TEMPLATE
for _old, _new in _TEXT_EDITS:
    assert _old in EZPOINTS_TEXT_TEMPLATE, _old
    EZPOINTS_TEXT_TEMPLATE = EZPOINTS_TEXT_TEMPLATE.replace(_old, _new)


def gym_projection(response: str) -> tuple[str, bool]:
    """verl-agent `gym_projection` for 'gym_cards/EZPoints-v0' on one reply: (action name, valid); the name is ""
    (no action: index -1) unless exactly one of the 13 names is found."""
    text = response.lower()
    text = text[text.find('"action":') :]  # quirk kept: no '"action":' leaves only the last character
    found = []
    if "10" in text:  # 'points' is in the env name: "10" is taken first so that it does not also count as "1"
        found.append("10")
        text = text.replace("10", "")
    found.extend(name for name in ACTION_NAMES if name in text)
    found = list(set(found))
    if len(found) == 1:
        return found[0], True
    return "", False


def _card_value(name: str) -> int | None:
    """The number a card named in words counts for ("Jack of Hearts" → 10, "Ace of Spades" → 1, "7 of Clubs" → 7)."""
    rank = name.strip().split(" of ")[0]
    if rank in ("Jack", "Queen", "King"):
        return 10
    if rank == "Ace":
        return 1
    return int(rank) if rank.isdigit() else None


def cards_text(cards: Sequence[str]) -> str:
    return " and ".join(card_words(c) for c in cards)


class EZPointsOptions(EnvOptions):
    observation: Literal["text", "image"] = Field(
        "text", description="what the agent sees: the cards named in words (text), or the card image (visual agents)"
    )


class EZPointsEnv(Environment):
    """EZPoints (see the module docstring)."""

    name = "ezpoints"
    title = "EZPoints"
    prompt_version = PROMPT_VERSION
    task_line_prefix = TASK_LINE_PREFIX
    max_steps = 8
    history = 0
    max_step_skills = 0  # the SEED code's analysis_max_step_skills_per_traj for ezpoints
    success_reward = 10.0
    invalid_penalty = 0.1
    advantage_norm = "mean_std"
    splits = {"train": "train", "test": "test", "valid": "test", "validation": "test", "eval": "test"}
    train_split = "train"
    eval_splits = ("test",)
    val_split = "test"
    categories = (CATEGORY,)
    category_names = {CATEGORY: "EZPoints"}
    category_label = "variant"
    task_noun = "game"
    metric_labels = {"micro_success": "success"}
    paper_model = "Qwen2.5-VL-3B"
    paper_results = {"test": {"GRPO": {"micro_success": 0.869}, "SEED": {"micro_success": 1.0}}}
    paper_note = "Paper: Qwen2.5-VL-3B-Instruct on EZPoints with image observations (8 steps)."
    offline_note = "Games are generated from seeds as gym-cards generates them; the card images come from gym-cards."
    analysis_description = ANALYSIS_DESCRIPTION
    rules_version = RULES_VERSION
    observation_modes = ("text", "image")
    reports_reward = True
    options_model = EZPointsOptions

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
        seeds = _test_seeds(TEST_SIZE) if split == "test" else range(*TRAIN_SEED_RANGE)
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
        return EZPointsGame(self, bool(expert))

    def render_prompt(
        self,
        task: str,
        observation: str,
        admissible: Sequence[str] | None,
        step: int,
        history: Sequence[tuple[str, str]],
        history_length: int,
    ) -> str:
        if self.observation == "image":
            return EZPOINTS_TEMPLATE.format(text_formula=observation)
        return EZPOINTS_TEXT_TEMPLATE.format(text_formula=observation, cards=task)

    def parse_action(self, response: str) -> tuple[str, bool]:
        return gym_projection(response)

    def format_response(self, think: str, action: str) -> str:
        return json.dumps({"thoughts": think, "action": action}, indent=2)

    def demo_thought(self, trajectory, turn, action: str) -> str | None:
        """The arithmetic the expert's move follows from, in words the prompt supports: the two card values, the
        formula that makes 12, the formula so far and so the next character (the prompt shows cards and formula)."""
        values = [_card_value(name) for name in str(trajectory.task).split(" and ")]
        if len(values) != 2 or None in values:
            return None
        a, b = values
        op = "+" if a + b == 12 else "*"
        return (
            f"The cards are {a} and {b}. {a} {op} {b} = 12, so the formula is {a}{op}{b}=. The current formula is "
            f"'{turn.observation}', so the next character is {action}."
        )

    def random_response(self, result: StepResult, rng: random.Random) -> str:
        return self.format_response("I pick a random character.", rng.choice(ACTION_NAMES))

    def rules_skill(self, trajectory) -> tuple[str, str]:
        return rules_skill(trajectory)

    def leaks(self, trajectory, skill: str) -> list[tuple[int, int]]:
        """Spans of `skill` naming this game's cards (a card's name, or both values side by side: "5 and 7", "5+7";
        `rules.card_spans`), read from the trajectory's task line. The winning formula holds both values, so a
        written move sequence ("5", "+", "7", "=") is caught too."""
        return card_spans(trajectory.task, skill)

    def template_texts(self) -> list[str]:
        return [
            EZPOINTS_TEMPLATE.format(text_formula="5+"),
            EZPOINTS_TEXT_TEMPLATE.format(text_formula="", cards="5 of Spades and 7 of Diamonds"),
        ]

    def sample_texts(self) -> list[str]:
        return [
            EZPOINTS_TEXT_TEMPLATE.format(text_formula=formula, cards=cards_text(EZPoints(s).cards))
            for s, formula in zip(range(8), ["", "5", "5+", "3*", "10+", "2", "6*2", "4*3"], strict=True)
        ]


class EZPointsGame:
    """One episode slot: a game, gym-cards' steps, and (expert games) the next character of a winning formula."""

    def __init__(self, env: EZPointsEnv, expert: bool = False):
        self.env = env
        self.expert = expert
        self.game: EZPoints | None = None
        self.total = 0.0

    def reset(self, task: Task) -> StepResult:
        self.game = EZPoints(int(task.task_id), data_root=self.env.data_root)
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
        expert_action = None
        if self.expert and not done:
            plan = solve(game)
            expert_action = ACTION_NAMES[plan[0]] if plan else "="
        return StepResult(
            observation=game.formula_text(),
            admissible=list(ACTION_NAMES),
            won=bool(game.won),
            done=done,
            task=cards_text(game.cards),
            expert_action=expert_action,
            reward=reward,
            score=1.0 if game.won else 0.0,
            info={**info, "cards": list(game.cards), "return": round(self.total, 4)},
            image=encode_png(game.image()) if self.env.observation == "image" else None,
        )

    def close(self) -> None:
        self.game = None
