"""ALFWorld on the environment protocol (`seedcli.envs.base`): `AlfWorldEnv`, which stages reach as
`get_env("alfworld")` and never import; `EnvPool`, ALFWorld game slots in worker processes with the pool's old
signature; and the game text that trains the tiny models' tokenizer.

This module never imports torch.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

from seedcli.envs.alfworld.games import (
    EXPERT_MODES,
    SHORT_TASK_TYPES,
    SPLITS,
    TASK_TYPES,
    AlfWorldGame,
    game_path,
    list_games,
    resolve_data_root,
    select_games,
)
from seedcli.envs.alfworld.prompt import (
    AGENT_PROMPT_VERSION,
    ALFWORLD_ANALYSIS_DESCRIPTION,
    TASK_LINE_PREFIX,
    render_agent_prompt,
    tokenizer_corpus,
)
from seedcli.envs.base import Environment, StepResult, Task, parse_think_action
from seedcli.envs.pool import EnvPool as _GenericPool
from seedcli.errors import UserError

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------------
# The environment protocol (seedcli.envs.base)
# ---------------------------------------------------------------------------------------------------------------


class AlfWorldEnv(Environment):
    """ALFWorld on the environment protocol: tasks are games, categories the six task types."""

    name = "alfworld"
    title = "ALFWorld"
    max_steps = 30
    history = 5
    success_reward = 10.0
    invalid_penalty = 0.1
    advantage_norm = "mean_std"
    splits = SPLITS
    train_split = "train"
    eval_splits = ("valid_unseen", "valid_seen")
    val_split = "valid_seen"
    categories = SHORT_TASK_TYPES
    category_names = {
        "pick": "Pick",
        "look": "Look",
        "clean": "Clean",
        "heat": "Heat",
        "cool": "Cool",
        "pick_two": "Pick Two",
    }
    category_aliases = {**{k: v for k, v in TASK_TYPES.items()}, "pick2": "pick_two"}
    category_label = "task type"
    task_noun = "game"
    metric_labels = {"macro_success": "macro success", "micro_success": "micro success"}
    paper_note = "The design card gives only the paper's macro averages; per-type paper numbers are not shown rather than guessed."
    # Paper results (Qwen2.5-3B-Instruct), DESIGN.md §1, as fractions; only the macro-average is given.
    paper_results = {
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
    }
    expert_modes = EXPERT_MODES
    prompt_version = AGENT_PROMPT_VERSION
    task_line_prefix = TASK_LINE_PREFIX
    analysis_description = ALFWORLD_ANALYSIS_DESCRIPTION

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
        return render_agent_prompt(task, observation, admissible or [], step, history, history_length)

    def parse_action(self, response: str) -> tuple[str, bool]:
        return parse_think_action(response)

    def expert_response(self, result: StepResult) -> str:
        # An expert with nothing to suggest looks around (a neutral command).
        return self.format_response("I follow the expert plan.", result.expert_action or "look")

    def random_response(self, result: StepResult, rng: random.Random) -> str:
        choices = [a for a in (result.admissible or []) if a != "help"] or ["look"]
        return self.format_response("I pick a random admissible action.", rng.choice(choices))

    def rules_skill(self, trajectory) -> tuple[str, str]:
        from seedcli.envs.alfworld.rules import rules_skill

        return rules_skill(trajectory)

    def leaks(self, trajectory, skill: str) -> list[tuple[int, int]]:
        """Spans of `skill` naming a numbered receptacle or object ("drawer 3", "mug 1") that this episode's
        observations or actions name (`rules.instance_spans`)."""
        from seedcli.envs.alfworld.rules import instance_spans

        return instance_spans(trajectory, skill)

    def sample_texts(self) -> list[str]:
        try:
            root = resolve_data_root(self.data_root)
        except UserError as err:
            logger.warning(
                "tiny tokenizer trained without ALFWorld text (%s); prompts will tokenize less compactly", err
            )
            return []
        return list(_alfworld_texts(str(root)))

    def template_texts(self) -> list[str]:
        return tokenizer_corpus()


# ---------------------------------------------------------------------------------------------------------------
# Many games in worker processes
# ---------------------------------------------------------------------------------------------------------------


class EnvPool(_GenericPool):
    """ALFWorld game slots hosted by `workers` worker processes (`seedcli.envs.pool.EnvPool` with ALFWorld's old
    signature). reset_many takes Games or paths of game.tw-pddl files."""

    def __init__(
        self,
        workers: int,
        expert: bool | str = False,
        data_root: str | os.PathLike | None = None,
        timeout_s: float = 300.0,
    ):
        self.data_root = resolve_data_root(data_root)
        super().__init__(
            AlfWorldEnv(data_root=str(self.data_root)),
            workers,
            expert=expert,
            timeout_s=timeout_s,
            worker_environ={"ALFWORLD_DATA": str(self.data_root)},
        )

    def _task_arg(self, task):
        return task if isinstance(task, Task) else str(game_path(task, self.data_root))


# ----------------------------------------------------------------------------------------- text for the tiny tokenizer


# valid_seen and valid_unseen are complete in every copy of the data (the shared subset and a full download alike),
# so the tiny tokenizer comes out the same everywhere; train games differ between copies.
CORPUS_SPLITS = ("valid_seen", "valid_unseen")


@lru_cache(maxsize=4)
def _alfworld_texts(root: str) -> tuple[str, ...]:
    texts: list[str] = []
    for split in CORPUS_SPLITS:
        for game in sorted(Path(root).glob(f"json_2.1.1/{split}/*/*/game.tw-pddl")):
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
