"""Sokoban's text: verl-agent's Sokoban templates character for character (text, with and without history, and the
visual one), the turn prompt built from them, the analysis prompt's first sentence, and the tiny tokenizer's text.

In `text` mode the agent sees the grid (`# _ O √ X P S`) with the last `history` observation/action pairs; in `image`
mode the visual template, whose one `<image>` is the room (`StepResult.image`), and no history, as verl-agent's
visual template has none. Bump `PROMPT_VERSION` whenever the rendered text changes.
"""

from __future__ import annotations

from collections.abc import Sequence

from seedcli.envs.sokoban.game import Sokoban

PROMPT_VERSION = "sokoban-v1"  # bump whenever the prompt text changes
TASK_LINE_PREFIX = "Your goal is to push all the boxes"  # the skill block goes after this line (text and image)
TASK = "push all the boxes"  # the task of every room, as the goal line of both templates says
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


def render_prompt(
    observation_mode: str, observation: str, step: int, history: Sequence[tuple[str, str]], history_length: int
) -> str:
    """The user message of turn `step` (1-based): the visual template in `image` mode; else the text template with
    the grid `observation`, and the last `history_length` of the earlier (observation, action) pairs from turn 2 on."""
    if observation_mode == "image":
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


def template_texts() -> list[str]:
    """The rendered templates the tiny tokenizer learns (a first turn, the visual prompt, a turn with history)."""
    room = Sokoban(0, dim=(6, 6)).text()
    texts = [SOKOBAN_TEMPLATE_NO_HIS.format(current_observation=room), SOKOBAN_VISUAL_TEMPLATE]
    text, shown = render_history([(room, "up"), (room, "left")], 2)
    texts.append(
        SOKOBAN_TEMPLATE.format(
            step_count=2, history_length=shown, action_history=text, current_step=3, current_observation=room
        )
    )
    return texts


def sample_texts() -> list[str]:
    """First-turn prompts of eight rooms (seeds 0-7): grids as the agent sees them, for the tiny tokenizer."""
    return [SOKOBAN_TEMPLATE_NO_HIS.format(current_observation=Sokoban(s).text()) for s in range(8)]
