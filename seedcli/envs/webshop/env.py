"""WebShop on the environment protocol, as verl-agent and the SEED code run it.

A task is a synthetic goal (test = goals 0-499, train = 500 onward); its category the product category. The agent
sees verl-agent's WebShop prompt (task line, the last 2 observation/action pairs, the admissible actions) and answers
`<think>...</think><action>...</action>`; validity is verl-agent's WebShop projection. Buying ends the episode: the
purchase reward in [0, 1] is the score, and reward 1.0 is a success (episode reward 10). At most 15 steps.
Options (`env_options`): `goal_seed` (default 0: the seed of goal order and price caps).
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field

from seedcli.envs.base import Environment, EnvOptions, StepResult, Task
from seedcli.envs.webshop.data import load_shop, resolve_data_root
from seedcli.envs.webshop.engine import WebShopSession
from seedcli.envs.webshop.expert import admissible_actions, expert_action, random_action
from seedcli.envs.webshop.reward import goal_spans
from seedcli.envs.webshop.rules import RULES_VERSION
from seedcli.errors import UserError

logger = logging.getLogger(__name__)

PROMPT_VERSION = "webshop-v1"  # bump whenever the prompt text changes
TASK_LINE_PREFIX = "Your task is to: "
CATEGORIES = ("beauty", "electronics", "fashion", "garden", "grocery")
ANALYSIS_DESCRIPTION = (
    "You are an expert analyst of web-shopping agents in WebShop (a simulated e-commerce site where the agent "
    "searches, opens products, chooses their options and buys the one that matches an instruction)."
)

# verl-agent's agent_system/environments/prompts/webshop.py, character for character (the "e‑commerce" hyphen is
# U+2011 there too).
WEBSHOP_TEMPLATE_NO_HIS = """
You are an expert autonomous agent operating in the WebShop e\u2011commerce environment. 
Your task is to: {task_description}.
Your current observation is: {current_observation}.
Your admissible actions of the current situation are: 
[
{available_actions}
].

Now it's your turn to take one action for the current step.
You should first reason step-by-step about the current situation, then think carefully which admissible action best advances the shopping goal. This reasoning process MUST be enclosed within <think> </think> tags. 
Once you've finished your reasoning, you should choose an admissible action for current step and present it within <action> </action> tags.
"""  # noqa: W291 (trailing spaces are part of the original)

WEBSHOP_TEMPLATE = """
You are an expert autonomous agent operating in the WebShop e\u2011commerce environment.
Your task is to: {task_description}.
Prior to this step, you have already taken {step_count} step(s). Below are the most recent {history_length} observations and the corresponding actions you took: {action_history}
You are now at step {current_step} and your current observation is: {current_observation}.
Your admissible actions of the current situation are: 
[
{available_actions}
].

Now it's your turn to take one action for the current step.
You should first reason step-by-step about the current situation, then think carefully which admissible action best advances the shopping goal. This reasoning process MUST be enclosed within <think> </think> tags. 
Once you've finished your reasoning, you should choose an admissible action for current step and present it within <action> </action> tags.
"""  # noqa: W291

MAX_PROMPT_CHARS = 13000  # verl-agent drops the history when the prompt would be longer
_CJK_RE = re.compile(r"[\u4e00-\u9fff]")
_TASK_ID_RE = re.compile(r"^goal-(\d+)$")


def task_id(goal_index: int) -> str:
    """The stable id of a goal: its index in the seeded goal order."""
    return f"goal-{goal_index}"


def format_observation(raw: str, task: str) -> str:
    """verl-agent's format_obs: the page text after the instruction, each piece quoted ("'Search'")."""
    parts = raw.split(" [SEP] ")
    try:
        index = parts.index(task)
    except ValueError:
        return raw
    return " [SEP] ".join(f"'{p}'" for p in parts[index + 1 :])


def project_action(response: str) -> tuple[str, bool]:
    """verl-agent's webshop_projection: (action, valid). The reply is lower-cased; the action is the text between
    <action> and </action>; without those tags, the last 20 characters are sent and the turn is invalid; missing
    <think> tags or a CJK character also make it invalid."""
    lowered = response.lower()
    start, end = lowered.find("<action>"), lowered.find("</action>")
    if start == -1 or end == -1:
        return lowered[-20:], False
    action = lowered[start + len("<action>") : end].strip().lower()
    valid = response.find("<think>") != -1 and response.find("</think>") != -1
    if _CJK_RE.search(response):
        valid = False
    return action, valid


def render_webshop_prompt(
    task: str,
    observation: str,
    admissible: Sequence[str],
    step: int,
    history: Sequence[tuple[str, str]],
    history_length: int,
) -> str:
    """verl-agent's WebShop prompt for turn `step` (1-based); `history` holds all earlier (observation, action)."""
    actions = "\n".join(f"'{a}'," for a in admissible)
    if step <= 1 or history_length <= 0:
        return WEBSHOP_TEMPLATE_NO_HIS.format(
            task_description=task, current_observation=observation, available_actions=actions
        )
    recent = list(history)[-history_length:]
    first = len(history) - len(recent)
    lines = [
        f"[Observation {first + j + 1}: '{obs}', Action {first + j + 1}: '{act}']"
        for j, (obs, act) in enumerate(recent)
    ]
    prompt = WEBSHOP_TEMPLATE.format(
        task_description=task,
        step_count=len(history),
        history_length=len(recent),
        action_history="\n".join(lines),
        current_step=len(history) + 1,
        current_observation=observation,
        available_actions=actions,
    )
    if len(prompt) > MAX_PROMPT_CHARS:
        prompt = WEBSHOP_TEMPLATE_NO_HIS.format(
            task_description=task, current_observation=observation, available_actions=actions
        )
    return prompt


class WebShopOptions(EnvOptions):
    """`env_options` of WebShop."""

    goal_seed: int = Field(
        0, description="seed of the goal order and price caps (test = the first 500 goals in that order)"
    )


class WebShopGame:
    """One episode slot: a WebShop session on one goal; `expert` adds the expert's next action."""

    def __init__(self, env: WebShopEnv, expert: bool | str = False):
        self.env = env
        self.expert = bool(expert)
        self.session = WebShopSession(env.shop(), seed=env.goal_seed)
        self.task_text = ""

    def _result(self, raw: str, reward: float, done: bool) -> StepResult:
        s = self.session
        info: dict[str, Any] = {"goal_index": s.goal_index, "page": s.page_kind}
        if done:
            info.update(
                asin=s.asin,
                options=dict(s.options),
                goal_asin=s.goal["asin"],
                goal_options=dict(s.goal["goal_options"]),
                price_upper=s.goal["price_upper"],
                price=self.env.shop().prices.get(s.asin or ""),
                reward_info=dict(s.reward_info),
            )
        return StepResult(
            observation=format_observation(raw, self.task_text),
            admissible=[] if done else admissible_actions(s),
            won=bool(done and s.reward == 1.0),
            done=done,
            task=self.task_text,
            expert_action=expert_action(s) if self.expert and not done else None,
            reward=float(reward),
            score=float(s.reward) if done else 0.0,
            info=info,
        )

    def reset(self, task: Task) -> StepResult:
        index = self.env.goal_index(task)
        raw = self.session.reset(index)
        # verl-agent reads the task back from the page, where it is stripped
        self.task_text = self.session.instruction_text.strip()
        return self._result(raw, 0.0, False)

    def step(self, action: str) -> StepResult:
        if self.session.goal_index < 0:
            raise RuntimeError("step() before reset()")
        raw, reward, done = self.session.step(action)
        return self._result(raw, reward, done)

    def close(self) -> None:
        pass


class WebShopEnv(Environment):
    """WebShop (small: 1,000 products, 6,910 synthetic goals) with verl-agent's prompt, parser and rewards."""

    name = "webshop"
    title = "WebShop"
    prompt_version = PROMPT_VERSION
    task_line_prefix = TASK_LINE_PREFIX
    max_steps = 15
    history = 2
    success_reward = 10.0
    invalid_penalty = 0.1
    advantage_norm = "mean"  # the SEED code normalises WebShop groups by their mean only
    splits = {"test": "test", "train": "train"}
    train_split = "train"
    eval_splits = ("test",)
    val_split = "test"
    categories = CATEGORIES
    category_label = "product category"
    task_noun = "goal"
    metric_labels = {"mean_score": "score", "micro_success": "success"}
    paper_results = {
        "test": {
            "GRPO": {"mean_score": 0.798},
            "SEED": {"mean_score": 0.885, "micro_success": 0.789},
        },
    }
    paper_note = "Paper: Qwen2.5-3B on the 500 test goals; GRPO's single number (79.8) is read as its score."
    offline_note = (
        "Goal order and price caps come from random.Random(0) (SEED's goal index lists are not available offline); "
        "search is a pure-Python BM25 that matches Lucene's top 1 on all 1,215 reference queries."
    )
    analysis_description = ANALYSIS_DESCRIPTION
    rules_version = RULES_VERSION
    expert_modes = (False, True)
    options_model = WebShopOptions

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
        m = _TASK_ID_RE.match(tid)
        n = len(self.shop().goals)
        if m is None or not 0 <= int(m.group(1)) < n:
            raise UserError(f"unknown WebShop task {tid!r}: use goal-0 .. goal-{n - 1} (test: goal-0 .. goal-499)")
        return int(m.group(1))

    def new_game(self, expert: bool | str = False) -> WebShopGame:
        return WebShopGame(self, expert)

    # -- prompt and actions -------------------------------------------------------------------------------------

    def render_prompt(self, task, observation, admissible, step, history, history_length) -> str:
        return render_webshop_prompt(task, observation, list(admissible or []), step, history, history_length)

    def parse_action(self, response: str) -> tuple[str, bool]:
        return project_action(response)

    def expert_response(self, result: StepResult) -> str:
        return self.format_response("I follow the expert plan.", result.expert_action or "click[buy now]")

    def random_response(self, result: StepResult, rng: random.Random) -> str:
        action = random_action(list(result.admissible or []), result.task, rng)
        return self.format_response("I pick a random admissible action.", action)

    # -- analysis and tokenizer ---------------------------------------------------------------------------------

    def rules_skill(self, trajectory) -> tuple[str, str]:
        from seedcli.envs.webshop.rules import rules_skill

        return rules_skill(trajectory)

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
            return [
                render_webshop_prompt(
                    "find me a product", "'Search'", ["search[<your query>]", "click[search]"], 1, [], self.history
                )
            ]
        return list(_sample_texts(str(root), self.goal_seed))


@lru_cache(maxsize=2)
def _sample_texts(root: str, seed: int) -> tuple[str, ...]:
    """Prompts of expert episodes on the first 40 test goals, plus every product title: what the agent reads."""
    shop = load_shop(root, seed)
    session = WebShopSession(shop, seed=seed)
    texts: list[str] = [p["Title"] for p in shop.products]
    for index in range(min(40, len(shop.goals))):
        raw = session.reset(index)
        task = session.instruction_text
        history: list[tuple[str, str]] = []
        for step in range(1, 9):
            obs = format_observation(raw, task)
            texts.append(render_webshop_prompt(task, obs, admissible_actions(session), step, history, 2))
            action = expert_action(session)
            if action is None:
                break
            history.append((obs, action))
            raw, _, done = session.step(action)
            if done:
                break
    return tuple(texts)
