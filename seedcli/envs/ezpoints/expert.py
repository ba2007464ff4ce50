"""The EZPoints expert: enumerate formulas over the two card numbers and return the actions of a winning one.

Breadth-first over action sequences from the game's current state, using only the actions that can matter (the
cards' numbers, "+", "*", "="), each simulated on a copy of the game with its own `step`; the first sequence that
wins is returned, so it is a shortest one ("a + b" or "a * b" on a fresh game: 4 actions). Every fresh game is
solvable by construction (the second card is 12 - a or 12 / a); a state from which no formula wins (e.g. "5 *"
already written with 5 and 7) gives [] (`solve` reports it; the caller decides). `demo_thought` is the reasoning a
warm-start demonstration gives for the expert's move.
"""

from __future__ import annotations

import copy
from collections import deque

from seedcli.envs.ezpoints.game import ACTION_NAMES, EZPoints

MAX_PLAN = 7  # enough for any formula of <= 6 tokens plus "="; the game truncates longer ones


def candidate_actions(game: EZPoints) -> list[int]:
    """The actions worth trying: the cards' numbers (each once, in card order), then "+", "*", "="."""
    numbers = list(dict.fromkeys(game.numbers))
    return [ACTION_NAMES.index(str(n)) for n in numbers] + [ACTION_NAMES.index(t) for t in ("+", "*", "=")]


def solve(game: EZPoints) -> list[int]:
    """A shortest action sequence that wins `game` from its current state, or [] when none exists."""
    actions = candidate_actions(game)
    frontier: deque[tuple[EZPoints, list[int]]] = deque([(game, [])])
    while frontier:
        state, plan = frontier.popleft()
        if len(plan) >= MAX_PLAN:
            continue
        for action in actions:
            child = copy.deepcopy(state)
            reward, terminated, truncated, won = child.step(action)
            if won:
                return plan + [action]
            if terminated or truncated or child.formula == state.formula:
                continue  # ended, or a refused number: nothing new to explore
            frontier.append((child, plan + [action]))
    return []


def _card_value(name: str) -> int | None:
    """The number a card named in words counts for ("Jack of Hearts" → 10, "Ace of Spades" → 1, "7 of Clubs" → 7)."""
    rank = name.strip().split(" of ")[0]
    if rank in ("Jack", "Queen", "King"):
        return 10
    if rank == "Ace":
        return 1
    return int(rank) if rank.isdigit() else None


def card_pair(task: str) -> tuple[int, int, str] | None:
    """(a, b, the operator that makes 12) of the task line `task` naming two cards; None otherwise."""
    values = [_card_value(name) for name in str(task).split(" and ")]
    if len(values) != 2 or None in values:
        return None
    a, b = values
    return a, b, "+" if a + b == 12 else "*"


def oracle_formula(task: str) -> str | None:
    """What the expert knows before playing the game of task line `task`: the two card values, the formula that
    makes 12 and the characters to append in order; None when the task line does not name two cards."""
    pair = card_pair(task)
    if pair is None:
        return None
    a, b, op = pair
    return f"the cards are {a} and {b}; {a} {op} {b} = 12, so append '{a}', then '{op}', then '{b}', then '='."


def demo_thought(task: str, formula: str, action: str) -> str | None:
    """The arithmetic the expert's move `action` follows from, in words the prompt supports: the two card values of
    the task line `task`, the formula that makes 12, the formula so far and so the next character (the prompt shows
    cards and formula); None when the task line does not name two cards."""
    pair = card_pair(task)
    if pair is None:
        return None
    a, b, op = pair
    return (
        f"The cards are {a} and {b}. {a} {op} {b} = 12, so the formula is {a}{op}{b}=. The current formula is "
        f"'{formula}', so the next character is {action}."
    )
