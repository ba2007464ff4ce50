"""Reading ALFWorld's replies: a reply's action and whether the turn is valid, and the reply that says an action.

The action is the last `<action>…</action>`, lower-cased with whitespace collapsed; the turn is valid when a
`<think>…</think>` block is present and the action is non-empty. An invalid turn still sends its action text
(possibly empty) to the game.
"""

from __future__ import annotations

import re

THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)
ACTION_RE = re.compile(r"<action>(.*?)</action>", re.DOTALL)


def parse_action(response: str) -> tuple[str, bool]:
    """(action sent to the game, valid) of a response (see the module docstring)."""
    think = THINK_RE.search(response)
    actions = ACTION_RE.findall(response)
    action = actions[-1].strip().lower() if actions else ""
    action = " ".join(action.split())
    return action, bool(think) and bool(action)


def format_response(think: str, action: str) -> str:
    """A well-formed agent response that `parse_action` reads back as `action` (warm start, expert, tests)."""
    return f"<think>{think}</think>\n<action>{action}</action>"
