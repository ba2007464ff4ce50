"""ALFWorld's text: the agent's turn prompt (versioned), its parser, and the analysis prompt's first sentence.

The skill block and the analysis prompt are shared by every environment (`seedcli.prompts`); what is ALFWorld's
own lives here, as WebShop's and search's live in their packages. Bump `AGENT_PROMPT_VERSION` whenever the rendered
text changes: every record stores the version that produced it.
"""

from __future__ import annotations

from collections.abc import Sequence

from seedcli.envs.base import parse_think_action
from seedcli.prompts import SCHEMA_REMINDER, insert_after_line, render_analysis_prompt

AGENT_PROMPT_VERSION = "alfworld-agent-v1"

TASK_LINE_PREFIX = "Your task is to: "

_AGENT_HEAD = "You are an expert agent operating in the ALFRED Embodied Environment. " + TASK_LINE_PREFIX + "{task}\n"

_AGENT_HISTORY = (
    "Prior to this step, you have already taken {taken} step(s). Below are the most recent {shown} observations "
    "and the corresponding actions you took:\n{history}\n"
)

_AGENT_TAIL = (
    "You are now at step {step} and your current observation is: {observation}\n"
    "Your admissible actions of the current situation are: [{admissible}].\n\n"
    "Now it's your turn to take an action.\n"
    "You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed "
    "within <think> </think> tags.\n"
    "Once you've finished your reasoning, you should choose an admissible action for current step and present it "
    "within <action> </action> tags."
)

ALFWORLD_ANALYSIS_DESCRIPTION = (
    "You are an expert analyst of embodied agents in the ALFRED household environment (ALFWorld)."
)


def render_agent_prompt(
    task: str,
    observation: str,
    admissible: Sequence[str],
    step: int,
    history: Sequence[tuple[str, str]],
    history_length: int,
) -> str:
    """The user message of one turn (DESIGN.md §2). `step` counts from 1; `history` holds (observation, action)
    pairs of all earlier turns, of which the last `history_length` are shown. The first turn has no history block."""
    text = _AGENT_HEAD.format(task=task)
    shown = list(history)[-history_length:] if history_length > 0 else []
    if shown:
        first = len(history) - len(shown) + 1
        lines = []
        for i, (obs, action) in enumerate(shown):
            lines.append(f"[Observation {first + i}: '{obs}', Action {first + i}: '{action}']")
        text += _AGENT_HISTORY.format(taken=len(history), shown=len(shown), history="\n".join(lines))
    admissible_text = ", ".join(f"'{a}'" for a in admissible if a != "help")
    return text + _AGENT_TAIL.format(step=step, observation=observation, admissible=admissible_text)


def insert_skill(prompt: str, skill: str, task_line_prefix: str = TASK_LINE_PREFIX) -> str:
    """The skill-augmented prompt: the skill block goes right after the task line (DESIGN.md §1, Stage 2 step 3).
    Other environments: `get_env(name).insert_skill` (their task line differs)."""
    return insert_after_line(prompt, task_line_prefix, skill)


def parse_action(response: str) -> tuple[str, bool]:
    """ALFWorld's (action, valid) of a response. Valid when both tags are present and the action is non-empty; the
    action is lower-cased and stripped. An invalid turn still sends its action text (possibly empty) to the game.
    Other environments: `get_env(name).parse_action`."""
    return parse_think_action(response)


def format_response(think: str, action: str) -> str:
    """A well-formed agent response; used by the warm start and by tests."""
    return f"<think>{think}</think>\n<action>{action}</action>"


def tokenizer_corpus() -> list[str]:
    """Template text for training the tiny tokenizer, so prompt boilerplate compresses to few tokens."""
    sample_history = [
        ("You arrive at countertop 1. On the countertop 1, you see a apple 1.", "take apple 1 from countertop 1")
    ]
    agent = render_agent_prompt(
        "put a clean apple in fridge.",
        "You pick up the apple 1 from the countertop 1.",
        ["go to fridge 1", "go to sinkbasin 1", "inventory", "look", "examine apple 1"],
        2,
        sample_history,
        5,
    )
    analysis = render_analysis_prompt(
        "put a clean apple in fridge.",
        True,
        [
            {
                "observation": "You arrive at sinkbasin 1.",
                "response": format_response("clean it", "clean apple 1 with sinkbasin 1"),
                "valid": True,
            }
        ],
        description=ALFWORLD_ANALYSIS_DESCRIPTION,
    )
    failure = render_analysis_prompt("put a hot mug in cabinet.", False, [], description=ALFWORLD_ANALYSIS_DESCRIPTION)
    skill = insert_skill(agent, "First find the object, take it, then go to the target receptacle and put it there.")
    return [agent, analysis, failure, skill, SCHEMA_REMINDER]
