"""Versioned prompt text every environment shares: the skill block of the skill-augmented prompt, and the analysis
prompt (annotate, sft and rl render it for every environment).

Each environment renders its own agent prompt (`Environment.render_prompt`, in `seedcli/envs/<name>/`); the analysis
prompt opens with the environment's `analysis_description`, which its callers hand in. Nothing here imports an
environment: environments import this module, never the reverse.

Every record stores the version of the template that produced it, so a changed template never silently mixes with
old data: bump the version whenever the rendered text changes.
"""

from __future__ import annotations

from collections.abc import Iterable

ANALYSIS_PROMPT_VERSION = "analysis-v1"
# the analysis prompt of an episode played from images (Sokoban, EZPoints with `observation: image`), after the SEED
# code's `seed_visual` version: every step's observation is an image placeholder, the images travel with the prompt
ANALYSIS_VISUAL_PROMPT_VERSION = "analysis-visual-v1"
ANALYSIS_PROMPT_VERSIONS = (ANALYSIS_PROMPT_VERSION, ANALYSIS_VISUAL_PROMPT_VERSION)

IMAGE_PLACEHOLDER = "<image>"  # where an image goes in a user message's text (the images travel alongside, in order)

SKILL_HEADING = "Episode-Level Skill"
SKILL_INSTRUCTION = "Use the following skill, learned in hindsight from this kind of task, to choose your actions."


def insert_after_line(prompt: str, prefix: str, skill: str) -> str:
    """`prompt` with the skill block inserted after the line holding `prefix` (the first one): the skill-augmented
    prompt (DESIGN.md §1, Stage 2 step 3); each environment names its task line (`Environment.insert_skill`)."""
    start = prompt.find(prefix)
    if start < 0:
        raise ValueError("prompt has no task line to insert a skill after")
    end = prompt.find("\n", start)
    end = len(prompt) if end < 0 else end + 1
    block = f"\n## {SKILL_HEADING}\n{SKILL_INSTRUCTION}\n{skill.strip()}\n\n"
    return prompt[:end] + block + prompt[end:]


# ---------------------------------------------------------------------------------------------------------------
# Analysis prompt (annotate, sft and rl share it)

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
    description: str,
    score: float | None = None,
    visual: bool = False,
) -> str:
    """The analyzer's user message for one finished episode. `turns` yields dicts with `observation`, `response` and
    `valid`. With `max_chars`, the oldest steps are dropped first (the prompt keeps the task and outcome) and a
    line says how many were cut — used by sft to fit `--max-length`. `description` is the environment's
    `analysis_description`; a fractional `score` (strictly between 0 and 1) is shown with the outcome.

    `visual`: the episode was played from images, and every step's observation is the `<image>` placeholder (the
    SEED code's `seed_visual` prompt); a placeholder anywhere else (the task, a reply) is written `[image]`, so the
    prompt's placeholders are exactly its steps, in order."""
    rendered = []
    for i, turn in enumerate(turns, start=1):
        validity = "valid" if turn["valid"] else "INVALID (format error)"
        observation, response = turn["observation"], turn["response"]
        if visual:
            observation, response = IMAGE_PLACEHOLDER, response.replace(IMAGE_PLACEHOLDER, "[image]")
        rendered.append(f"Step {i}\nObservation: {observation}\nAgent response ({validity}): {response}")
    if visual:
        task = task.replace(IMAGE_PLACEHOLDER, "[image]")
    outcome = "SUCCESS" if won else "FAILURE"
    if score is not None and 0.0 < score < 1.0:
        outcome += f" (score {score:.2f} of 1)"
    kind = _KIND_SUCCESS if won else _KIND_FAILURE

    def build(steps: list[str], cut: int) -> str:
        body = "\n\n".join(steps)
        if cut:
            body = f"[{cut} earlier step(s) omitted]\n\n" + body
        head = _ANALYSIS_HEAD.format(
            description=description, task=task, outcome=outcome, length=len(rendered), steps=body
        )
        if visual:
            head = head.replace("Episode:\n", _VISUAL_NOTE + "Episode:\n", 1)
        return head + (_ANALYSIS_TAIL.format(kind=kind))

    text = build(rendered, 0)
    cut = 0
    while max_chars is not None and len(text) > max_chars and cut < len(rendered):
        cut += 1
        text = build(rendered[cut:], cut)
    return text


_VISUAL_NOTE = "Each step's observation is the image the agent saw at that step.\n\n"


def is_visual(trajectory) -> bool:
    """Whether a Trajectory record was played from images: every turn refers to its observation image. An episode
    with images on some turns only cannot be analysed either way (a step would be missing), so it is an error."""
    with_image = [t.image is not None for t in trajectory.turns]
    if any(with_image) and not all(with_image):
        missing = with_image.index(False) + 1
        raise ValueError(
            f"episode {trajectory.episode_id}: step {missing} has no observation image but other steps do; the "
            "visual analysis prompt needs an image for every step"
        )
    return bool(with_image) and all(with_image)


def analysis_version(trajectory) -> str:
    """The analysis prompt version a Trajectory record is rendered with (visual when it was played from images)."""
    return ANALYSIS_VISUAL_PROMPT_VERSION if is_visual(trajectory) else ANALYSIS_PROMPT_VERSION


def analysis_images(trajectory, prompt: str) -> list[str]:
    """The sha256 of each image `prompt` (the trajectory's rendered analysis prompt) shows, in order: one per step it
    kept (a cut prompt drops the oldest steps, and their images)."""
    shown = prompt.count(IMAGE_PLACEHOLDER)
    if not shown or not is_visual(trajectory):  # a text episode's "<image>" is text someone wrote
        return []
    return [t.image for t in trajectory.turns[len(trajectory.turns) - shown :]]


def analysis_turns(trajectory) -> list[dict]:
    """The per-step view the analysis prompt needs, from a Trajectory record."""
    return [{"observation": t.observation, "response": t.response, "valid": t.valid} for t in trajectory.turns]


def render_trajectory_analysis(trajectory, max_chars: int | None = None, *, description: str) -> str:
    """The analysis prompt of a Trajectory record; `description` is the `analysis_description` of the environment
    the trajectory was played in (`trajectory.env`). An episode played from images gets the visual prompt, whose
    images are `analysis_images(trajectory, prompt)`."""
    return render_analysis_prompt(
        trajectory.task,
        trajectory.won,
        analysis_turns(trajectory),
        max_chars,
        description=description,
        score=trajectory.score,
        visual=is_visual(trajectory),
    )
