"""The Sokoban expert: the shortest plan by breadth-first search over (player, boxes) states.

Moves follow `game.Sokoban.step` (gym-sokoban 0.0.6 `_push`/`_move`): an action pushes the box ahead when the cell
behind it is floor or an empty target, else moves onto a free floor or target, else changes nothing. A room is
solved when every target holds a box (gym-sokoban `_check_if_all_boxes_on_target`). The search never expands an
action that changes nothing, so the plan it returns is a shortest one; among equally short plans it prefers the
action order up, down, left, right (1, 2, 3, 4) at each step, which makes it deterministic.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from seedcli.envs.sokoban.game import Sokoban

_CHANGE = {1: (-1, 0), 2: (1, 0), 3: (0, -1), 4: (0, 1)}


def solve(game: Sokoban, max_len: int | None = None) -> list[int] | None:
    """The shortest list of actions (1 up, 2 down, 3 left, 4 right) that solves `game` from its current state:
    [] when it is already solved, None when no plan fits in `max_len` actions (default: the steps the game has
    left, `max_steps - num_env_steps`). Does not change `game`."""
    limit = game.max_steps - game.num_env_steps if max_len is None else max_len
    fixed = game.room_fixed
    state = game.room_state
    walls = fixed == 0
    targets = frozenset(map(tuple, np.argwhere(fixed == 2).tolist()))
    boxes = frozenset(map(tuple, np.argwhere((state == 3) | (state == 4)).tolist()))
    player = tuple(int(v) for v in game.player_position)
    rows, cols = fixed.shape

    def free(cell: tuple[int, int], boxes: frozenset) -> bool:
        r, c = cell
        return 0 <= r < rows and 0 <= c < cols and not walls[r, c] and cell not in boxes

    if targets <= boxes:
        return []
    start = (player, boxes)
    parents: dict = {start: None}
    frontier = deque([(start, 0)])
    while frontier:
        (pos, bxs), depth = frontier.popleft()
        if depth >= limit:
            continue
        for action, (dr, dc) in _CHANGE.items():
            ahead = (pos[0] + dr, pos[1] + dc)
            if ahead in bxs:
                behind = (ahead[0] + dr, ahead[1] + dc)
                if not free(behind, bxs):
                    continue
                nxt = (ahead, (bxs - {ahead}) | {behind})
            elif free(ahead, bxs):
                nxt = (ahead, bxs)
            else:
                continue
            if nxt in parents:
                continue
            parents[nxt] = ((pos, bxs), action)
            if targets <= nxt[1]:
                return _plan(parents, nxt)
            frontier.append((nxt, depth + 1))
    return None


def _plan(parents: dict, node) -> list[int]:
    actions = []
    while parents[node] is not None:
        node, action = parents[node]
        actions.append(action)
    return actions[::-1]
