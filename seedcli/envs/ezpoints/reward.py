"""EZPoints' reward: what the trainer trains on, what is only logged, and the leak rule of its hindsight skills.

Trained on: the episode's success, `=` closing a formula that makes 12 with both cards (`outcome`). GRPO scores
every turn of an episode `SUCCESS_REWARD`·won − `INVALID_PENALTY` if that turn's reply was invalid
(`projection.gym_projection`), and normalises the scores of a group by their mean and standard deviation
(`ADVANTAGE_NORM`); the trajectory's reward is `SUCCESS_REWARD`·won.

Logged only: gym-cards' step reward (`game.EZPoints.step`: 10 for an `=` that makes 12 with both cards, else 0),
carried as `StepResult.reward` and summed as `info["return"]`; eval reports its mean per episode ("mean reward"), and
no loss reads it. `StepResult.score` is 1.0 for a won game, else 0.0.
"""

from __future__ import annotations

import re

from seedcli.envs.base import merge_spans
from seedcli.envs.ezpoints.game import EZPoints
from seedcli.envs.ezpoints.prompt import card_numbers

SUCCESS_REWARD = 10.0  # episode reward = SUCCESS_REWARD · won
INVALID_PENALTY = 0.1  # per invalid turn
ADVANTAGE_NORM = "mean_std"  # a group's turn scores: minus their mean, over their standard deviation


def outcome(game: EZPoints) -> tuple[bool, float]:
    """(success, score) of a game as it stands: won once `=` made 12 with both cards."""
    return bool(game.won), 1.0 if game.won else 0.0


# what may join the two card values in a skill: "5 and 7", "5+7", "7 * 5", "'5', '+', '7'", "5 plus 7"
_PAIR_SEP = r"""[\s,;:'"`]*(?:(?:and|&|\+|\*|x|×|plus|times|with)[\s,;:'"`]*)?"""


def card_spans(task: str, skill: str) -> list[tuple[int, int]]:
    """The (start, end) spans of `skill` naming this game's cards: a card's name as the task line writes it
    ("King of Diamonds", any case and spacing), or both card values side by side, in either order, joined by
    nothing but spaces, punctuation and one of and, &, +, *, x, plus, times, with ("5 and 7", "7*5"); a range
    such as "2-10" is not a pair. `task` is the task line ("5 of Spades and King of Diamonds")."""
    spans: list[tuple[int, int]] = []
    for name in re.findall(r"\w+ of \w+", task):
        pattern = r"\s+".join(re.escape(w) for w in name.split())
        spans += [m.span() for m in re.finditer(rf"(?<!\w){pattern}(?!\w)", skill, re.IGNORECASE)]
    numbers = card_numbers(task)
    if len(numbers) == 2:
        a, b = (rf"(?<![\d.]){n}(?![\d])" for n in numbers)
        for first, second in {(a, b), (b, a)}:
            spans += [m.span() for m in re.finditer(rf"{first}{_PAIR_SEP}{second}", skill, re.IGNORECASE)]
    return merge_spans(spans)
