"""WebShop on the environment protocol, as verl-agent and the SEED code run it.

A task is a synthetic goal (test = goals 0-499, train = 500 onward; `data.py`); its category the product category.
The agent sees verl-agent's WebShop prompt (`prompt.py`: task line, the last 2 observation/action pairs, the
admissible actions) and answers `<think>...</think><action>...</action>`; validity is verl-agent's WebShop projection
(`projection.py`). Buying ends the episode: the purchase reward in [0, 1] is the score, and reward 1.0 is a success,
which is what the trainer's reward is made of (`reward.py`). At most 15 steps. Options (`env_options`): `goal_seed`
(default 0: the seed of goal order and price caps).
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

from pydantic import Field

from seedcli.envs.base import Environment, EnvOptions, StepResult, Task
from seedcli.envs.card import EnvCard
from seedcli.envs.webshop import prompt
from seedcli.envs.webshop.data import CATEGORIES, TASK_ID_RE, load_shop, resolve_data_root, task_id
from seedcli.envs.webshop.episode import WebShopGame
from seedcli.envs.webshop.expert import random_action
from seedcli.envs.webshop.hindsight import HINDSIGHT_VERSION, hindsight_skill, page_state
from seedcli.envs.webshop.projection import project_action
from seedcli.envs.webshop.reward import ADVANTAGE_NORM, INVALID_PENALTY, SUCCESS_REWARD, goal_spans
from seedcli.envs.webshop.rules import RULES_VERSION, rules_skill
from seedcli.errors import UserError

logger = logging.getLogger(__name__)

CARD = EnvCard(
    metric_labels={"mean_score": "score", "micro_success": "success"},
    task_noun="goal",
    category_label="product category",
    paper_results={
        "test": {
            "GRPO": {"mean_score": 0.798},
            "SEED": {"mean_score": 0.885, "micro_success": 0.789},
        },
    },
    paper_note="Paper: Qwen2.5-3B on the 500 test goals; GRPO's single number (79.8) is read as its score.",
    offline_note=(
        "Goal order and price caps come from random.Random(0) (SEED's goal index lists are not available offline); "
        "search is a pure-Python BM25 that matches Lucene's top 1 on all 1,215 reference queries."
    ),
)


class WebShopOptions(EnvOptions):
    """`env_options` of WebShop."""

    goal_seed: int = Field(
        0, description="seed of the goal order and price caps (test = the first 500 goals in that order)"
    )


class WebShopEnv(Environment):
    """WebShop (small: 1,000 products, 6,910 synthetic goals) with verl-agent's prompt, parser and rewards."""

    name = "webshop"
    title = "WebShop"
    prompt_version = prompt.PROMPT_VERSION
    task_line_prefix = prompt.TASK_LINE_PREFIX
    max_steps = 15
    history = 2
    success_reward = SUCCESS_REWARD
    invalid_penalty = INVALID_PENALTY
    advantage_norm = ADVANTAGE_NORM
    gigpo_norm = "mean"  # verl-agent run_webshop.sh: mode=mean_norm
    splits = {"test": "test", "train": "train"}
    train_split = "train"
    eval_splits = ("test",)
    val_split = "test"
    categories = CATEGORIES
    analysis_description = prompt.ANALYSIS_DESCRIPTION
    rules_version = RULES_VERSION
    hindsight_version = HINDSIGHT_VERSION
    expert_modes = (False, True)
    options_model = WebShopOptions
    card = CARD

    def __init__(self, data_root: str | None = None, **options: Any):
        super().__init__(data_root, **options)
        self.goal_seed = int(self.options.get("goal_seed", 0))

    # -- data and tasks -----------------------------------------------------------------------------------------

    def resolve_data_root(self) -> Path:
        return resolve_data_root(self.data_root)

    def spec(self) -> dict[str, Any]:
        return {"data_root": str(resolve_data_root(self.data_root)), **self.options}  # workers find the same data

    def shop(self):
        """The products, goals and search engine (built once per process)."""
        return load_shop(self.data_root, self.goal_seed)

    def list_tasks(self, split: str) -> list[Task]:
        canon = self.resolve_split(split)
        shop = self.shop()
        return [Task(task_id(i), shop.goals[i]["category"], canon, f"goal {i}") for i in shop.split_goals(canon)]

    def goal_index(self, task: Task | str) -> int:
        """The goal index a task names; an unknown id or an index out of range is a one-line UserError."""
        tid = task.task_id if isinstance(task, Task) else str(task)
        m = TASK_ID_RE.match(tid)
        n = len(self.shop().goals)
        if m is None or not 0 <= int(m.group(1)) < n:
            raise UserError(f"unknown WebShop task {tid!r}: use goal-0 .. goal-{n - 1} (test: goal-0 .. goal-499)")
        return int(m.group(1))

    def new_game(self, expert: bool | str = False) -> WebShopGame:
        return WebShopGame(self.shop(), self.goal_index, self.goal_seed, expert=expert)

    # -- prompt and actions -------------------------------------------------------------------------------------

    def render_prompt(self, task, observation, admissible, step, history, history_length) -> str:
        return prompt.render_webshop_prompt(task, observation, list(admissible or []), step, history, history_length)

    def parse_action(self, response: str) -> tuple[str, bool]:
        return project_action(response)

    def expert_response(self, result: StepResult) -> str:
        return self.format_response("I follow the expert plan.", result.expert_action or "click[buy now]")

    def random_response(self, result: StepResult, rng: random.Random) -> str:
        action = random_action(list(result.admissible or []), result.task, rng)
        return self.format_response("I pick a random admissible action.", action)

    # -- analysis and tokenizer ---------------------------------------------------------------------------------

    def rules_skill(self, trajectory) -> tuple[str, str]:
        return rules_skill(trajectory)

    def hindsight_skill(self, trajectory) -> tuple[str, str]:
        """The turn that left the expert's path, the item it opened against the goal's options, price and kind (a
        win's: the item bought), and the expert's action there (`hindsight.hindsight_skill`)."""
        shop = self.shop()
        goal = shop.goals[self.goal_index(trajectory.task_id)]
        return hindsight_skill(trajectory, self.hindsight_replay(trajectory, page_state), shop, goal)

    def leaks(self, trajectory, skill: str) -> list[tuple[int, int]]:
        """Spans of `skill` naming the goal product of the trajectory's goal (`task_id` goal-N): its ASIN or its
        title, case-insensitive (`reward.goal_spans`)."""
        goal = self.shop().goals[self.goal_index(trajectory.task_id)]
        return goal_spans(skill, goal["asin"], goal["name"])

    def sample_texts(self) -> list[str]:
        try:
            root = resolve_data_root(self.data_root)
        except UserError as err:
            logger.warning(
                "tiny tokenizer trained without WebShop text (%s); prompts will tokenize less compactly", err
            )
            return prompt.fallback_texts(self.history)
        return list(prompt.sample_texts(str(root), self.goal_seed))
