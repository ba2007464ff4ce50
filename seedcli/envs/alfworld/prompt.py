"""ALFWorld's text: the agent's turn prompt (versioned), the analysis prompt's first sentence, and the text the tiny
tokenizer learns (the rendered templates, and sentences shaped like the games' own text read off the game files).

The skill block and the analysis prompt are shared by every environment (`seedcli.prompts`); what is ALFWorld's
own lives here, as every environment's lives in its package. Bump `AGENT_PROMPT_VERSION` whenever the rendered
text changes: every record stores the version that produced it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from functools import lru_cache
from pathlib import Path

from seedcli.envs.alfworld.data import DATA_SUBDIR, GAME_FILE
from seedcli.envs.alfworld.projection import format_response
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
    """The user message of one turn (docs/design.md §2). `step` counts from 1; `history` holds (observation, action)
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
    """The skill-augmented prompt: the skill block goes right after the task line (docs/design.md §1, Stage 2 step 3).
    Other environments: `get_env(name).insert_skill` (their task line differs)."""
    return insert_after_line(prompt, task_line_prefix, skill)


def template_texts() -> list[str]:
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


# valid_seen and valid_unseen are complete in every copy of the data (the shared subset and a full download alike),
# so the tiny tokenizer comes out the same everywhere; train games differ between copies.
CORPUS_SPLITS = ("valid_seen", "valid_unseen")


@lru_cache(maxsize=4)
def sample_texts(root: str) -> tuple[str, ...]:
    """Sentences shaped like the games' observations, admissible actions and tasks, from every game file of the
    `CORPUS_SPLITS` under the data root `root`."""
    texts: list[str] = []
    for split in CORPUS_SPLITS:
        for game in sorted(Path(root).glob(f"{DATA_SUBDIR}/{split}/*/*/{GAME_FILE}")):
            texts.extend(_game_texts(game))
    return tuple(texts)


_TYPE_RE = re.compile(r"\((receptacleType|objectType) (\S+) (\w+)Type\)")
_IN_RE = re.compile(r"\(inReceptacle (\S+) (\S+)\)")
_RHS_RE = re.compile(r'"rhs": "((?:[^"\\]|\\.)*)"')


def _game_texts(game_path: Path) -> Iterator[str]:
    """Sentences shaped like the text-game's observations, admissible actions and task, derived from one game file."""
    game = json.loads(game_path.read_text(encoding="utf-8"))
    for rhs in _RHS_RE.findall(game.get("grammar", "")):
        yield rhs.replace("\\n", "\n")
    names: dict[str, str] = {}
    kinds: dict[str, str] = {}
    counts: dict[str, int] = {}
    for kind, ident, type_name in _TYPE_RE.findall(game.get("pddl_problem", "")):
        base = type_name.lower()
        counts[base] = counts.get(base, 0) + 1
        names[ident] = f"{base} {counts[base]}"
        kinds[ident] = kind
    receptacles = [n for i, n in names.items() if kinds[i] == "receptacleType"]
    objects = [n for i, n in names.items() if kinds[i] == "objectType"]
    if receptacles:
        yield (
            "You are in the middle of a room. Looking quickly around you, you see "
            + ", ".join(f"a {r}" for r in receptacles)
            + "."
        )
    contents: dict[str, list[str]] = {}
    for obj, rec in _IN_RE.findall(game.get("pddl_problem", "")):
        if obj in names and rec in names:
            contents.setdefault(names[rec], []).append(names[obj])
    for rec, objs in contents.items():
        yield f"You arrive at {rec}. On the {rec}, you see " + ", ".join(f"a {o}" for o in objs) + "."
        yield ", ".join([f"go to {rec}", *(f"take {o} from {rec}" for o in objs), "inventory", "look"])
    for obj in objects[:8]:
        yield f"You pick up the {obj}. You move the {obj} to the {receptacles[0] if receptacles else 'countertop 1'}."
    yield ", ".join(game.get("walkthrough", []))
    traj_path = game_path.with_name("traj_data.json")
    if traj_path.exists():
        traj = json.loads(traj_path.read_text(encoding="utf-8"))
        for ann in traj.get("turk_annotations", {}).get("anns", []):
            yield ann.get("task_desc", "")
            yield " ".join(ann.get("high_descs", []))
