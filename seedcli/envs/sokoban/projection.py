"""Reading Sokoban's replies as verl-agent's `sokoban_projection` reads them, quirks kept: the first of
up/down/left/right/still that occurs *inside* the action text wins, "still" is valid and moves nothing, and a reply
without both think tags is invalid but its action is still played.
"""

from __future__ import annotations

MOVES = ("up", "down", "left", "right")  # the admissible actions every prompt lists, in its order

# verl-agent's sokoban_projection scans its action pool in this order; the first name inside the action text wins.
_PROJECTION_POOL = {"up": 1, "down": 2, "left": 3, "right": 4, "still": 0}


def sokoban_projection(response: str) -> tuple[str, bool]:
    """verl-agent `sokoban_projection` for one reply: (action name sent to the game, valid). The name is one of
    still/up/down/left/right ("still": no `<action>…</action>` block, or none of the names inside it)."""
    lowered = response.lower()
    start, end = lowered.find("<action>"), lowered.find("</action>")
    action, valid = "still", False
    if start != -1 and end != -1:
        extracted = lowered[start + len("<action>") : end].strip().lower()
        for name in _PROJECTION_POOL:
            if name in extracted:
                action, valid = name, True
                break
    if response.find("<think>") == -1 or response.find("</think>") == -1:
        valid = False
    return action, valid
