"""Sokoban's part of the offline `rules` analyzer: a hindsight skill read off the episode's grids (game state).

A success yields the pushes that solved the room, in order; a failure an avoidance rule for what went wrong:
replies the parser could not read (invalid format), a box pushed into a corner that is not a target (a dead
lock: it can never move again), no box ever pushed (walked into walls or in circles), or steps ran out with the box
still movable. A baseline so the pipeline runs offline, not the paper's analyzer.
"""

from __future__ import annotations

import numpy as np

RULES_VERSION = "sokoban-rules-v1"

_SYMBOLS = {"#": 0, "_": 1, "O": 2, "√": 3, "X": 4, "P": 5, "S": 6}


def parse_grid(text: str) -> np.ndarray | None:
    """The room codes of a text observation (verl-agent's grid: cells ' # \\t', rows joined by newlines), or None
    when `text` is not such a grid."""
    rows = []
    for line in text.strip("\n").split("\n"):
        cells = [c.strip() for c in line.split("\t") if c.strip()]
        if not cells or any(c not in _SYMBOLS for c in cells):
            return None
        rows.append([_SYMBOLS[c] for c in cells])
    if not rows or len({len(r) for r in rows}) != 1:
        return None
    return np.array(rows)


def _boxes(grid: np.ndarray) -> set[tuple[int, int]]:
    return {(int(r), int(c)) for r, c in np.argwhere((grid == 3) | (grid == 4))}


def _cornered(grid: np.ndarray, cell: tuple[int, int]) -> bool:
    """A box (not on a target) with walls on two adjacent sides can never be pushed again."""
    r, c = cell
    if grid[r, c] != 4:
        return False
    rows, cols = grid.shape

    def wall(rr: int, cc: int) -> bool:
        return not (0 <= rr < rows and 0 <= cc < cols) or grid[rr, cc] == 0

    vertical = wall(r - 1, c) or wall(r + 1, c)
    horizontal = wall(r, c - 1) or wall(r, c + 1)
    return vertical and horizontal


def classify(trajectory) -> tuple[str, list[str]]:
    """(outcome, pushes) where outcome is success | invalid_format | dead_lock | no_push | out_of_steps and pushes
    lists the actions that moved a box, in order."""
    grids = [parse_grid(t.observation) for t in trajectory.turns]
    pushes: list[str] = []
    dead = False
    for i, turn in enumerate(trajectory.turns):
        before = grids[i]
        after = grids[i + 1] if i + 1 < len(grids) else None
        if before is None or after is None:
            continue
        moved = _boxes(after) - _boxes(before)
        if moved:
            pushes.append(turn.action)
            dead = dead or any(_cornered(after, cell) for cell in moved)
    if trajectory.won:
        return "success", [*pushes, trajectory.turns[-1].action]  # the winning move is a push
    invalid = sum(not t.valid for t in trajectory.turns)
    if trajectory.turns and invalid * 2 >= len(trajectory.turns):
        return "invalid_format", pushes
    if dead:
        return "dead_lock", pushes
    if not pushes:
        return "no_push", pushes
    return "out_of_steps", pushes


def rules_skill(trajectory) -> tuple[str, str]:
    """(episode_summary, episode_skill) for one Sokoban trajectory."""
    outcome, pushes = classify(trajectory)
    steps = len(trajectory.turns)
    pushed = ", ".join(pushes) if pushes else "none"
    if outcome == "success":
        return (
            f"The agent solved the room in {steps} step(s). It pushed the box with the moves: {pushed}.",
            "First walk to the cell on the far side of the box from its target, then push the box straight toward "
            "the target, re-positioning behind it before each change of direction.",
        )
    if outcome == "invalid_format":
        return (
            f"The agent failed: most of its {steps} replies could not be read as a move.",
            "Always end the reply with exactly one move inside the tags, e.g. <action>left</action>, after "
            "reasoning inside <think> </think>; a reply without them wastes the step.",
        )
    if outcome == "dead_lock":
        return (
            f"The agent failed after {steps} step(s): it pushed a box into a corner that is not a target "
            f"(pushes: {pushed}).",
            "Never push a box against two walls at once unless that cell is a target; before each push check that "
            "the box can still be pushed toward the target from the cell it lands on.",
        )
    if outcome == "no_push":
        return (
            f"The agent failed: in {steps} step(s) it never moved a box.",
            "Find the box and the target first, then walk around the box to the side opposite the target and push; "
            "moving into walls or back and forth wastes steps.",
        )
    return (
        f"The agent failed: it ran out of steps after {steps} with the box still short of the target "
        f"(pushes: {pushed}).",
        "Plan the shortest route before moving: count the pushes the box needs and walk the shortest way to the "
        "pushing side, without detours.",
    )
