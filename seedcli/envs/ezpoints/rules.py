"""EZPoints' part of the offline `rules` analyzer: a hindsight skill read off the episode (cards and formulas).

A success yields the formula that made 12; a failure an avoidance rule for what went wrong: replies the parser
could not read, a number that is not on the cards (refused, a wasted step), `=` on a formula that is not 12, or the
steps running out before `=`. A baseline so the pipeline runs offline, not the paper's analyzer.
"""

from __future__ import annotations

from seedcli.envs.ezpoints.prompt import card_numbers

RULES_VERSION = "ezpoints-rules-v1"


def classify(trajectory) -> tuple[str, str]:
    """(outcome, last formula) where outcome is success | invalid_format | wrong_number | wrong_value |
    out_of_steps."""
    turns = list(trajectory.turns)
    last_formula = turns[-1].observation if turns else ""
    if trajectory.won:
        return "success", last_formula
    if turns and sum(not t.valid for t in turns) * 2 >= len(turns):
        return "invalid_format", last_formula
    numbers = card_numbers(trajectory.task)
    if any(t.valid and t.action.isdigit() and int(t.action) not in numbers for t in turns):
        return "wrong_number", last_formula
    if turns and turns[-1].action == "=":
        return "wrong_value", last_formula
    return "out_of_steps", last_formula


def rules_skill(trajectory) -> tuple[str, str]:
    """(episode_summary, episode_skill) for one EZPoints trajectory."""
    outcome, formula = classify(trajectory)
    numbers = card_numbers(trajectory.task)
    cards = " and ".join(map(str, numbers)) or "the two cards"
    if outcome == "success":
        return (
            f"The agent built '{formula}' from the cards {cards} and closed it with '=' for 12.",
            "Read both card values, check whether their sum or their product is 12, then append the first number, "
            "the operator that works, the second number and '=' in that order.",
        )
    if outcome == "invalid_format":
        return (
            "The agent failed: most of its replies were not JSON with a single action.",
            'Answer with one JSON object whose "action" holds exactly one character to append (a card number, '
            "'+', '*' or '='); mentioning several candidates in the action field makes the step void.",
        )
    if outcome == "wrong_number":
        return (
            f"The agent failed: it tried numbers that are not on the cards {cards} and the game refused them.",
            "Only the two card values may appear in the formula (face cards are 10, an ace is 1), each once; "
            "decide between '+' and '*' from those two values alone.",
        )
    if outcome == "wrong_value":
        return (
            f"The agent failed: it pressed '=' on '{formula}', which is not 12 with both cards {cards} used.",
            "Before appending '=', evaluate the formula: it must use both card values once and equal exactly 12; "
            "if the sum is not 12, the product is.",
        )
    return (
        f"The agent failed: the steps ran out on the formula '{formula}' without '='.",
        "A winning formula needs only four characters (number, operator, number, '='): do not append extra "
        "operators, and end with '=' as soon as the formula equals 12.",
    )
