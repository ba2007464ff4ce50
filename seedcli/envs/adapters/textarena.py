"""TextArena's single-player games as an environment (`--env textarena env_options='{game: TowerOfHanoi-v0}'`,
`pip install -e '.[textarena]'`).

A game is a TextArena environment id (`GuessTheNumber-v0`, `TowerOfHanoi-v0`, `Mastermind-v0`, ...; the name without
its version means `-v0`, case ignored); several, comma-separated, are categories. Only single-player games are played
(those whose state is TextArena's `SinglePlayerState`). A task is a game seed: train holds seeds 0..train_size-1, test
the seeds from 1,000,000 on. The game is made raw (`textarena.make("<id>-raw")`: no observation or action wrapper)
and reset with `reset(num_players=1, seed=...)`; its first message (the rules it gives the player) is the task, the
game's later messages (hints, boards, its verdict on an invalid move) are the observations, the reply's action is sent
as it is written (TextArena reads the move inside [brackets]). The game's own end and reward are used: the episode
ends when the game says it is done (its turn limit, two invalid moves in a row), the reward is the game's reward for
the player (1 for a win, TextArena's share of progress otherwise), and a reward of 1 is a win.

TextArena seeds Python's global `random` at reset and draws from it while playing; each game here keeps a generator
state of its own and swaps it in around every call, so games hosted side by side in one process replay exactly.
Experts where the game has an obvious one: binary search for GuessTheNumber, the optimal moves for TowerOfHanoi; a
game without one (Mastermind) refuses expert play and `--analyzer oracle` in one line (`no_expert`).
"""

from __future__ import annotations

import difflib
import random
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from seedcli.envs.adapters import parse_names, require
from seedcli.envs.base import EnvOptions
from seedcli.envs.card import EnvCard
from seedcli.envs.text import TextEnv
from seedcli.errors import UserError

PYPI = "textarena==0.7.4"
EXTRA = "textarena"
TITLE = "TextArena"
TEST_OFFSET = 1_000_000  # the test split's first seed
EXPERT_GAMES = ("GuessTheNumber", "TowerOfHanoi")  # the games `expert` plays (any of their versions)


def _library():
    return require("textarena", EXTRA, PYPI, TITLE)


@cache
def single_player_games() -> dict[str, str]:
    """TextArena's registered single-player games: id -> entry point (read from each game's source, not played)."""
    ta = _library()
    root = Path(ta.__file__).parent.parent  # the games' modules are read as files: importing one may download data
    out = {}
    for env_id, spec in ta.envs.registration.ENV_REGISTRY.items():
        target = spec.entry_point if isinstance(spec.entry_point, str) else ""
        source = root / (target.split(":")[0].replace(".", "/") + ".py")
        if target and source.is_file() and "SinglePlayerState" in source.read_text(encoding="utf-8"):
            out[env_id] = target
    return out


def resolve_game(name: str) -> str:
    """The registered id `name` means (exact, any case, or without its version: `-v0`); a ValueError that names
    what is wrong otherwise."""
    registry = _library().envs.registration.ENV_REGISTRY
    by_lower = {k.lower(): k for k in registry}
    game = by_lower.get(name.lower()) or by_lower.get(f"{name.lower()}-v0")
    singles = sorted(k for k in single_player_games() if k.endswith("-v0"))
    listed = f"its single-player games include {', '.join(singles)}"
    if game is None:
        close = difflib.get_close_matches(name, [k for k in single_player_games() if "-raw" not in k], n=2, cutoff=0.5)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise ValueError(f"no TextArena game {name!r}; {hint}({listed})")
    if game not in single_player_games():
        raise ValueError(f"not a single-player game: TextArena's {game} has more players ({listed})")
    return game


class TextArenaOptions(EnvOptions):
    game: str = Field("GuessTheNumber-v0", description="TextArena single-player game id(s), comma-separated")
    train_size: int = Field(1000, ge=1, le=TEST_OFFSET, description="seeds in the train split, per game")
    test_size: int = Field(100, ge=1, le=TEST_OFFSET, description="seeds in the test split, per game")

    @field_validator("game")
    @classmethod
    def _known(cls, value: str) -> str:
        games = [resolve_game(name) for name in parse_names(value, "game")]
        for game in games:
            make_game(game, error=ValueError)  # a game that cannot be made here (a download offline) says so now
        return ",".join(games)


class TextArenaEnv(TextEnv):
    """TextArena (see the module docstring)."""

    title = TITLE
    prompt_version = "textarena-v1"
    max_steps = 30  # the games end themselves (their own turn limits)
    history = 4
    rules_version = "textarena-rules-v1"
    options_model = TextArenaOptions
    card = EnvCard(
        metric_labels={"micro_success": "success", "mean_score": "score"},
        task_noun="game",
        category_label="game",
        offline_note="Games are TextArena's, generated from seeds; the game's own reward and end are used.",
    )

    def __init__(self, data_root: str | None = None, **options: Any):
        super().__init__(data_root, **options)
        self.opts = TextArenaOptions(**self.options)
        self.games: dict[str, Any] = {}
        self.game: Any = None
        self.rules = ""
        self.rng_state: Any = None
        if self.no_expert():  # expert play and the oracle's plan need an expert for every game played
            self.expert_modes = (False,)

    def no_expert(self) -> str:
        missing = [g for g in self.opts.game.split(",") if g.split("-")[0] not in EXPERT_GAMES]
        if not missing:
            return ""
        has = "has" if len(missing) == 1 else "have"
        return f"TextArena's {', '.join(missing)} {has} no expert (only {' and '.join(EXPERT_GAMES)} have one)"

    def resolve_data_root(self) -> Path:
        """TextArena's own folder: the games are its own (a `data_root` given is kept)."""
        library = _library()
        return super().resolve_data_root() if self.data_root else Path(library.__file__).resolve().parent

    def tasks(self, split: str) -> list[dict]:
        start, n = (TEST_OFFSET, self.opts.test_size) if split == "test" else (0, self.opts.train_size)
        games = self.opts.game.split(",")
        return [{"id": f"{g}/{s}", "category": g, "seed": s} for s in range(start, start + n) for g in games]

    def task_text(self, task: dict) -> str:
        return self.rules

    def reset(self, task: dict) -> str:
        game_id = task["category"]
        if game_id not in self.games:
            self.games[game_id] = make_game(game_id)
        self.game = self.games[game_id]
        self.rng_state = random.Random(task["seed"]).getstate()  # replaced by the game's own seeding at reset
        self._call(self.game.reset, num_players=1, seed=task["seed"])
        messages = self._messages()
        prompt = _library().ObservationType.PROMPT
        self.rules = "\n".join(m for m, kind in messages if kind == prompt).strip()
        return "\n".join(m for m, kind in messages if kind != prompt)

    def step(self, action: str) -> tuple[str, float, bool]:
        done, _info = self._call(self.game.step, action)
        observation = "\n".join(m for m, _ in self._messages())
        if done:  # the game's verdict, where it gives one (the episode's last observation, for the analysis)
            reason = self.game.state.game_info.get(0, {}).get("reason")
            observation = "\n".join(x for x in (observation, f"Game over: {reason}" if reason else "") if x)
        rewards = self.game.state.rewards or {}
        return observation, float(rewards.get(0, 0.0)) if done else 0.0, bool(done)

    def is_won(self, episode_return: float, done: bool) -> bool:
        return bool(done and episode_return >= 1.0)

    def _messages(self) -> list[tuple[str, Any]]:
        """The game's new messages to the player, its own action's echo left out (the prompt shows the action)."""
        ta = _library()
        _, messages = self._call(self.game.get_observation)
        return [(str(m).strip(), kind) for _, m, kind in messages if kind != ta.ObservationType.PLAYER_ACTION]

    def _call(self, fn, *args, **kwargs):
        """`fn` with this game's generator state in Python's global `random` (see the module docstring)."""
        outer = random.getstate()
        random.setstate(self.rng_state)
        try:
            return fn(*args, **kwargs)
        finally:
            self.rng_state = random.getstate()
            random.setstate(outer)

    def expert(self) -> str | None:
        game = self.game
        name = getattr(game, "env_id", "").split("-")[0]
        if name == "GuessTheNumber":
            low, high = game.min_number, game.max_number
            for guess, hint in game.state.game_state["guess_history"]:
                low, high = (max(low, guess + 1), high) if hint == "higher" else (low, min(high, guess - 1))
            return f"[{(low + high) // 2}]"
        if name == "TowerOfHanoi":
            towers = game.state.game_state["towers"]
            move = hanoi_move(towers, sum(len(d) for d in towers.values()), "C")
            return f"[{move[0]} {move[1]}]" if move else None
        return None


def make_game(game_id: str, error: type[Exception] = UserError) -> Any:
    """TextArena's raw environment of a game (no wrappers); a game that cannot be made offline is one line (`error`)."""
    ta = _library()
    raw = f"{game_id}-raw" if f"{game_id}-raw" in single_player_games() else game_id
    try:
        return ta.make(raw)
    except Exception as exc:  # noqa: BLE001 - e.g. Wordle downloads NLTK corpora when it is first made
        why = " ".join(str(exc).replace("*", " ").split())[:160]
        raise error(
            f"cannot make TextArena's {game_id} here ({type(exc).__name__}: {why}); pick another game "
            "(GuessTheNumber-v0, TowerOfHanoi-v0 and Mastermind-v0 need no download)"
        ) from None


def hanoi_move(towers: dict[str, list[int]], disk: int, target: str) -> tuple[str, str] | None:
    """The next move of the optimal solution that brings disks 1..`disk` onto `target` from any legal position (the
    largest disk not yet there goes straight to the target once every smaller disk is on the third peg); None when
    they are all there."""
    if disk == 0:
        return None
    where = next(peg for peg, disks in towers.items() if disk in disks)
    if where == target:
        return hanoi_move(towers, disk - 1, target)
    other = next(peg for peg in towers if peg not in (where, target))
    return hanoi_move(towers, disk - 1, other) or (where, target)
