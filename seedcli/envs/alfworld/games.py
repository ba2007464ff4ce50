"""Real ALFWorld games (the `alfworld` 0.4.2 package over TextWorld's PDDL engine): data root, splits, game
discovery and selection, and one game played in this process (`AlfWorldGame`, with its experts).

    root = resolve_data_root()                      # explicit path, $ALFWORLD_DATA, or ../shared/alfworld
    games = select_games(list_games(root, "unseen"), n=12, seed=0)
    with EnvPool(workers=2, expert=True) as pool:   # seedcli.envs.alfworld.env: many games in worker processes
        first = pool.reset_many([(slot, game) for slot, game in enumerate(games)])
        after = pool.step_many([(slot, r.expert_action) for slot, r in enumerate(first)])

The expert (`expert=True`) follows the game's stored walkthrough while the episode has kept to it (actions that
change nothing, such as `look`, `examine ...` or an inadmissible command, keep it on track): played from the start
it wins every valid_seen and valid_unseen game (bench/expert_check.py). After a state-changing deviation it hands
over to ALFWorld's hand-coded expert, which has watched every step: cheap, but not always right (after 3 random
actions it recovers in 96 of 134 unseen games within 30 steps; pick_two is its weak spot). Fast Downward's optimal
planner always recovers but needs 0.1-40 s per plan on kitchen games, so it is not used.

`expert="search"` skips the walkthrough: the hand-coded expert plays from the first step. It knows where nothing is
and searches the room (receptacles where the object class can be, opening closed ones), so its behaviour depends only
on what the agent can see: that is what `seed model init --warm-start expert` clones (a clone of the walkthrough
walks to where the object was in *its* game, and wins none of the others).

This module never imports torch; textworld and alfworld are imported lazily, after ALFWORLD_DATA is set.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import sys
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from seedcli.envs.base import StepResult, Task, find_data_root, select_balanced
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
_BANNER = "-= Welcome to TextWorld, ALFRED! =-"
_TASK_RE = re.compile(r"Your task is to:\s*(.*)")
# Commands that leave the walkthrough valid: they only mark things as "checked" in the PDDL domain.
_NEUTRAL_VERBS = ("look", "inventory", "help", "examine")


# ---------------------------------------------------------------------------------------------------------------
# Data root, splits, games
# ---------------------------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------------------------
# One game, in this process
# ---------------------------------------------------------------------------------------------------------------


_translations: OrderedDict[bytes, tuple] = OrderedDict()
_TRANSLATION_CACHE_SIZE = 24  # ~2 MB of SAS text each: a worker keeps the games of its recent groups
_parsed_templates: dict[tuple[str, str | None], list] = {}
_parsed_queries: dict[str, object] = {}
_PARSE_CACHE_SIZE = 50_000  # small entries; cleared when full (a long run meets many games' grammars)


def _install_speedups() -> None:
    """Memoise the pure, slow parts of TextWorld's PDDL engine, process-wide (outputs are unchanged; checked by
    replaying games with and without). Idempotent.

    - Fast Downward's PDDL->SAS translation, the bulk of a reset (1-3 s a game here). PddlEnv translates each game
      four times per start (at load and again at reset, each plain and "optimised for replanning"); one plain
      translation now serves all four and later resets of the same game. The replanning copy only feeds the
      optimal planner, which this module never calls (an unoptimised task is still a valid planning task).
    - The text grammar's template and condition parsing (tatsu), repeated for every admissible command at every
      step: steps get about 3x faster (90 -> 30 ms here)."""
    import copy

    import fast_downward
    import textworld.envs.pddl.textgen as textgen
    from textworld.logic import Rule

    if getattr(fast_downward.pddl2sas, "_seedcli_cached", False):
        return
    original_pddl2sas = fast_downward.pddl2sas

    def pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False):
        key = hashlib.sha1(domain.encode() + b"\0" + problem.encode()).digest()
        hit = _translations.get(key)
        if hit is None:
            argv = list(sys.argv)  # the translator overwrites sys.argv with its own; give the caller theirs back
            try:
                hit = original_pddl2sas(domain, problem, verbose=verbose, optimize=False)
            finally:
                sys.argv[:] = argv
            _translations[key] = hit
            while len(_translations) > _TRANSLATION_CACHE_SIZE:
                _translations.popitem(last=False)
        else:
            _translations.move_to_end(key)
        return hit

    original_parse = textgen._parse_and_convert

    def parse_and_convert(text, rule_name=None, **kwargs):
        if kwargs.get("trace"):
            return original_parse(text, rule_name=rule_name, **kwargs)
        key = (text, rule_name)
        symbols = _parsed_templates.get(key)
        if symbols is None:
            if len(_parsed_templates) >= _PARSE_CACHE_SIZE:
                _parsed_templates.clear()
            symbols = _parsed_templates[key] = original_parse(text, rule_name=rule_name)
        return copy.deepcopy(symbols)  # the grammar writes contexts into the symbols it gets

    original_query = Rule.parse_conjunctive_query.__func__

    def parse_conjunctive_query(cls, expr: str):
        rule = _parsed_queries.get(expr)
        if rule is None:
            if len(_parsed_queries) >= _PARSE_CACHE_SIZE:
                _parsed_queries.clear()
            rule = _parsed_queries[expr] = original_query(cls, expr)
        return rule  # only read (matched against the state)

    pddl2sas._seedcli_cached = True  # type: ignore[attr-defined]
    fast_downward.pddl2sas = pddl2sas
    textgen._parse_and_convert = parse_and_convert
    Rule.parse_conjunctive_query = classmethod(parse_conjunctive_query)


# expert=False: no expert; True or "walkthrough": the stored walkthrough, hand-coded fallback; "search": hand-coded only
EXPERT_MODES = (False, True, "walkthrough", "search")


class AlfWorldGame:
    """One ALFWorld game played in this process; one TextWorld environment is reused across resets."""

    def __init__(self, expert: bool | str = False, data_root: str | os.PathLike | None = None):
        if expert not in EXPERT_MODES:
            raise ValueError(f"expert must be one of {sorted(map(str, EXPERT_MODES))}, got {expert!r}")
        self.expert = bool(expert)
        self.search_only = expert == "search"
        self.data_root = data_root
        self._env = None
        self._path: Path | None = None
        self._task = ""
        self._admissible: list[str] = []
        self._won = False
        self._walkthrough: list[str] = []
        self._on_track = True
        self._wt_index = 0
        self._handcoded = None
        self._handcoded_next: str | None = None
        self._steps = 0

    def _build(self):
        resolve_data_root(self.data_root)  # sets ALFWORLD_DATA before alfworld is imported
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
        from textworld.envs.pddl import PddlEnv

        _install_speedups()
        # The hand-coded expert reads facts; everything else needs only these.
        infos = textworld.EnvInfos(won=True, admissible_commands=True, facts=self.expert)
        # shuffle=False: object numbers as in the stored walkthrough and ALFWorld's eval (no domain randomisation).
        return AlfredDemangler(shuffle=False)(PddlEnv(infos))

    def reset(self, game: Task | str | os.PathLike) -> StepResult:
        """Start `game` (a Game or the absolute path of a game.tw-pddl); the first observation has no banner."""
        path = game_path(game, self.data_root)
        if not path.is_file():
            raise UserError(f"ALFWorld game not found: {path}; check ALFWORLD_DATA / --data-root")
        if self._env is None:
            self._env = self._build()
        self._env.load(str(path))
        state = self._env.reset()
        self._path = path
        self._steps = 0
        feedback = state.feedback
        observation = feedback.replace(_BANNER, "", 1).strip()
        m = _TASK_RE.search(observation)
        self._task = m.group(1).strip() if m else ""
        if self.expert:
            self._walkthrough = [] if self.search_only else [str(a) for a in (self._env.unwrapped.walkthrough or [])]
            self._on_track, self._wt_index = not self.search_only, 0
            self._start_handcoded(path, feedback)
            if self.search_only:
                self._step_handcoded(state, "look")  # its first move (it is otherwise asked after each step)
        return self._result(state, observation)

    def step(self, action: str) -> StepResult:
        """Send `action` as given (an inadmissible one gets "Nothing happens.")."""
        if self._env is None or self._path is None:
            raise RuntimeError("AlfWorldGame.step() before reset()")
        admissible_before = self._admissible
        state, _, _ = self._env.step(action)
        self._steps += 1
        if self.expert:
            self._follow(action.strip(), admissible_before)
            self._step_handcoded(state, action)
        return self._result(state, state.feedback.strip())

    def close(self) -> None:
        """Release the TextWorld environment."""
        if self._env is not None:
            self._env.close()
            self._env = None

    # -- internals ------------------------------------------------------------------------------------------------

    def _result(self, state, observation: str) -> StepResult:
        self._admissible = [c for c in state["admissible_commands"] if c != "help"]
        self._won = bool(state["won"])
        return StepResult(
            observation=observation,
            admissible=list(self._admissible),
            won=self._won,
            done=self._won,
            task=self._task,
            expert_action=self._expert_action() if self.expert else None,
            reward=float(self._won),
            score=float(self._won),
        )

    def _follow(self, action: str, admissible_before: list[str]) -> None:
        """Keep the walkthrough pointer in step with the episode; a state-changing deviation ends it."""
        if not self._on_track:
            return
        if self._wt_index < len(self._walkthrough) and action == self._walkthrough[self._wt_index]:
            self._wt_index += 1
        elif action in admissible_before and action.split(" ", 1)[0] not in _NEUTRAL_VERBS:
            self._on_track = False

    def _expert_action(self) -> str | None:
        if self._won:
            return None
        if self._on_track and self._wt_index < len(self._walkthrough):
            planned = self._walkthrough[self._wt_index]
            if planned in self._admissible:
                return planned
        if self._handcoded_next and self._handcoded_next in self._admissible:
            return self._handcoded_next
        return "look"

    def _start_handcoded(self, path: Path, feedback: str) -> None:
        from alfworld.agents.expert import HandCodedTWAgent

        self._handcoded_next = None
        try:
            self._handcoded = HandCodedTWAgent(max_steps=10**9)
            self._handcoded.reset(str(path))  # reads traj_data.json beside the game file
            self._handcoded.observe(feedback)  # the banner tells it this is the room's intro
        except Exception:  # noqa: BLE001 - a fallback expert that cannot start just stays silent
            self._handcoded = None

    def _step_handcoded(self, state, action: str) -> None:
        # Runs every step, on or off the walkthrough: it builds its picture of the room from what it has seen.
        if self._handcoded is None:
            return
        # It breaks ties with the global `random`: seed it per game and step, and leave the caller's stream alone.
        saved = random.getstate()
        random.seed(f"{'/'.join(self._path.parts[-3:])}/{self._steps}")  # task/trial/file: same on every machine
        try:
            self._handcoded_next = self._handcoded.act(state, 0, state["won"], action)
        except Exception:  # noqa: BLE001 - HandCodedAgentFailed/Timeout: no suggestion from here on
            self._handcoded, self._handcoded_next = None, None
        finally:
            random.setstate(saved)
