"""EZPoints' text: verl-agent's EZPoints template character for character (`<image>` first: the cards are in the
image), seedcli's text-only variant of it that names the cards in words (not in the paper), the turn prompt, the task
line naming the cards, the analysis prompt's first sentence, and the tiny tokenizer's text.

The prompt shows the formula so far (the observation); there is no history (verl-agent's template has none). Bump
`PROMPT_VERSION` whenever the rendered text changes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from seedcli.envs.ezpoints.game import EZPoints, card_words

PROMPT_VERSION = "ezpoints-v1"  # bump whenever the prompt text changes
TASK_LINE_PREFIX = "You are an expert card game player"
ANALYSIS_DESCRIPTION = (
    "You are an expert analyst of card-game agents in EZPoints (two playing cards; the agent appends one number or "
    "operator at a time to build a formula that evaluates to 12, using each card's number once)."
)

# verl-agent agent_system/environments/prompts/gym_cards.py GYM_CARDS_EZPOINTS_TEMPLATE, character for character.
EZPOINTS_TEMPLATE = """
<image>You are an expert card game player helping to build a math formula that evaluates to **12**, using only the two numbers shown on the playing cards in the image. You may choose from the following actions: one of the two available card numbers, the operators '+' or '*', or the equals sign '='. You must build the formula step by step, adding only one character at a time to the end of the current formula.

Card Rules:
1. The image shows exactly two playing cards.
2. Each card represents one number:
   - Number cards (2–10) equal their face value.
   - Face cards ('J', 'Q', 'K') are treated as the number 10.
   - Ace ('A') is treated as 1.
3. You can only use these two card numbers — no other numbers are allowed.
4. Each number can be used only once in the formula.

Formula Rules:
1. At each step, you append only one character: a number (from the two card values), an operator ('+' or '*'), or '='.
2. Once you add '=', the formula is evaluated and the game ends.

Rewards:
+10: if the formula evaluates exactly to 12.
0: otherwise (e.g., using a number not shown on the cards, reusing a number, incorrect syntax, not evaluating to 12).

Now, you are given two card numbers as shown in the image, and the current formula is: '{text_formula}'
It's your turn to append the next character.

Your response MUST be a valid JSON object in the following format:
{{
  "thoughts": "Start by identifying the two card numbers shown in the image. Then review the current formula. Based on the remaining available characters and the goal of reaching 12, reason step-by-step to choose the next valid character to add.",
  "action": "next character (number, '+', '*', or '=') to append"
}}
"""

# The text-only variant (seedcli's, not the paper's): the same template with the image replaced by the cards' names.
_TEXT_EDITS = (
    ("<image>You are", "You are"),
    ("shown on the playing cards in the image.", "on the two playing cards named below."),
    ("1. The image shows exactly two playing cards.", "1. The two playing cards are: {cards}."),
    ("two card numbers as shown in the image,", "the two cards {cards},"),
    ("identifying the two card numbers shown in the image.", "identifying the two card numbers from the cards."),
)
EZPOINTS_TEXT_TEMPLATE = EZPOINTS_TEMPLATE
for _old, _new in _TEXT_EDITS:
    assert _old in EZPOINTS_TEXT_TEMPLATE, _old
    EZPOINTS_TEXT_TEMPLATE = EZPOINTS_TEXT_TEMPLATE.replace(_old, _new)


def cards_text(cards: Sequence[str]) -> str:
    """The task line of a game: its two cards in words ("5 of Spades and King of Diamonds")."""
    return " and ".join(card_words(c) for c in cards)


_RANKS = {"Ace": 1, "Jack": 10, "Queen": 10, "King": 10}


def card_numbers(task: str) -> list[int]:
    """The two card values of a task line ("5 of Spades and King of Diamonds" -> [5, 10])."""
    out = []
    for rank in re.findall(r"(\w+) of \w+", task):
        out.append(_RANKS.get(rank, int(rank) if rank.isdigit() else 0))
    return out


def render_prompt(observation_mode: str, formula: str, cards: str) -> str:
    """The user message of a turn: the template with the formula so far; in `text` mode the cards named in words."""
    if observation_mode == "image":
        return EZPOINTS_TEMPLATE.format(text_formula=formula)
    return EZPOINTS_TEXT_TEMPLATE.format(text_formula=formula, cards=cards)


def template_texts() -> list[str]:
    """The rendered templates the tiny tokenizer learns (the image template, the text variant)."""
    return [
        EZPOINTS_TEMPLATE.format(text_formula="5+"),
        EZPOINTS_TEXT_TEMPLATE.format(text_formula="", cards="5 of Spades and 7 of Diamonds"),
    ]


def sample_texts() -> list[str]:
    """Text-mode prompts of eight games (seeds 0-7) at different formulas, for the tiny tokenizer."""
    return [
        EZPOINTS_TEXT_TEMPLATE.format(text_formula=formula, cards=cards_text(EZPoints(s).cards))
        for s, formula in zip(range(8), ["", "5", "5+", "3*", "10+", "2", "6*2", "4*3"], strict=True)
    ]
