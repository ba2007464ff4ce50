"""Sokoban on the environment protocol, as verl-agent and the SEED code run it (visual agents).

A task is a room seed: `train` holds every seed of [0, 2**16 - 1) (drawn as verl-agent draws them), `test` the
fixed list of 512 seeds from [2**16, 2**32 - 1) (`game.test_seeds`; `seed eval --limit N` plays its first N). One
category. The agent sees verl-agent's Sokoban prompt: in `text` mode the grid (`# _ O √ X P S`) with the last two
observation/action pairs, in `image` mode the visual template with the room as gym-sokoban's 96×96 rgb_array image
(`StepResult.image`, a PNG) and no history, as verl-agent's visual template has none. Replies are
`<think>…</think><action>up|down|left|right</action>`, read by verl-agent's `sokoban_projection` (quirks kept: the
first of up/down/left/right/still that occurs *inside* the action text wins, "still" is valid and moves nothing,
a reply without both think tags is invalid but its action is still played). gym-sokoban's rewards are the step
rewards (`StepResult.reward`: -0.1 a step, +1/-1 box on/off target, +10 solved); the episode is a success when
every box is on a target, at most 15 steps. Options (`env_options`): `observation`, `dim`, `num_boxes`,
`search_depth`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from seedcli.envs.base import Environment, EnvOptions, StepResult, Task, encode_png
from seedcli.envs.sokoban.expert import solve
from seedcli.envs.sokoban.game import (
    ACTION_NAMES,
    TEST_LIST_SIZE,
    TILE,
    TRAIN_SEED_HIGH,
    Sokoban,
    resolve_data_root,
)
from seedcli.envs.sokoban.game import test_seeds as _test_seeds
from seedcli.envs.sokoban.rules import RULES_VERSION, move_spans, rules_skill

PROMPT_VERSION = "sokoban-v1"  # bump whenever the prompt text changes
CATEGORY = "sokoban"
TASK_LINE_PREFIX = "Your goal is to push all the boxes"  # the skill block goes after this line (text and image)
MOVES = ("up", "down", "left", "right")
ANALYSIS_DESCRIPTION = (
    "You are an expert analyst of Sokoban agents (a grid puzzle where the agent walks and pushes boxes, never "
    "pulls them, until every box stands on a target)."
)

# verl-agent agent_system/environments/prompts/sokoban.py, character for character (trailing space included).
SOKOBAN_TEMPLATE_NO_HIS = """
You are an expert agent operating in the Sokoban environment.

# Symbols and Their Meaning
- Walls (`#`): These block movement. You can't move through or push anything into walls.
- Floor (`_`): Open spaces where you can walk and move boxes.
- Targets (`O`): The spots where boxes need to go.
- Boxes (`X`): These are what you need to push onto the targets.
- Player (`P`): That's you! You'll move around the grid to push boxes.
- Box on Target (`√`): A box successfully placed on a target.
- Player on Target (`S`): You standing on a target.

# Your Goal
Your goal is to push all the boxes (`X`) onto the target spots (`O`). Once all boxes are on the targets, you win!

# Rules
You can only push boxes. You can't pull them, so plan ahead to avoid getting stuck.
You can't walk through or push boxes into walls (`#`).
To avoid traps, do not push boxes into corners or against walls where they can't be moved again.

# Current Step
Your current observation is:
{current_observation}
Your admissible actions are ["up", "down", "left", "right"].

Now it's your turn to make a move (choose ONE action only for the current step).
You should first reason step-by-step about the current situation — observe the positions of boxes and targets, plan a path to push a box toward a target, and avoid traps like corners or walls. This reasoning process MUST be enclosed within <think> </think> tags. 
Once you've finished your reasoning, you should choose an admissible action for current step and present it within <action> </action> tags.
"""  # noqa: W291 (trailing spaces are part of the original)

SOKOBAN_TEMPLATE = """
You are an expert agent operating in the Sokoban environment.

# Symbols and Their Meaning
- Walls (`#`): These block movement. You can't move through or push anything into walls.
- Floor (`_`): Open spaces where you can walk and move boxes.
- Targets (`O`): The spots where boxes need to go.
- Boxes (`X`): These are what you need to push onto the targets.
- Player (`P`): That's you! You'll move around the grid to push boxes.
- Box on Target (`√`): A box successfully placed on a target.
- Player on Target (`S`): You standing on a target.

# Your Goal
Your goal is to push all the boxes (`X`) onto the target spots (`O`). Once all boxes are on the targets, you win!

# Rules
You can only push boxes. You can't pull them, so plan ahead to avoid getting stuck.
You can't walk through or push boxes into walls (`#`).
To avoid traps, do not push boxes into corners or against walls where they can't be moved again.

# Current Step
Prior to this step, you have already taken {step_count} step(s). Below are the most recent {history_length} observations and the corresponding actions you took: {action_history}
You are now at step {current_step} and your current observation is:
{current_observation}
Your admissible actions are ["up", "down", "left", "right"].

Now it's your turn to make a move (choose ONE action only for the current step).
You should first reason step-by-step about the current situation — observe the positions of boxes and targets, plan a path to push a box toward a target, and avoid traps like corners or walls. This reasoning process MUST be enclosed within <think> </think> tags. 
Once you've finished your reasoning, you should choose an admissible action for current step and present it within <action> </action> tags.
"""  # noqa: W291

SOKOBAN_VISUAL_TEMPLATE = """
You are an expert agent operating in the Sokoban environment. Your goal is to push all the boxes onto the target spots. Once all boxes are on the targets, you win!

# Rules
You can only push boxes. You can't pull them, so plan ahead to avoid getting stuck.
You can't walk through or push boxes into walls.
To avoid traps, do not push boxes into corners or against walls where they can't be moved again.

# Visual Elements in the Image:
Character: A small, green alien-like figure with two antennae and black eyes. It represents you.
Box: A yellow crate marked with an orange "X" across its front. It is the box you need to push.
Target: A black tile outlined in red, with a small red diamond shape in the center. It marks the destination where a box should be pushed.

# Current Step
Your current observation is shown in the image: <image>
Your admissible actions are ["up", "down", "left", "right"].

Now it's your turn to make a move (choose ONE action only for the current step).
You should first reason step-by-step about the current situation — observe the positions of boxes and targets, plan a path to push a box toward a target, and avoid traps like corners or walls. This reasoning process MUST be enclosed within <think> </think> tags. 
Once you've finished your reasoning, you should choose an admissible action for current step and present it within <action> </action> tags.
"""  # noqa: W291

# verl-agent's sokoban_projection scans its action pool in this order; the first name inside the action text wins.
_PROJECTION_POOL = {"up": 1, "down": 2, "left": 3, "right": 4, "still": 0}
_ACTION_IDS = {name: i for i, name in ACTION_NAMES.items()}


def sokoban_projection(response: str) -> tuple[str, bool]:
    """verl-agent `sokoban_projection` for one reply: (action name sent to the game, valid). The name is one of
    still/up/down/left/right ("still": no `<action>…</action>` block, or none of the names inside it)."""
    lowered = response.lower()
    start, end = lowered.find("<action>"), lowered.find("</action>")
    action, valid = "still", False
    if start != -1 and end != -1:
        extracted = lowered[start + len("<action>") : end].strip().lower()
        for name in _PROJECTION_POOL:
            if name in extracted:
                action, valid = name, True
                break
    if response.find("<think>") == -1 or response.find("</think>") == -1:
        valid = False
    return action, valid


def render_history(history: Sequence[tuple[str, str]], history_length: int) -> tuple[str, int]:
    """verl-agent `SimpleMemory.fetch`: the last `history_length` (observation, action) pairs as
    "[Observation k: '…', Action k: 'Up']" lines (actions capitalised as `SokobanEnvironmentManager.ACTION_LOOKUP`),
    and how many were shown."""
    recent = list(history)[-history_length:] if history_length > 0 else []
    first = len(history) - len(recent)
    lines = [
        f"[Observation {first + j + 1}: '{obs}', Action {first + j + 1}: '{action.capitalize()}']"
        for j, (obs, action) in enumerate(recent)
    ]
    return "\n".join(lines), len(recent)


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
    prompt_version = PROMPT_VERSION
    task_line_prefix = TASK_LINE_PREFIX
    max_steps = 15
    history = 2
    max_step_skills = 2  # the SEED code's analysis_max_step_skills_per_traj for sokoban
    success_reward = 10.0
    invalid_penalty = 0.1
    advantage_norm = "mean_std"
    splits = {"train": "train", "test": "test", "valid": "test", "validation": "test", "eval": "test"}
    train_split = "train"
    eval_splits = ("test",)
    val_split = "test"
    categories = (CATEGORY,)
    category_names = {CATEGORY: "Sokoban"}
    category_label = "variant"
    task_noun = "room"
    metric_labels = {"micro_success": "success"}
    paper_model = "Qwen2.5-VL-3B"
    paper_results = {"test": {"GRPO": {"micro_success": 0.671}, "SEED": {"micro_success": 0.820}}}
    paper_note = (
        "Paper: Qwen2.5-VL-3B-Instruct on visual Sokoban (6x6, one box, 15 steps, image observations); the "
        "paper reports success only."
    )
    offline_note = "Rooms are generated from seeds as verl-agent generates them; no data files beyond the tiles."
    analysis_description = ANALYSIS_DESCRIPTION
    rules_version = RULES_VERSION
    observation_modes = ("text", "image")
    reports_reward = True
    options_model = SokobanOptions

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
        seeds = _test_seeds(TEST_LIST_SIZE) if split == "test" else range(TRAIN_SEED_HIGH)
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
        return SokobanGame(self, bool(expert))

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
            return SOKOBAN_VISUAL_TEMPLATE
        if step <= 1 or history_length <= 0 or not history:
            return SOKOBAN_TEMPLATE_NO_HIS.format(current_observation=observation)
        text, shown = render_history(history, history_length)
        return SOKOBAN_TEMPLATE.format(
            step_count=len(history),
            history_length=shown,
            action_history=text,
            current_step=len(history) + 1,
            current_observation=observation,
        )

    def parse_action(self, response: str) -> tuple[str, bool]:
        return sokoban_projection(response)

    def random_response(self, result: StepResult, rng: random.Random) -> str:
        return self.format_response("I pick a random move.", rng.choice(MOVES))

    def rules_skill(self, trajectory) -> tuple[str, str]:
        return rules_skill(trajectory)

    def leaks(self, trajectory, skill: str) -> list[tuple[int, int]]:
        """Spans of `skill` writing 4 or more consecutive moves of this episode in a row (`rules.move_spans`); the
        episode's moves are its turns' actions without "still" (a reply that moved nothing)."""
        return move_spans([t.action for t in trajectory.turns if t.action in MOVES], skill)

    def template_texts(self) -> list[str]:
        room = Sokoban(0, dim=(6, 6)).text()
        texts = [SOKOBAN_TEMPLATE_NO_HIS.format(current_observation=room), SOKOBAN_VISUAL_TEMPLATE]
        text, shown = render_history([(room, "up"), (room, "left")], 2)
        texts.append(
            SOKOBAN_TEMPLATE.format(
                step_count=2, history_length=shown, action_history=text, current_step=3, current_observation=room
            )
        )
        return texts

    def sample_texts(self) -> list[str]:
        return [SOKOBAN_TEMPLATE_NO_HIS.format(current_observation=Sokoban(s).text()) for s in range(8)]


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
        won = game.success()
        expert_action = None
        if self.expert and not (won or done):
            plan = solve(game, max_len=64)  # the shortest plan, even one longer than the steps left
            expert_action = ACTION_NAMES[plan[0]] if plan else "still"
        return StepResult(
            observation=game.text(),
            admissible=list(MOVES),
            won=won,
            done=done,
            task="push all the boxes",  # as the goal line of both templates says
            expert_action=expert_action,
            reward=reward,
            score=1.0 if won else 0.0,
            info={**info, "return": round(self.total, 4)},
            image=encode_png(game.image()) if self.env.observation == "image" else None,
        )

    def close(self) -> None:
        self.game = None
