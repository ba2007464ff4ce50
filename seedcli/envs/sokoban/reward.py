"""Sokoban's reward: what the trainer trains on, what is only logged, and the leak rule of its hindsight skills.

Trained on: the episode's success, every box on a target within the 15 steps (`outcome`). GRPO scores every turn of
an episode `SUCCESS_REWARD`·won − `INVALID_PENALTY` if that turn's reply was invalid (`projection.sokoban_projection`),
and normalises the scores of a group by their mean and standard deviation (`ADVANTAGE_NORM`), as the SEED code does
for Sokoban; the trajectory's reward is `SUCCESS_REWARD`·won.

Logged only: gym-sokoban's step reward (`game.Sokoban.step`: −0.1 a step, +1/−1 a box on/off a target, +10 solved),
carried as `StepResult.reward` and summed as `info["return"]`; eval reports its mean per episode ("mean reward"),
and no loss reads it. `StepResult.score` is 1.0 for a solved room, else 0.0 (eval's success).
"""

from __future__ import annotations

import re

from seedcli.envs.sokoban.game import Sokoban

SUCCESS_REWARD = 10.0  # episode reward = SUCCESS_REWARD · won
INVALID_PENALTY = 0.1  # per invalid turn
ADVANTAGE_NORM = "mean_std"  # a group's turn scores: minus their mean, over their standard deviation


def outcome(game: Sokoban) -> tuple[bool, float]:
    """(success, score) of a room as it stands: solved when every box is on a target (verl-agent's `success()`)."""
    won = game.success()
    return won, 1.0 if won else 0.0


MIN_LEAKED_MOVES = 4
_MOVE_WORD = re.compile(r"(?<![a-z])(up|down|left|right)(?![a-z])", re.IGNORECASE)
# what may stand between two moves of one written sequence: spaces, commas, arrows, quotes, "then"/"and"
_MOVE_SEP = re.compile(r"""[\s,;:/|'"`()\[\]>→-]*(?:(?:and then|then|and)[\s,;:/|'"`()\[\]>→-]*)?""", re.IGNORECASE)
_ADMISSIBLE = ("up", "down", "left", "right")  # the prompt's own list of actions, in its order


def move_spans(moves: list[str], skill: str, min_moves: int = MIN_LEAKED_MOVES) -> list[tuple[int, int]]:
    """The (start, end) spans of `skill` that write at least `min_moves` consecutive moves of `moves` (this
    episode's up/down/left/right, in order) in a row: move words (any case) separated by spaces, commas, arrows,
    quotes, "then" or "and" ("up, up, left, down", "Up -> Up -> Left -> Down"). Letters ("U U L D") are not read;
    exactly the prompt's list "up, down, left, right" is not counted."""
    episode = tuple(m.lower() for m in moves)

    def occurs(window: tuple[str, ...]) -> bool:
        n = len(window)
        return any(episode[j : j + n] == window for j in range(len(episode) - n + 1))

    runs: list[list[re.Match]] = []
    for m in _MOVE_WORD.finditer(skill):
        if runs and _MOVE_SEP.fullmatch(skill, runs[-1][-1].end(), m.start()):
            runs[-1].append(m)
        else:
            runs.append([m])
    spans: list[tuple[int, int]] = []
    for run in runs:
        words = tuple(m.group(1).lower() for m in run)
        i = 0
        while i + min_moves <= len(words):
            n = min_moves
            while i + n <= len(words) and occurs(words[i : i + n]):
                n += 1
            n -= 1  # the longest window from i that the episode played
            if n >= min_moves and words[i : i + n] != _ADMISSIBLE:
                spans.append((run[i].start(), run[i + n - 1].end()))
                i += n
            else:
                i += 1
    return spans
