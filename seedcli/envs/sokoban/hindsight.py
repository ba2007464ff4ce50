"""Sokoban's part of `--analyzer hindsight` (seedcli/envs/hindsight.py): the episode replayed against the expert.

The probe is the length of the expert's shortest plan from each state (`plan_length`: breadth-first search, None once
no plan exists). A lost room's turn is the move after which no plan exists (a box pushed into a corner or against a
wall it cannot leave), else the first move that did not bring the room one move closer to solved (a detour, a push
away from the target, a bump into a wall); the skill says where the player and the box were, what the move did and
the expert's move there, and a rule for the mistake. A won room's turn is the push that solved it. Skills name single
moves, not the episode's move sequence (Sokoban's leak rule, `reward.move_spans`).
"""

from __future__ import annotations

import numpy as np

from seedcli.envs.hindsight import Replayed, generic_skill
from seedcli.envs.sokoban.expert import solve
from seedcli.envs.sokoban.game import BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET, WALL
from seedcli.envs.sokoban.rules import parse_grid

HINDSIGHT_VERSION = "sokoban-hindsight-v1"  # bump when the generated text changes
PLAN_LIMIT = 64  # as the expert game's own search


def plan_length(slot, result) -> int | None:
    """The replay's probe: moves in the expert's shortest plan from this state (0 once solved; None: none exists)."""
    if result.won:
        return 0
    plan = solve(slot.game, max_len=PLAN_LIMIT)
    return None if plan is None else len(plan)


def _cells(grid: np.ndarray, *codes: int) -> list[tuple[int, int]]:
    return [(int(r), int(c)) for r, c in np.argwhere(np.isin(grid, codes))]


def _where(cell: tuple[int, int]) -> str:
    return f"row {cell[0] + 1}, column {cell[1] + 1}"


def _walls(grid: np.ndarray, cell: tuple[int, int]) -> tuple[bool, bool]:
    """(a wall above or below the cell, a wall left or right of it)."""
    r, c = cell
    rows, cols = grid.shape

    def wall(rr: int, cc: int) -> bool:
        return not (0 <= rr < rows and 0 <= cc < cols) or grid[rr, cc] == WALL

    return wall(r - 1, c) or wall(r + 1, c), wall(r, c - 1) or wall(r, c + 1)


def _move(step: Replayed) -> tuple[str, str, str]:
    """(what the move did, the kind of move: push | walk | bump | none, where the box went) read off the grids."""
    before, after = parse_grid(step.before.observation), parse_grid(step.after.observation)
    if step.action not in ("up", "down", "left", "right"):
        return "sent no move the game could read", "none", ""
    if before is None or after is None:
        return f"moved {step.action}", "walk", ""
    boxes_before = set(_cells(before, BOX, BOX_ON_TARGET))
    boxes_after = set(_cells(after, BOX, BOX_ON_TARGET))
    player = _cells(before, PLAYER, PLAYER_ON_TARGET)
    at = f" from {_where(player[0])}" if player else ""
    moved = sorted(boxes_after - boxes_before)
    if moved:
        src = sorted(boxes_before - boxes_after)
        dst = moved[0]
        onto = " onto a target" if after[dst] == BOX_ON_TARGET else ""
        return f"pushed the box {step.action} from {_where(src[0])} to {_where(dst)}{onto}", "push", _where(dst)
    if np.array_equal(before, after):
        return f"moved {step.action}{at} into a wall or an immovable box, which changed nothing", "bump", ""
    return f"walked {step.action}{at}", "walk", ""


def _dead_rule(step: Replayed) -> str:
    """The rule for a push after which no plan exists: a corner, a wall, or another dead spot."""
    before, after = parse_grid(step.before.observation), parse_grid(step.after.observation)
    moved = (
        sorted(set(_cells(after, BOX)) - set(_cells(before, BOX))) if before is not None and after is not None else []
    )
    if moved:
        vertical, horizontal = _walls(after, moved[0])
        if vertical and horizontal:
            return (
                "Never push a box into a corner that is not a target: with walls on two adjacent sides it can never "
                "move again. Before each push, look at the cell the box will land on."
            )
        if vertical or horizontal:
            return (
                "Never push a box against a wall unless its target lies along that wall: from there it can only "
                "slide along the wall, never away from it."
            )
    return (
        "Before each push, check that the box can still be pushed to a target from where it lands: a box you can no "
        "longer get behind is lost for good."
    )


def _off_path_rule(kind: str) -> str:
    if kind == "push":
        return (
            "Push the box toward its target, never away from it: a push away costs at least two moves to undo, and a "
            "room gives only a few steps."
        )
    if kind == "bump":
        return (
            "Read the grid before moving: a move into a wall, or a push of a box against a wall or another box, "
            "changes nothing and still costs a step."
        )
    if kind == "none":
        return (
            "End every reply with exactly one move (up, down, left or right) inside <action> </action>; a reply the "
            "game cannot read moves nothing."
        )
    return (
        "Walk the shortest way to the side of the box opposite its target, then push: a detour of a few steps is "
        "enough to run out of moves."
    )


def hindsight_skill(trajectory, steps: list[Replayed], title: str = "Sokoban") -> tuple[str, str]:
    """(episode_summary, episode_skill) of one Sokoban episode from its replay (`plan_length` as the probe)."""
    if not steps:
        return generic_skill(title, trajectory, steps)
    n = len(steps)
    shortest = steps[0].probe_before
    off_path = [s for s in steps if None not in (s.probe_before, s.probe_after) and s.probe_after >= s.probe_before]
    if trajectory.won:
        win = steps[-1]
        did, _, _ = _move(win)
        pushes = [s for s in steps if _move(s)[1] == "push"]
        first = pushes[0] if pushes else win
        summary = (
            f"The agent solved the room in {n} step(s); the expert's shortest plan from the start has {shortest} "
            f"move(s). Its first push came at turn {first.step}."
        )
        detour = ""
        if off_path:
            late = off_path[0]
            detour = (
                f" It took {n} steps where {shortest} suffice: at turn {late.step} it {_move(late)[0]}, where the "
                f"expert moved {late.expert}."
            )
        skill = (
            f"At turn {win.step} the agent {did}, which solved the room, the expert's move there too.{detour} Walk "
            "to the side of the box opposite its target, then push it straight toward the target, getting behind it "
            "again before each change of direction."
        )
        return summary, skill
    dead = next((s for s in steps if s.probe_before is not None and s.probe_after is None), None)
    turn = dead or (off_path[0] if off_path else None)
    if turn is None:
        return generic_skill(title, trajectory, steps)
    did, kind, _ = _move(turn)
    expert = turn.expert or "no move"
    if dead is not None:
        effect = "after which no sequence of moves can solve the room"
        rule = _dead_rule(turn)
    else:
        effect = (
            f"which left the expert's shortest plan at {turn.probe_after} move(s) instead of {turn.probe_before - 1}"
        )
        rule = _off_path_rule(kind)
    summary = (
        f"The agent failed the room after {n} step(s) (the shortest plan from the start has {shortest} move(s)). At "
        f"turn {turn.step} it {did}, {effect}; the expert moved {expert} there."
    )
    skill = f"At turn {turn.step} the agent {did}, {effect}, where the expert moved {expert}. {rule}"
    return summary, skill
