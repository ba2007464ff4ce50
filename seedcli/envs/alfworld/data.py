"""ALFWorld's data: the data root, splits, game discovery and selection (no game engine is started).

    root = resolve_data_root()                      # explicit path, $ALFWORLD_DATA, or ../shared/alfworld
    games = select_games(list_games(root, "unseen"), n=12, seed=0)

A game is a `Game` task whose id is the path of its game.tw-pddl under the data root and whose category is its short
task type. This module never imports torch, textworld or alfworld.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from seedcli.envs.base import Task, find_data_root, select_balanced
from seedcli.errors import UserError

# Folder prefix of a game (text before the first "-") -> short task-type name, in ALFWorld's task-type order.
TASK_TYPES: dict[str, str] = {
    "pick_and_place_simple": "pick",
    "look_at_obj_in_light": "look",
    "pick_clean_then_place_in_recep": "clean",
    "pick_heat_then_place_in_recep": "heat",
    "pick_cool_then_place_in_recep": "cool",
    "pick_two_obj_and_place": "pick_two",
}
SHORT_TASK_TYPES: tuple[str, ...] = tuple(TASK_TYPES.values())

# Split name or alias -> folder under json_2.1.1/.
SPLITS: dict[str, str] = {
    "train": "train",
    "seen": "valid_seen",
    "valid_seen": "valid_seen",
    "unseen": "valid_unseen",
    "valid_unseen": "valid_unseen",
}

DATA_SUBDIR = "json_2.1.1"
GAME_FILE = "game.tw-pddl"


def resolve_split(name: str) -> str:
    """Folder name of a split given a name or alias (train, seen/valid_seen, unseen/valid_unseen)."""
    folder = SPLITS.get(str(name).strip().lower())
    if folder is None:
        raise UserError(f"unknown ALFWorld split {name!r}: use one of {', '.join(SPLITS)}")
    return folder


def _has_data(path: Path) -> bool:
    return (path / DATA_SUBDIR).is_dir()


def resolve_data_root(explicit: str | os.PathLike | None = None) -> Path:
    """The ALFWorld data folder (holding json_2.1.1/): `explicit`, else $ALFWORLD_DATA, else ../shared/alfworld
    next to the current directory or the repository. Sets $ALFWORLD_DATA to it, so alfworld never writes ~/.cache."""

    def missing(source: str, root: Path | None) -> str:
        download = "run `alfworld-download` on a connected machine"
        if source == "explicit":
            return f"ALFWorld data not found at {root} (no {DATA_SUBDIR}/ inside): pass the folder that holds {DATA_SUBDIR}/, or {download}"
        if source == "env":
            return f"ALFWorld data not found: ALFWORLD_DATA={root} has no {DATA_SUBDIR}/ inside; set ALFWORLD_DATA to the folder that holds it, or {download}"
        return f"ALFWorld data not found: set ALFWORLD_DATA=/path/to/alfworld (the folder holding {DATA_SUBDIR}/) or {download}"

    root = find_data_root(explicit, "ALFWORLD_DATA", "alfworld", _has_data, missing)
    os.environ["ALFWORLD_DATA"] = str(root)
    return root


@dataclass(frozen=True)
class Game(Task):
    """One ALFWorld game: its `task_id` is `game_file`, the path of its game.tw-pddl relative to the data root, and
    its `category` is the short task type."""

    @property
    def game_file(self) -> str:
        return self.task_id

    @property
    def task_type(self) -> str:
        return self.category

    def path(self, root: str | os.PathLike | None = None) -> Path:
        """Absolute path of the game file under `root` (default: `resolve_data_root()`)."""
        return resolve_data_root(root) / self.game_file


def game_path(game: Task | str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """Absolute path of a Game (under `root`) or of a path given directly."""
    if isinstance(game, Task):
        return resolve_data_root(root) / game.task_id
    return Path(game).expanduser().resolve()


def task_type_of(folder_name: str) -> str | None:
    """Short task type of a game folder name such as `pick_and_place_simple-Book-None-Desk-302`, or None."""
    return TASK_TYPES.get(folder_name.split("-", 1)[0])


def list_games(root: str | os.PathLike | None, split: str) -> list[Game]:
    """Every playable game of a split, sorted by name. Skips trials without game.tw-pddl, task folders of other
    types (movable receptacles, sliced objects) and games marked unsolvable, as ALFWorld's own loader does."""
    root = resolve_data_root(root)
    folder_name = resolve_split(split)
    folder = root / DATA_SUBDIR / folder_name
    games: list[Game] = []
    if folder.is_dir():
        for task_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
            task_type = task_type_of(task_dir.name)
            if task_type is None or "movable" in task_dir.name or "Sliced" in task_dir.name:
                continue
            for trial_dir in sorted(p for p in task_dir.iterdir() if p.is_dir()):
                game_file = trial_dir / GAME_FILE
                if not game_file.is_file() or not _is_solvable(game_file):
                    continue
                games.append(
                    Game(
                        task_id=game_file.relative_to(root).as_posix(),
                        category=task_type,
                        split=folder_name,
                        name=f"{task_dir.name}/{trial_dir.name}",
                    )
                )
    if not games:
        raise UserError(
            f"no ALFWorld games in {folder}: point ALFWORLD_DATA at complete data "
            f"({DATA_SUBDIR}/{folder_name}/<task>/<trial>/{GAME_FILE}) or run `alfworld-download`"
        )
    return games


_SOLVABLE_RE = re.compile(rb'"solvable"\s*:\s*(true|false)')


def _is_solvable(game_file: Path) -> bool:
    # A regex over the bytes instead of json.load: list_games runs at every stage start and files are ~70 kB each.
    m = _SOLVABLE_RE.search(game_file.read_bytes())
    return m is not None and m.group(1) == b"true"


def select_games(games: Sequence[Game], n: int, seed: int, task_types: Sequence[str] | None = None) -> list[Game]:
    """Up to `n` games balanced over task types (n=180 over six types -> 30 each), deterministic in `seed`.
    Within a type the games are shuffled by the seed; the result interleaves types round-robin, so every prefix is
    balanced too. A type with too few games gives all it has and the others fill in; check len() of the result."""
    if n < 0:
        raise UserError(f"number of games must be >= 0, got {n}")
    if task_types is not None:
        unknown = [t for t in task_types if t not in SHORT_TASK_TYPES]
        if unknown:
            raise UserError(
                f"unknown task type(s) {', '.join(map(repr, unknown))}: use any of {', '.join(SHORT_TASK_TYPES)}"
            )
    return select_balanced(games, n, seed, SHORT_TASK_TYPES, task_types)  # type: ignore[return-value]
