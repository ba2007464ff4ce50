"""EZPoints' part of `--analyzer hindsight` (seedcli/envs/hindsight.py): the episode replayed against the expert.

A lost game's turn is the one after which no formula could reach 12 any more (`winnable`: the expert's own search
finds none; an '=' too early, the wrong operator, two numbers in a row), else the first turn off the expert's path
(a refused number, an unreadable reply); the skill names the cards, the formula that makes 12, what the agent
appended there and the expert's next character, and a rule for the sequencing error. A won game's turn is the one
that chose the operator. The cards and the formula leak by EZPoints' rule (`reward.card_spans`): the audit counts it.
"""

from __future__ import annotations

from seedcli.envs.ezpoints.expert import card_pair, solve
from seedcli.envs.ezpoints.game import ACTION_NAMES, MAX_FORMULA_LEN, evaluate
from seedcli.envs.hindsight import Replayed, divergence, generic_skill

HINDSIGHT_VERSION = "ezpoints-hindsight-v1"  # bump when the generated text changes
OPERATORS = ("+", "*")


def winnable(slot, result) -> bool:
    """The replay's probe: whether a formula can still make 12 from this state (the expert's search finds one)."""
    return not result.done and bool(solve(slot.game))


def _value(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a * b


def _mistake(step: Replayed) -> tuple[str, str]:
    """(what the agent did at `step`, the rule that avoids it)."""
    action, formula = step.action.strip(), step.before.observation
    shown = f"'{formula}'" if formula else "the empty formula"
    if action not in ACTION_NAMES:
        return (
            f"sent '{action[:40]}', which is not a character the game takes, so the turn was wasted",
            "Answer with one JSON object whose \"action\" holds exactly one character to append (a card value, '+', "
            "'*' or '='); anything else is void and costs a turn.",
        )
    if action == "=":
        value = evaluate([formula]) if formula else None
        if value is None or not any(o in formula for o in OPERATORS) or formula[-1:] in OPERATORS:
            return (
                f"appended '=' to {shown}, which is not a finished formula, and the game ended lost",
                "Append '=' last, only once the formula holds both card values joined by one operator; '=' on an "
                "unfinished formula ends the game lost.",
            )
        return (
            f"appended '=' to {shown}, which is {value}, not 12, and the game ended lost",
            "Before appending '=', evaluate the formula: it must use both card values once and equal exactly 12; if "
            "the sum of the two values is not 12, their product is.",
        )
    if action in OPERATORS:
        if step.after.observation == formula or len(formula) > MAX_FORMULA_LEN:
            return (
                f"appended '{action}' to {shown}, which was already too long, so nothing changed",
                "A winning formula has four characters (a value, an operator, a value, '='); extra operators make "
                "the formula too long to finish.",
            )
        return (
            f"appended '{action}' to {shown}, making '{step.after.observation}', from which no formula makes 12",
            "Choose the operator from the two card values before writing it: '+' when they add up to 12, '*' when "
            "they multiply to 12.",
        )
    if step.after.observation == formula:
        return (
            f"appended '{action}' to {shown}; the game refused it (that number is not left on the cards)",
            "Append only the two card values, each once (face cards count 10); a number that is not on the cards is "
            "refused and wastes the turn.",
        )
    if formula[-1:].isdigit():
        return (
            f"appended '{action}' right after the number in {shown}, making the one number '{step.after.observation}'",
            f"Put the operator between the two card values: two numbers appended in a row read as one number "
            f"('{action}' after '{formula}' gives {formula}{action}).",
        )
    return (
        f"appended '{action}' to {shown}, making '{step.after.observation}'",
        "Write the formula in the order value, operator, value, '=': each character appended out of that order makes "
        "12 harder or impossible to reach.",
    )


def hindsight_skill(trajectory, steps: list[Replayed], title: str = "EZPoints") -> tuple[str, str]:
    """(episode_summary, episode_skill) of one EZPoints episode from its replay (`winnable` as the probe)."""
    pair = card_pair(trajectory.task)
    if pair is None or not steps:
        return generic_skill(title, trajectory, steps)
    a, b, op = pair
    other = "*" if op == "+" else "+"
    cards = trajectory.task.strip()
    formula = f"{a} {op} {b} = 12 ({a} {other} {b} = {_value(a, other, b)})"
    if trajectory.won:
        win = steps[-1]
        chose = [s for s in steps if s.action.strip() in OPERATORS and s.after.observation != s.before.observation]
        turn = chose[-1] if chose else win
        wasted = sum(s.after.observation == s.before.observation and not s.after.done for s in steps)
        extra = f", after {wasted} turn(s) that changed nothing" if wasted else ""
        summary = (
            f"The agent won EZPoints with the {cards} (values {a} and {b}): it wrote '{win.before.observation}' and "
            f"closed it with '=' at turn {win.step}{extra}."
        )
        skill = (
            f"With the {cards}, turn {turn.step} decided the game: after '{turn.before.observation}' the agent "
            f"appended '{turn.action.strip()}', as the expert does, since {formula}. Check which of the sum and the "
            "product of the two card values is 12 before writing the operator, then append the second value and '='."
        )
        return summary, skill
    turn = next((s for s in steps if s.probe_before and not s.probe_after), None) or divergence(steps)
    if turn is None:
        return generic_skill(title, trajectory, steps)
    did, rule = _mistake(turn)
    expert = turn.expert or "="
    summary = (
        f"The agent lost EZPoints with the {cards} (values {a} and {b}; {a} {op} {b} = 12). At turn {turn.step} it "
        f"{did}; the expert's next character there was '{expert}'."
    )
    skill = (
        f"With the {cards}, {formula}. At turn {turn.step} the agent {did}, where the expert appended '{expert}'. "
        f"{rule}"
    )
    return summary, skill
