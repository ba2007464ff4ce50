"""ALFWorld's reward: what the trainer trains on, and the leak rule of its hindsight skills.

Trained on: the episode's success, the game's own `won` (the goal's PDDL conditions hold). GRPO scores every turn of
an episode `SUCCESS_REWARD`·won − `INVALID_PENALTY` if that turn's reply was invalid (`projection.parse_action`), and
normalises the scores of a group by their mean and standard deviation (`ADVANTAGE_NORM`); the trajectory's reward is
`SUCCESS_REWARD`·won. Logged only: `StepResult.reward` and `StepResult.score`, both 1.0 once won and 0.0 before
(TextWorld's own score is not read), which eval reports as success.
"""

from __future__ import annotations

import re

SUCCESS_REWARD = 10.0  # episode reward = SUCCESS_REWARD · won
INVALID_PENALTY = 0.1  # per invalid turn
ADVANTAGE_NORM = "mean_std"  # a group's turn scores: minus their mean, over their standard deviation

_INSTANCE = re.compile(r"\b([a-z]+) (\d+)\b", re.IGNORECASE)  # "drawer 3", "mug 1"


def outcome(won: bool) -> tuple[bool, float]:
    """(success, score) of a game state whose `won` the game reports: the score is 1.0 once won, else 0.0."""
    return won, float(won)


def instance_spans(trajectory, skill: str) -> list[tuple[int, int]]:
    """The (start, end) spans of `skill` naming a numbered instance ("drawer 3", "Mug 1"; case-insensitive) that this
    episode's observations or actions name too.

    A simplification of "where this episode found its target": any instance the episode saw or acted on counts,
    the ones its first observation lists around the room included, not only the target's."""
    seen: set[tuple[str, str]] = set()
    for turn in trajectory.turns:
        for text in (turn.observation, turn.action):
            seen.update((name.lower(), number) for name, number in _INSTANCE.findall(text or ""))
    return [m.span() for m in _INSTANCE.finditer(skill) if (m.group(1).lower(), m.group(2)) in seen]
