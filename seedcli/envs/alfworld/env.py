"""ALFWorld on the environment protocol (`seedcli.envs.base`): `AlfWorldEnv`, which stages reach as
`get_env("alfworld")` and never import. Tasks are games (`data.list_games`), categories the six task types; one game
is an `episode.AlfWorldGame`. This module never imports torch.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

from seedcli.envs.alfworld import prompt
from seedcli.envs.alfworld.data import SHORT_TASK_TYPES, SPLITS, TASK_TYPES, list_games, resolve_data_root, select_games
from seedcli.envs.alfworld.episode import AlfWorldGame
from seedcli.envs.alfworld.expert import EXPERT_MODES
from seedcli.envs.alfworld.hindsight import HINDSIGHT_VERSION, hindsight_skill
from seedcli.envs.alfworld.projection import parse_action
from seedcli.envs.alfworld.reward import ADVANTAGE_NORM, INVALID_PENALTY, SUCCESS_REWARD, instance_spans
from seedcli.envs.alfworld.rules import rules_skill
from seedcli.envs.base import Environment, StepResult, Task
from seedcli.envs.card import EnvCard
from seedcli.errors import UserError

logger = logging.getLogger(__name__)

CARD = EnvCard(
    metric_labels={"macro_success": "macro success", "micro_success": "micro success"},
    task_noun="game",
    category_label="task type",
    category_names={
        "pick": "Pick",
        "look": "Look",
        "clean": "Clean",
        "heat": "Heat",
        "cool": "Cool",
        "pick_two": "Pick Two",
    },
    # Paper results (Qwen2.5-3B-Instruct), docs/design.md §1, as fractions; only the macro-average is given.
    paper_results={
        "valid_seen": {
            "Vanilla": {"macro_success": 0.219},
            "GRPO": {"macro_success": 0.750},
            "SDAR": {"macro_success": 0.844},
            "SEED": {"macro_success": 0.918},
        },
        "valid_unseen": {
            "GRPO": {"macro_success": 0.709},
            "SEED": {"macro_success": 0.862},
        },
    },
    paper_note="The design card gives only the paper's macro averages; per-type paper numbers are not shown rather than guessed.",
)


class AlfWorldEnv(Environment):
    """ALFWorld on the environment protocol: tasks are games, categories the six task types."""

    name = "alfworld"
    title = "ALFWorld"
    max_steps = 30
    history = 5
    success_reward = SUCCESS_REWARD
    invalid_penalty = INVALID_PENALTY
    advantage_norm = ADVANTAGE_NORM
    splits = SPLITS
    train_split = "train"
    eval_splits = ("valid_unseen", "valid_seen")
    val_split = "valid_seen"
    categories = SHORT_TASK_TYPES
    category_aliases = {**{k: v for k, v in TASK_TYPES.items()}, "pick2": "pick_two"}
    expert_modes = EXPERT_MODES
    prompt_version = prompt.AGENT_PROMPT_VERSION
    task_line_prefix = prompt.TASK_LINE_PREFIX
    analysis_description = prompt.ALFWORLD_ANALYSIS_DESCRIPTION
    hindsight_version = HINDSIGHT_VERSION
    card = CARD

    def resolve_data_root(self) -> Path:
        return resolve_data_root(self.data_root)

    def spec(self) -> dict:
        return {"data_root": str(resolve_data_root(self.data_root))}  # workers find the same data

    def list_tasks(self, split: str) -> list[Task]:
        return list(list_games(self.data_root, split))

    def select_tasks(self, tasks, n, seed, categories=None):
        return select_games(tasks, n, seed, categories)

    def new_game(self, expert: bool | str = False) -> AlfWorldGame:
        return AlfWorldGame(expert=expert, data_root=self.data_root)

    def render_prompt(self, task, observation, admissible, step, history, history_length) -> str:
        return prompt.render_agent_prompt(task, observation, admissible or [], step, history, history_length)

    def parse_action(self, response: str) -> tuple[str, bool]:
        return parse_action(response)

    def expert_response(self, result: StepResult) -> str:
        # An expert with nothing to suggest looks around (a neutral command).
        return self.format_response("I follow the expert plan.", result.expert_action or "look")

    def random_response(self, result: StepResult, rng: random.Random) -> str:
        choices = [a for a in (result.admissible or []) if a != "help"] or ["look"]
        return self.format_response("I pick a random admissible action.", rng.choice(choices))

    def rules_skill(self, trajectory) -> tuple[str, str]:
        return rules_skill(trajectory)

    def hindsight_skill(self, trajectory) -> tuple[str, str]:
        """The first action off the expert's plan that changed the game (a win's: the one that took the task's
        object), the expert's action there and where the object was (`hindsight.hindsight_skill`)."""
        key = (trajectory.task_id, trajectory.split)
        plans = self.__dict__.setdefault("_plan_cache", {})  # the expert's plan from the start, once per game
        if key not in plans:
            plans[key] = [
                a for a, _ in self.expert_plan(Task(trajectory.task_id, trajectory.category, trajectory.split))
            ]
        return hindsight_skill(trajectory, self.hindsight_replay(trajectory), plans[key])

    def leaks(self, trajectory, skill: str) -> list[tuple[int, int]]:
        """Spans of `skill` naming a numbered receptacle or object ("drawer 3", "mug 1") that this episode's
        observations or actions name (`reward.instance_spans`)."""
        return instance_spans(trajectory, skill)

    def sample_texts(self) -> list[str]:
        try:
            root = resolve_data_root(self.data_root)
        except UserError as err:
            logger.warning(
                "tiny tokenizer trained without ALFWorld text (%s); prompts will tokenize less compactly", err
            )
            return []
        return list(prompt.sample_texts(str(root)))

    def template_texts(self) -> list[str]:
        return prompt.template_texts()
