"""WebShop's text: verl-agent's WebShop templates character for character, the turn prompt built from them (task
line, the last observation/action pairs, the admissible actions), the page text as the agent reads it, the analysis
prompt's first sentence, and the tiny tokenizer's text. Bump `PROMPT_VERSION` whenever the rendered text changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from seedcli.envs.webshop.data import load_shop
from seedcli.envs.webshop.expert import admissible_actions, expert_action
from seedcli.envs.webshop.game import WebShopSession

PROMPT_VERSION = "webshop-v1"  # bump whenever the prompt text changes
TASK_LINE_PREFIX = "Your task is to: "
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


def format_observation(raw: str, task: str) -> str:
    """verl-agent's format_obs: the page text after the instruction, each piece quoted ("'Search'")."""
    parts = raw.split(" [SEP] ")
    try:
        index = parts.index(task)
    except ValueError:
        return raw
    return " [SEP] ".join(f"'{p}'" for p in parts[index + 1 :])


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


def fallback_texts(history: int) -> list[str]:
    """The tiny tokenizer's text without data: a first-turn prompt on the index page."""
    return [
        render_webshop_prompt(
            "find me a product", "'Search'", ["search[<your query>]", "click[search]"], 1, [], history
        )
    ]


@lru_cache(maxsize=2)
def sample_texts(root: str, seed: int) -> tuple[str, ...]:
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
