"""Versioned prompt templates: ALFWorld's agent turn prompt, the skill-augmented variant, and the analysis prompt.

Other environments render their own agent prompts (`Environment.render_prompt`); the analysis prompt is shared and
opens with the environment's `analysis_description`.

Every record stores the version of the template that produced it, so a changed template never silently mixes with
old data: bump the version whenever the rendered text changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from seedcli.envs.base import SKILL_HEADING, SKILL_INSTRUCTION, insert_after_line, parse_think_action

AGENT_PROMPT_VERSION = "alfworld-agent-v1"
ANALYSIS_PROMPT_VERSION = "analysis-v1"

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

__all__ = ["SKILL_HEADING", "SKILL_INSTRUCTION"]  # re-exported from seedcli.envs.base


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


# ---------------------------------------------------------------------------------------------------------------
# Analysis prompt (annotate, sft and rl share it)

ALFWORLD_ANALYSIS_DESCRIPTION = (
    "You are an expert analyst of embodied agents in the ALFRED household environment (ALFWorld)."
)

_ANALYSIS_HEAD = (
    "{description} Read the episode "
    "below and extract one hindsight skill the agent should use next time it faces this kind of task.\n\n"
    "Task: {task}\n"
    "Outcome: {outcome} after {length} step(s).\n\n"
    "Episode:\n{steps}\n\n"
)

_ANALYSIS_TAIL = (
    "Write the skill as one short, policy-facing rule, not a retrospective. {kind}\n"
    "Answer with JSON only, exactly this object and nothing else:\n"
    '{{"episode_summary": "<two sentences on what happened>", "episode_skill": "<the rule>"}}'
)

_KIND_SUCCESS = (
    "The episode succeeded: state the reusable workflow — the core decision rule and the order of the key actions."
)
_KIND_FAILURE = (
    "The episode failed: state an avoidance rule — the core mistake, its warning signs, and what to do instead."
)

SCHEMA_REMINDER = (
    "Your previous answer could not be parsed. Reply with a single JSON object with two string fields, "
    '"episode_summary" and "episode_skill" (at least five words), and nothing else.'
)


def render_analysis_prompt(
    task: str,
    won: bool,
    turns: Iterable[dict],
    max_chars: int | None = None,
    *,
    description: str = ALFWORLD_ANALYSIS_DESCRIPTION,
    score: float | None = None,
) -> str:
    """The analyzer's user message for one finished episode. `turns` yields dicts with `observation`, `response` and
    `valid`. With `max_chars`, the oldest steps are dropped first (the prompt keeps the task and outcome) and a
    line says how many were cut — used by sft to fit `--max-length`. `description` is the environment's
    `analysis_description`; a fractional `score` (strictly between 0 and 1) is shown with the outcome."""
    rendered = []
    for i, turn in enumerate(turns, start=1):
        validity = "valid" if turn["valid"] else "INVALID (format error)"
        rendered.append(
            f"Step {i}\nObservation: {turn['observation']}\nAgent response ({validity}): {turn['response']}"
        )
    outcome = "SUCCESS" if won else "FAILURE"
    if score is not None and 0.0 < score < 1.0:
        outcome += f" (score {score:.2f} of 1)"
    kind = _KIND_SUCCESS if won else _KIND_FAILURE

    def build(steps: list[str], cut: int) -> str:
        body = "\n\n".join(steps)
        if cut:
            body = f"[{cut} earlier step(s) omitted]\n\n" + body
        head = _ANALYSIS_HEAD.format(description=description, task=task, outcome=outcome, length=len(rendered), steps=body)
        return head + (
            _ANALYSIS_TAIL.format(kind=kind)
        )

    text = build(rendered, 0)
    cut = 0
    while max_chars is not None and len(text) > max_chars and cut < len(rendered):
        cut += 1
        text = build(rendered[cut:], cut)
    return text


def analysis_turns(trajectory) -> list[dict]:
    """The per-step view the analysis prompt needs, from a Trajectory record."""
    return [{"observation": t.observation, "response": t.response, "valid": t.valid} for t in trajectory.turns]


def render_trajectory_analysis(trajectory, max_chars: int | None = None) -> str:
    """The analysis prompt of a Trajectory record, described for its own environment."""
    from seedcli.envs import get_env

    env = get_env(trajectory.env)
    return render_analysis_prompt(
        trajectory.task,
        trajectory.won,
        analysis_turns(trajectory),
        max_chars,
        description=env.analysis_description,
        score=trajectory.score,
    )


def tokenizer_corpus() -> list[str]:
    """Template text for training the tiny tokenizer, so prompt boilerplate compresses to few tokens."""
    sample_history = [("You arrive at countertop 1. On the countertop 1, you see a apple 1.", "take apple 1 from countertop 1")]
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
        [{"observation": "You arrive at sinkbasin 1.", "response": format_response("clean it", "clean apple 1 with sinkbasin 1"), "valid": True}],
    )
    failure = render_analysis_prompt("put a hot mug in cabinet.", False, [])
    skill = insert_skill(agent, "First find the object, take it, then go to the target receptacle and put it there.")
    return [agent, analysis, failure, skill, SCHEMA_REMINDER]
