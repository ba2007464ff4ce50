"""Real ALFWorld games (the `alfworld` 0.4.2 package over TextWorld's PDDL engine), one at a time or in a pool.

    root = resolve_data_root()                      # explicit path, $ALFWORLD_DATA, or ../shared/alfworld
    games = select_games(list_games(root, "unseen"), n=12, seed=0)
    with EnvPool(workers=2, expert=True) as pool:
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
import signal
import subprocess
import sys
import time
import traceback
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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
_REPO_ROOT = Path(__file__).resolve().parents[2]


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
    if explicit is not None and str(explicit) != "":
        root = Path(explicit).expanduser()
        if not _has_data(root):
            raise UserError(
                f"ALFWorld data not found at {root} (no {DATA_SUBDIR}/ inside): pass the folder that holds "
                f"{DATA_SUBDIR}/, or run `alfworld-download` on a connected machine"
            )
    elif os.environ.get("ALFWORLD_DATA"):
        root = Path(os.environ["ALFWORLD_DATA"]).expanduser()
        if not _has_data(root):
            raise UserError(
                f"ALFWorld data not found: ALFWORLD_DATA={root} has no {DATA_SUBDIR}/ inside; set ALFWORLD_DATA "
                "to the folder that holds it, or run `alfworld-download` on a connected machine"
            )
    else:
        candidates = [Path.cwd().parent / "shared" / "alfworld", _REPO_ROOT.parent / "shared" / "alfworld"]
        root = next((c for c in candidates if _has_data(c)), None)
        if root is None:
            raise UserError(
                f"ALFWorld data not found: set ALFWORLD_DATA=/path/to/alfworld (the folder holding {DATA_SUBDIR}/) "
                "or run `alfworld-download` on a connected machine"
            )
    root = root.resolve()
    os.environ["ALFWORLD_DATA"] = str(root)
    return root


@dataclass(frozen=True)
class Game:
    """One ALFWorld game: `game_file` is the path of its game.tw-pddl relative to the data root."""

    game_file: str
    split: str
    task_type: str
    name: str

    def path(self, root: str | os.PathLike | None = None) -> Path:
        """Absolute path of the game file under `root` (default: `resolve_data_root()`)."""
        return resolve_data_root(root) / self.game_file


def game_path(game: Game | str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """Absolute path of a Game (under `root`) or of a path given directly."""
    if isinstance(game, Game):
        return game.path(root)
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
                        game_file=game_file.relative_to(root).as_posix(),
                        split=folder_name,
                        task_type=task_type,
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
    wanted = [t for t in SHORT_TASK_TYPES if task_types is None or t in task_types]
    by_type: dict[str, list[Game]] = {t: [] for t in wanted}
    for g in sorted(games, key=lambda g: (g.name, g.split, g.game_file)):
        if g.task_type in by_type:
            by_type[g.task_type].append(g)
    for t, pool in by_type.items():
        random.Random(f"{seed}/{t}").shuffle(pool)
    types = [t for t in wanted if by_type[t]]

    # Water-filling: equal quotas (remainder to the first types in TASK_TYPES order), capped by what a type has.
    quota = {t: 0 for t in types}
    left = min(n, sum(len(by_type[t]) for t in types))
    while left > 0:
        open_types = [t for t in types if quota[t] < len(by_type[t])]
        share, extra = divmod(left, len(open_types))
        for i, t in enumerate(open_types):
            take = min(share + (1 if i < extra else 0), len(by_type[t]) - quota[t])
            quota[t] += take
            left -= take

    chosen = {t: by_type[t][: quota[t]] for t in types}
    out: list[Game] = []
    for r in range(max(quota.values(), default=0)):
        out.extend(chosen[t][r] for t in types if r < len(chosen[t]))
    return out


# ---------------------------------------------------------------------------------------------------------------
# One game, in this process
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class StepResult:
    """What the agent sees after a reset or a step."""

    observation: str
    admissible: list[str]  # admissible commands, without "help"
    won: bool
    done: bool  # the game is over (won); the step limit is the caller's
    task: str  # text after "Your task is to: "
    expert_action: str | None = None  # next action of the expert (expert=True only; None once won)


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

    def reset(self, game: Game | str | os.PathLike) -> StepResult:
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


# ---------------------------------------------------------------------------------------------------------------
# Many games in worker processes
# ---------------------------------------------------------------------------------------------------------------


def _worker_main(fd: int, expert: bool | str) -> None:
    """Worker loop: serve ("reset", [(slot, path)]) / ("step", [(slot, action)]) / ("close",) over connection `fd`."""
    from multiprocessing.connection import Connection

    # Ctrl-C reaches the whole process group: the parent handles it and closes the pool; no worker tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Anything printed by textworld or Fast Downward's C++ code goes to stderr, never into the parent's stdout.
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    conn = Connection(fd)
    games: dict[int, AlfWorldGame] = {}
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        kind = msg[0]
        if kind == "close":
            for g in games.values():
                g.close()
            conn.send(("ok", None))
            return
        out = []
        for slot, arg in msg[1]:
            try:
                if kind == "reset":
                    game = games.get(slot)
                    if game is None:
                        game = games[slot] = AlfWorldGame(expert=expert)
                    out.append(game.reset(arg))
                else:
                    if slot not in games:
                        raise RuntimeError(f"slot {slot} has no game: reset_many() it first")
                    out.append(games[slot].step(arg))
            except Exception as e:  # noqa: BLE001 - reported to the parent, which raises with the game's name
                conn.send(("error", slot, type(e).__name__, str(e), traceback.format_exc()))
                break
        else:
            conn.send(("ok", out))


class _Worker:
    def __init__(self, index: int, expert: bool | str, data_root: Path):
        import multiprocessing

        self.index = index
        self.conn, child = multiprocessing.Pipe()
        env = dict(os.environ)
        env["ALFWORLD_DATA"] = str(data_root)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH")) if p)
        env.setdefault("OMP_NUM_THREADS", "1")
        code = f"from seedcli.envs.alfworld import _worker_main; _worker_main({child.fileno()}, {expert!r})"
        # A fresh interpreter (not fork, not multiprocessing's spawn, which re-imports the parent's __main__ and
        # with it torch): the worker imports only this module, textworld and alfworld.
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL
        )
        child.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()


def _shutdown(workers: list[_Worker]) -> None:
    for w in workers:
        try:
            if w.proc.poll() is None:
                w.conn.send(("close",))
        except (OSError, BrokenPipeError):
            pass
    deadline = time.monotonic() + 5.0
    for w in workers:
        try:
            w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        w.kill()


class EnvPool:
    """Game slots hosted by `workers` worker processes (slot -> worker `slot % workers`; workers=0: this process).

    reset_many / step_many run each worker's requests in parallel with the other workers' and return results in
    input order. A worker that dies or exceeds `timeout_s` seconds per request raises RuntimeError naming the game."""

    def __init__(
        self,
        workers: int,
        expert: bool | str = False,
        data_root: str | os.PathLike | None = None,
        timeout_s: float = 300.0,
    ):
        if workers < 0:
            raise UserError(f"env workers must be >= 0, got {workers}")
        self.workers = workers
        self.expert = expert
        self.timeout_s = timeout_s
        self.data_root = resolve_data_root(data_root)
        self._slot_game: dict[int, str] = {}
        self._local: dict[int, AlfWorldGame] = {}
        self._procs: list[_Worker] = [_Worker(i, expert, self.data_root) for i in range(workers)]
        self._finalizer = weakref.finalize(self, _shutdown, self._procs)

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def reset_many(self, items: Sequence[tuple[int, Game | str | os.PathLike]]) -> list[StepResult]:
        """Start a game in each slot (a slot's previous game is dropped)."""
        requests = []
        for slot, game in items:
            self._slot_game[slot] = game.name if isinstance(game, Game) else str(game)
            requests.append((slot, str(game_path(game, self.data_root))))
        return self._run("reset", requests)

    def step_many(self, items: Sequence[tuple[int, str]]) -> list[StepResult]:
        """Send one action to each slot's game."""
        return self._run("step", [(slot, action) for slot, action in items])

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        for g in self._local.values():
            g.close()
        self._local.clear()
        self._finalizer()

    # -- internals ------------------------------------------------------------------------------------------------

    def _run(self, kind: str, requests: list[tuple[int, str]]) -> list[StepResult]:
        if len({slot for slot, _ in requests}) != len(requests):
            raise ValueError(f"{kind}_many: a slot appears twice in one call")
        if self.workers == 0:
            return [self._run_local(kind, slot, arg) for slot, arg in requests]
        if not self._finalizer.alive:
            raise RuntimeError("EnvPool is closed")
        by_worker: dict[int, list[int]] = {}
        for i, (slot, _) in enumerate(requests):
            by_worker.setdefault(slot % self.workers, []).append(i)
        for w, idx in by_worker.items():
            try:
                self._procs[w].conn.send((kind, [requests[i] for i in idx]))
            except (OSError, BrokenPipeError):
                self._fail(w, [requests[i][0] for i in idx], "its pipe is closed")
        results: list[StepResult | None] = [None] * len(requests)
        error = None
        start = time.monotonic()
        for w, idx in by_worker.items():  # read every reply, even after an error, so no answer is left in a pipe
            slots = [requests[i][0] for i in idx]
            reply = self._receive(w, slots, deadline=start + self.timeout_s * len(idx))
            if reply[0] == "error":
                error = error or (w, *reply[1:])
                continue
            for i, res in zip(idx, reply[1], strict=True):
                results[i] = res
        if error is not None:
            w, slot, exc_type, message, tb = error
            game = self._slot_game.get(slot, "?")
            if exc_type == "UserError":
                raise UserError(message)
            raise RuntimeError(f"env worker {w} failed on {kind} of slot {slot} ({game}): {exc_type}: {message}\n{tb}")
        return results  # type: ignore[return-value]

    def _run_local(self, kind: str, slot: int, arg: str) -> StepResult:
        if kind == "step" and slot not in self._local:
            raise RuntimeError(f"slot {slot} has no game: reset_many() it first")
        try:
            if kind == "reset":
                game = self._local.get(slot)
                if game is None:
                    game = self._local[slot] = AlfWorldGame(expert=self.expert, data_root=self.data_root)
                return game.reset(arg)
            return self._local[slot].step(arg)
        except UserError:
            raise
        except Exception as e:  # same message as from a worker: which game failed
            game = self._slot_game.get(slot, "?")
            raise RuntimeError(f"{kind} of slot {slot} ({game}) failed: {type(e).__name__}: {e}") from e

    def _receive(self, w: int, slots: list[int], deadline: float):
        worker = self._procs[w]
        while True:
            try:
                if worker.conn.poll(0.2):
                    return worker.conn.recv()
            except (EOFError, OSError):
                time.sleep(0.05)  # the worker is gone: let it exit, then the check below reports it
            code = worker.proc.poll()
            if code is not None:
                self._fail(w, slots, f"it exited with code {code}")
            if time.monotonic() > deadline:
                self._fail(w, slots, f"no answer within {self.timeout_s:.0f} s per game (it was killed)")

    def _fail(self, w: int, slots: list[int], why: str):
        names = ", ".join(f"slot {s} ({self._slot_game.get(s, '?')})" for s in slots)
        self.close()
        raise RuntimeError(f"env worker {w} failed while playing {names}: {why}; the pool is closed")
