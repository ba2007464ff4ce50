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

# every `--analyzer oracle` skill starts with this: privileged information (the expert's knowledge of the task), not a
# skill the policy could have written; the leak audit flags it whole (seedcli/skill_leaks.py)
ORACLE_PREFIX = "Privileged (oracle): "
SKILL_HEADING = "Episode-Level Skill"
SKILL_INSTRUCTION = "Use the following skill, learned in hindsight from this kind of task, to choose your actions."

# step skills (`seed rl --skill_mode episode_step | step_only`): the SEED code's "Critical-Step Skill" section, which
# goes before the line that asks for the turn's answer (`seed/prompting.py: build_augmented_observation_text`)
STEP_SKILL_HEADING = "Critical-Step Skill"
STEP_SKILL_INSTRUCTION = "Use this current-step skill for this decision only."
STEP_SKILL_ANCHOR = "Now it's your turn"
SKILL_MODES = ("episode_only", "episode_step", "step_only")


def insert_after_line(prompt: str, prefix: str, skill: str) -> str:
    """`prompt` with the skill block inserted after the line holding `prefix` (the first one): the skill-augmented
    prompt (docs/design.md §1, Stage 2 step 3); each environment names its task line (`Environment.insert_skill`)."""
    start = prompt.find(prefix)
    if start < 0:
        raise ValueError("prompt has no task line to insert a skill after")
    end = prompt.find("\n", start)
    end = len(prompt) if end < 0 else end + 1
    block = f"\n## {SKILL_HEADING}\n{SKILL_INSTRUCTION}\n{skill.strip()}\n\n"
    return prompt[:end] + block + prompt[end:]


def insert_step_skill(prompt: str, skill: str, anchor: str = STEP_SKILL_ANCHOR) -> str:
    """`prompt` with the step-skill block inserted before the line holding `anchor` (every environment's "Now it's
    your turn ..." line), or appended at the end of a prompt without one, as the SEED code does."""
    block = f"## {STEP_SKILL_HEADING}\n{STEP_SKILL_INSTRUCTION}\n{skill.strip()}\n"
    at = prompt.find(anchor)
    if at < 0:
        return prompt.rstrip("\n") + "\n\n" + block.rstrip("\n")
    start = prompt.rfind("\n", 0, at) + 1  # the start of the anchor's line
    return prompt[:start] + block + "\n" + prompt[start:]


# ---------------------------------------------------------------------------------------------------------------
# Analysis prompt (annotate, sft and rl share it)

_ANALYSIS_HEAD = (
    "{description} Read the episode "
    "below and extract one hindsight skill the agent should use next time it faces this kind of task.\n\n"
    "Task: {task}\n"
    "Outcome: {outcome} after {length} step(s).\n\n"
    "Episode:\n{steps}\n\n"
)

# the pieces of the answer request; the episode-only tail and the step-skill tails below are made of them
_RULE_LINE = "Write the skill as one short, policy-facing rule, not a retrospective. {kind}\n"
_ANSWER_LINE = "Answer with JSON only, exactly this object and nothing else:\n"
_SUMMARY_FIELD = '"episode_summary": "<two sentences on what happened>"'
_SKILL_FIELD = '"episode_skill": "<the rule>"'
_ANALYSIS_TAIL = _RULE_LINE + _ANSWER_LINE + "{{" + _SUMMARY_FIELD + ", " + _SKILL_FIELD + "}}"

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

# the step-skill variants (skill_mode episode_step / step_only) of the analysis prompt's request and reminder; the
# steps are named by the numbers the prompt shows them with (from 1)
ANALYSIS_STEP_PROMPT_VERSION = "analysis-step-v1"
ANALYSIS_VISUAL_STEP_PROMPT_VERSION = "analysis-visual-step-v1"

_STEP_REQUEST = (
    "at most {count} critical step(s) of the episode and write a step skill for each: one short imperative sentence "
    "of advice the agent can act on at that step, inferred from the whole episode; policy-facing, not a "
    "retrospective. Name each step by its number above.\n" + _ANSWER_LINE
)
_STEP_FIELD = '"step_skills": {{"<step number>": "<advice for that step>"}}'
_EPISODE_STEP_TAIL = (
    _RULE_LINE + "Also pick " + _STEP_REQUEST + "{{" + ", ".join((_SUMMARY_FIELD, _SKILL_FIELD, _STEP_FIELD)) + "}}"
)
_STEP_ONLY_TAIL = "Pick " + _STEP_REQUEST + "{{" + _SUMMARY_FIELD + ", " + _STEP_FIELD + "}}"
_STEP_ONLY_GOAL = "extract hindsight skills for its critical steps"
_EPISODE_GOAL = "extract one hindsight skill the agent should use next time it faces this kind of task"

STEP_SCHEMA_REMINDER = (
    "Your previous answer could not be parsed. Reply with a single JSON object with the fields "
    '"episode_summary" (a string), "episode_skill" (a string of at least five words) and "step_skills" (an object '
    "from step number to one sentence of advice), and nothing else."
)
STEP_ONLY_SCHEMA_REMINDER = (
    "Your previous answer could not be parsed. Reply with a single JSON object with the fields "
    '"episode_summary" (a string) and "step_skills" (an object from step number to one sentence of advice), and '
    "nothing else."
)


def schema_reminder(skill_mode: str = "episode_only") -> str:
    """The retry's schema reminder for the JSON `skill_mode` asks for."""
    return {"episode_step": STEP_SCHEMA_REMINDER, "step_only": STEP_ONLY_SCHEMA_REMINDER}.get(
        skill_mode, SCHEMA_REMINDER
    )


def analysis_prompt_version(visual: bool, skill_mode: str = "episode_only") -> str:
    """The version of the analysis prompt rendered for a (visual) episode under `skill_mode`."""
    if skill_mode == "episode_only":
        return ANALYSIS_VISUAL_PROMPT_VERSION if visual else ANALYSIS_PROMPT_VERSION
    return ANALYSIS_VISUAL_STEP_PROMPT_VERSION if visual else ANALYSIS_STEP_PROMPT_VERSION


def render_analysis_prompt(
    task: str,
    won: bool,
    turns: Iterable[dict],
    max_chars: int | None = None,
    *,
    description: str,
    score: float | None = None,
    visual: bool = False,
    skill_mode: str = "episode_only",
    max_step_skills: int = 0,
) -> str:
    """The analyzer's user message for one finished episode. `turns` yields dicts with `observation`, `response` and
    `valid`. With `max_chars`, the oldest steps are dropped first (the prompt keeps the task and outcome) and a
    line says how many were cut — used by sft to fit `--max-length`. `description` is the environment's
    `analysis_description`; a fractional `score` (strictly between 0 and 1) is shown with the outcome.

    `visual`: the episode was played from images, and every step's observation is the `<image>` placeholder (the
    SEED code's `seed_visual` prompt); a placeholder anywhere else (the task, a reply) is written `[image]`, so the
    prompt's placeholders are exactly its steps, in order.

    `skill_mode` episode_step also asks for up to `max_step_skills` step skills (`step_skills`, keyed by the step
    numbers shown), step_only for the step skills instead of the episode skill (`analysis-step-v1`); episode_only
    is `analysis-v1`, unchanged."""
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
        if skill_mode == "episode_only":
            return head + (_ANALYSIS_TAIL.format(kind=kind))
        count = min(max_step_skills, len(rendered))  # as the SEED code: at most the cap, at most the steps
        if skill_mode == "step_only":
            return head.replace(_EPISODE_GOAL, _STEP_ONLY_GOAL, 1) + _STEP_ONLY_TAIL.format(count=count)
        return head + _EPISODE_STEP_TAIL.format(kind=kind, count=count)

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


def render_trajectory_analysis(
    trajectory,
    max_chars: int | None = None,
    *,
    description: str,
    skill_mode: str = "episode_only",
    max_step_skills: int = 0,
) -> str:
    """The analysis prompt of a Trajectory record; `description` is the `analysis_description` of the environment
    the trajectory was played in (`trajectory.env`). An episode played from images gets the visual prompt, whose
    images are `analysis_images(trajectory, prompt)`. `skill_mode` and `max_step_skills`: as `render_analysis_prompt`."""
    return render_analysis_prompt(
        trajectory.task,
        trajectory.won,
        analysis_turns(trajectory),
        max_chars,
        description=description,
        score=trajectory.score,
        visual=is_visual(trajectory),
        skill_mode=skill_mode,
        max_step_skills=max_step_skills,
    )
