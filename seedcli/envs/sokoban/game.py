"""Sokoban, ported from verl-agent and gym-sokoban 0.0.6 (no `gym`): rooms, moves, rewards, text and image.

Which original each piece follows:

- Room generation: verl-agent `agent_system/environments/env_package/sokoban/sokoban/room_utils.py`,
  `generate_room` with `room_topology_generation`, `place_boxes_and_player`, `reverse_playing`,
  `depth_first_search`, `reverse_move`, `box_displacement_score` and `add_random_player_movement` (written here
  as `_generate_room`, `_topology`, `_place`, `_ReversePlay`, `_reverse_move`, `_displacement`, `_wander`).
  `num_gen_steps` is gym-sokoban's `int(1.7 * (dim[0] + dim[1]))` (20 for 6×6).
- Seeding: verl-agent `sokoban/env.py` `SokobanEnv.reset` generates the room under `utils.set_seed(seed)`, which
  seeds Python's `random` and NumPy's global (legacy) generator and restores both afterwards. Here the generation
  draws from private `random.Random(seed)` and `numpy.random.RandomState(seed)`: the module-level `random`
  functions are bound methods of one `random.Random` and `np.random.seed`/`np.random.randint` act on one global
  `RandomState`, so the draws are the same numbers and the caller's generators are never touched. On a generation
  error (`RuntimeError`/`RuntimeWarning`) the original retries with `abs(hash(str(seed))) % 2**32`; Python salts
  `hash(str)` per process, so this port uses the value that hash has with `PYTHONHASHSEED=0` (`_str_hash`:
  SipHash-1-3 with a zero key, as CPython 3.11+ hashes an ASCII str), making the retry deterministic and equal
  to the original run under `PYTHONHASHSEED=0`.
- Moves and rewards: gym-sokoban 0.0.6 `envs/sokoban_env.py` `SokobanEnv.step` (`_push`, `_move`,
  `_calc_reward`, `_check_if_done`, `_check_if_maxsteps`), behind verl-agent's `SokobanEnv.step`: action 0
  ("still", an invalid reply) returns -0.1, not done, not won, not effective, and does not count a step;
  actions 1-4 (up, down, left, right, verl-agent's `sokoban_projection` mapping) are gym-sokoban's push actions
  (push a box if one is ahead and the cell behind it is free, else move). Rewards: -0.1 a step, +1 when a box goes
  onto a target, -1 when one leaves a target, +10 when all boxes are on targets (summed in that order, so a
  winning push is exactly `-0.1 + 1 + 10`). `done` is gym-sokoban's: all boxes on targets or `num_env_steps ==
  max_steps` (equality, as the original: a step past max_steps is not done). `won` is verl-agent's `success()`,
  `effective` its `action_is_effective` (the player moved).
- `state()` and `text()`: verl-agent `SokobanEnv.render` modes `state` and `tiny_rgb_array` (`GRID_LOOKUP`).
- `image()`: gym-sokoban `envs/render_utils.py` `room_to_rgb` with the tiles of `gym_sokoban/envs/surface/`
  (found as `../shared/sokoban/tiles/`, $SOKOBAN_DATA or an explicit `data_root`; see `resolve_data_root`).
- Splits: verl-agent `envs.py` `SokobanMultiProcessEnv.reset` draws `np.random.randint(0, 2**16 - 1)` for train
  and `np.random.randint(2**16, 2**32 - 1)` for validation after `np.random.seed(seed)`, the validation envs being
  built with `env.seed + 1000` (`env_manager.make_envs`; the launchers use `env.seed=0`). `train_seeds` and
  `test_seeds` do the same with a private `RandomState` (seed 1000 for the test list).
"""

from __future__ import annotations

import os
import random
from functools import lru_cache
from pathlib import Path

import numpy as np

from seedcli.envs.base import find_data_root
from seedcli.errors import UserError

# Room encoding (gym-sokoban): 0 wall, 1 floor, 2 target, 3 box on target, 4 box, 5 player, 6 player on target.
WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = range(7)

# verl-agent SokobanEnv.GRID_LOOKUP (text rendering, "tiny_rgb_array").
GRID_LOOKUP = {0: " # \t", 1: " _ \t", 2: " O \t", 3: " √ \t", 4: " X \t", 5: " P \t", 6: " S \t"}
ACTION_NAMES = {0: "still", 1: "up", 2: "down", 3: "left", 4: "right"}

# gym-sokoban render_utils.room_to_rgb surfaces, in room-code order.
TILE_NAMES = ("wall", "floor", "box_target", "box_on_target", "box", "player", "player_on_target")
TILE = 16

# room_utils.CHANGE_COORDINATES / sokoban_env.CHANGE_COORDINATES: 0 up, 1 down, 2 left, 3 right.
_CHANGE = {0: (-1, 0), 1: (1, 0), 2: (0, -1), 3: (0, 1)}

_MASKS = [
    [[0, 0, 0], [1, 1, 1], [0, 0, 0]],
    [[0, 1, 0], [0, 1, 0], [0, 1, 0]],
    [[0, 0, 0], [1, 1, 0], [0, 1, 0]],
    [[0, 0, 0], [1, 1, 0], [1, 1, 0]],
    [[0, 0, 0], [0, 1, 1], [0, 1, 0]],
]
_DIRECTIONS = [(1, 0), (0, 1), (-1, 0), (0, -1)]
_MAX_EXPLORED = 300000  # depth_first_search stops once this many states are explored

TRAIN_SEED_HIGH = 2**16 - 1  # np.random.randint(0, 2**16 - 1): high is exclusive, as in verl-agent
TEST_SEED_LOW, TEST_SEED_HIGH = 2**16, 2**32 - 1
TEST_LIST_SEED = 1000  # verl-agent builds its validation envs with env.seed + 1000, env.seed = 0
TEST_LIST_SIZE = 512


# --------------------------------------------------------------------------------------------------------------
# Room generation (verl-agent room_utils.py)


def _topology(rng: random.Random, dim: tuple[int, int], p_change_directions: float, num_steps: int) -> np.ndarray:
    """room_topology_generation: a random walk stamping floor masks, walls on the border."""
    dim_x, dim_y = dim
    direction = rng.sample(_DIRECTIONS, 1)[0]
    position = np.array([rng.randint(1, dim_x - 1), rng.randint(1, dim_y - 1)])
    level = np.zeros(dim, dtype=int)
    for _ in range(num_steps):
        if rng.random() < p_change_directions:
            direction = rng.sample(_DIRECTIONS, 1)[0]
        position = position + direction
        position[0] = max(min(position[0], dim_x - 2), 1)
        position[1] = max(min(position[1], dim_y - 2), 1)
        mask = rng.sample(_MASKS, 1)[0]
        start = position - 1
        level[start[0] : start[0] + 3, start[1] : start[1] + 3] += mask
    level[level > 0] = 1
    level[:, [0, dim_y - 1]] = 0
    level[[0, dim_x - 1], :] = 0
    return level


def _place(nrng: np.random.RandomState, room: np.ndarray, num_boxes: int) -> np.ndarray:
    """place_boxes_and_player (one player): the player, then each box (as its target, code 2) on a free floor."""
    possible = np.where(room == 1)
    count = possible[0].shape[0]
    if count <= num_boxes + 1:
        raise RuntimeError(f"Not enough free spots (#{count}) to place 1 player and {num_boxes} boxes.")
    ind = nrng.randint(count)
    room[possible[0][ind], possible[1][ind]] = 5
    for _ in range(num_boxes):
        possible = np.where(room == 1)
        ind = nrng.randint(possible[0].shape[0])
        room[possible[0][ind], possible[1][ind]] = 2
    return room


def _displacement(box_mapping: dict) -> int:
    """box_displacement_score: summed Manhattan distances of the boxes from their targets."""
    return int(sum(abs(int(v[0]) - int(k[0])) + abs(int(v[1]) - int(k[1])) for k, v in box_mapping.items()))


def _reverse_move(room_state, room_structure, box_mapping, last_pull, action):
    """reverse_move for the pull actions 0-3: step back, pulling an adjacent box along."""
    where = np.where(room_state == 5)
    player = np.array([where[0][0], where[1][0]])
    change = _CHANGE[action % 4]
    nxt = player + change
    if room_state[nxt[0], nxt[1]] in [1, 2]:
        room_state[player[0], player[1]] = room_structure[player[0], player[1]]
        room_state[nxt[0], nxt[1]] = 5
        if action < 4:
            box = player - change
            if room_state[box[0], box[1]] in [3, 4]:
                room_state[player[0], player[1]] = 3
                room_state[box[0], box[1]] = room_structure[box[0], box[1]]
                for k in box_mapping:
                    if box_mapping[k] == (box[0], box[1]):
                        box_mapping[k] = (player[0], player[1])
                        last_pull = k
    return room_state, box_mapping, last_pull


class _ReversePlay:
    """reverse_playing / depth_first_search, with the original's module globals as attributes."""

    def __init__(self, room_state: np.ndarray, room_structure: np.ndarray, search_depth: int):
        box_locations = np.where(room_structure == 2)
        self.num_boxes = len(box_locations[0])
        box_mapping = {}
        for i in range(self.num_boxes):
            box = (box_locations[0][i], box_locations[1][i])
            box_mapping[box] = box
        self.structure = room_structure
        self.explored: set[bytes] = set()
        self.best_score = -1
        self.best_room: np.ndarray | None = None
        self.best_mapping = box_mapping
        self.search(room_state, box_mapping, 0, (-1, -1), search_depth)

    def search(self, room_state, box_mapping, box_swaps, last_pull, ttl):
        ttl -= 1
        if ttl <= 0 or len(self.explored) >= _MAX_EXPLORED:
            return
        key = room_state.tobytes()  # the original keys by marshal.dumps(room_state): the array's raw bytes
        if key in self.explored:
            return
        score = box_swaps * _displacement(box_mapping)
        if np.where(room_state == 2)[0].shape[0] != self.num_boxes:
            score = 0
        if score > self.best_score:
            self.best_room = room_state.copy()
            self.best_score = score
            self.best_mapping = box_mapping.copy()
        self.explored.add(key)
        for action in range(4):  # ACTION_LOOKUP's pull actions; the move actions (>= 4) are skipped
            nxt_state, nxt_mapping, nxt_pull = _reverse_move(
                room_state.copy(), self.structure, box_mapping.copy(), last_pull, action
            )
            swaps = box_swaps + 1 if nxt_pull != last_pull else box_swaps
            self.search(nxt_state, nxt_mapping, swaps, nxt_pull, ttl)


def _wander(rng: random.Random, room_state, room_structure, move_probability, continue_probability=0.5, max_steps=3):
    """add_random_player_movement: maybe walk the player 1-3 steps, never back onto a visited cell."""
    if rng.random() > move_probability:
        return room_state
    where = np.where(room_state == 5)
    player = np.array([where[0][0], where[1][0]])
    previous = [tuple(player)]
    steps = 0
    while steps < max_steps:
        valid = []
        for action in range(4):
            nxt = player + _CHANGE[action]
            if room_state[nxt[0], nxt[1]] in [1, 2] and tuple(nxt) not in previous:
                valid.append((action, nxt))
        if not valid:
            break
        _, nxt = rng.choice(valid)
        room_state[player[0], player[1]] = room_structure[player[0], player[1]]
        room_state[nxt[0], nxt[1]] = 5
        player = nxt
        previous.append(tuple(player))
        steps += 1
        if steps >= max_steps or rng.random() > continue_probability:
            break
    return room_state


def _generate_room(rng, nrng, dim, num_steps, num_boxes, search_depth, p_change_directions=0.35, tries=4):
    """generate_room: (room_fixed, room_state, box_mapping); RuntimeError/RuntimeWarning as the original."""
    box_mapping: dict = {}
    room_state = room_structure = np.zeros(dim)
    for _ in range(tries):
        room = _topology(rng, dim, p_change_directions, num_steps)
        room = _place(nrng, room, num_boxes)
        room_structure = np.copy(room)
        room_structure[room_structure == 5] = 1
        room_state = room.copy()
        room_state[room_state == 2] = 4
        play = _ReversePlay(room_state, room_structure, search_depth)
        room_state, box_mapping = play.best_room, play.best_mapping
        room_state[room_state == 3] = 4
        if _displacement(box_mapping) > 0:
            break
    if _displacement(box_mapping) == 0:
        raise RuntimeWarning("Generated Model with score == 0")
    move_probability = 0.8 if _displacement(box_mapping) == 1 else 0.5
    room_state = _wander(rng, room_state, room_structure, move_probability)
    return room_structure, room_state, box_mapping


# --------------------------------------------------------------------------------------------------------------
# The deterministic retry seed


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & 0xFFFFFFFFFFFFFFFF


def _siphash13(data: bytes, k0: int = 0, k1: int = 0) -> int:
    """SipHash-1-3 (CPython's `Python/pyhash.c` siphash13), unsigned 64-bit."""
    mask = 0xFFFFFFFFFFFFFFFF
    v0, v1, v2, v3 = k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573

    def rnd(v0, v1, v2, v3):
        v0 = (v0 + v1) & mask
        v1 = _rotl(v1, 13) ^ v0
        v0 = _rotl(v0, 32)
        v2 = (v2 + v3) & mask
        v3 = _rotl(v3, 16) ^ v2
        v0 = (v0 + v3) & mask
        v3 = _rotl(v3, 21) ^ v0
        v2 = (v2 + v1) & mask
        v1 = _rotl(v1, 17) ^ v2
        v2 = _rotl(v2, 32)
        return v0, v1, v2, v3

    tail_len = len(data) % 8
    for i in range(0, len(data) - tail_len, 8):
        m = int.from_bytes(data[i : i + 8], "little")
        v3 ^= m
        v0, v1, v2, v3 = rnd(v0, v1, v2, v3)
        v0 ^= m
    b = ((len(data) & 0xFF) << 56) | int.from_bytes(data[len(data) - tail_len :], "little")
    v3 ^= b
    v0, v1, v2, v3 = rnd(v0, v1, v2, v3)
    v0 ^= b
    v2 ^= 0xFF
    for _ in range(3):
        v0, v1, v2, v3 = rnd(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


def _str_hash(text: str) -> int:
    """`hash(text)` of an ASCII str under PYTHONHASHSEED=0 on CPython 3.11+ (signed; -1 becomes -2)."""
    h = _siphash13(text.encode("ascii"))
    h = h - (1 << 64) if h >= 1 << 63 else h
    return -2 if h == -1 else h


def retry_seed(seed: int) -> int:
    """The seed verl-agent's reset retries with after a generation error: abs(hash(str(seed))) % 2**32, with
    hash as under PYTHONHASHSEED=0."""
    return abs(_str_hash(str(seed))) % (2**32)


# --------------------------------------------------------------------------------------------------------------
# Tiles


def _has_tiles(root: Path) -> bool:
    return all((root / "tiles" / f"{name}.png").is_file() for name in TILE_NAMES)


def resolve_data_root(explicit: str | os.PathLike | None = None) -> Path:
    """The Sokoban data root (holding tiles/*.png): `explicit`, else $SOKOBAN_DATA, else ../shared/sokoban next
    to the current directory or the repository."""
    need = "tiles/{" + ",".join(TILE_NAMES) + "}.png"

    def missing(source: str, root: Path | None) -> str:
        if source == "explicit":
            return f"Sokoban tiles not found at {root} (no {need} inside): pass the folder that holds tiles/"
        if source == "env":
            return f"Sokoban tiles not found: SOKOBAN_DATA={root} has no {need} inside"
        return f"Sokoban tiles not found: set SOKOBAN_DATA=/path/to/sokoban (the folder holding {need})"

    return find_data_root(explicit, "SOKOBAN_DATA", "sokoban", _has_tiles, missing)


@lru_cache(maxsize=8)
def load_tiles(root: Path) -> np.ndarray:
    """The seven 16×16 RGB tiles, stacked in room-code order: uint8 (7, 16, 16, 3)."""
    from PIL import Image

    tiles = []
    for name in TILE_NAMES:
        path = Path(root) / "tiles" / f"{name}.png"
        try:
            with Image.open(path) as im:
                tile = np.asarray(im.convert("RGB"), dtype=np.uint8)
        except OSError as err:
            raise UserError(f"cannot read Sokoban tile {path}: {err}; restore it from gym-sokoban 0.0.6") from err
        if tile.shape != (TILE, TILE, 3):
            raise UserError(f"Sokoban tile {path} is {tile.shape[1]}x{tile.shape[0]}, not {TILE}x{TILE}")
        tiles.append(tile)
    return np.stack(tiles)


# --------------------------------------------------------------------------------------------------------------
# The game


class Sokoban:
    """One Sokoban episode: the room of `seed`, gym-sokoban's moves and rewards (see the module docstring)."""

    def __init__(
        self,
        seed: int,
        dim: tuple[int, int] = (6, 6),
        num_boxes: int = 1,
        search_depth: int = 30,
        max_steps: int = 15,
        data_root: str | os.PathLike | None = None,
    ):
        self.seed = int(seed)
        self.dim = (int(dim[0]), int(dim[1]))
        self.num_boxes = int(num_boxes)
        self.search_depth = int(search_depth)
        self.max_steps = int(max_steps)
        self.num_gen_steps = int(1.7 * (self.dim[0] + self.dim[1]))
        self.data_root = data_root
        self.generation_seed = self.seed  # the seed the room came from after any retries
        seed_now = self.seed
        for _ in range(1000):
            try:
                fixed, state, mapping = _generate_room(
                    random.Random(seed_now),
                    np.random.RandomState(seed_now),
                    self.dim,
                    self.num_gen_steps,
                    self.num_boxes,
                    self.search_depth,
                )
                break
            except (RuntimeError, RuntimeWarning):
                seed_now = retry_seed(seed_now)
        else:
            raise RuntimeError(f"no Sokoban room for seed {self.seed} after 1000 retries")
        self.generation_seed = seed_now
        self.room_fixed, self.room_state, self.box_mapping = fixed, state, mapping
        self.player_position = np.argwhere(self.room_state == 5)[0]
        self.num_env_steps = 0
        self.reward_last = 0.0
        self.boxes_on_target = 0

    # ---- observations (verl-agent SokobanEnv.render)

    def state(self) -> np.ndarray:
        """The room, with 6 for the player on a target (render mode 'state')."""
        return np.where((self.room_state == 5) & (self.room_fixed == 2), 6, self.room_state)

    def text(self) -> str:
        """verl-agent's text grid (render mode 'tiny_rgb_array'): cells ' # \\t', rows joined by '\\n'."""
        return "\n".join("".join(GRID_LOOKUP[cell] for cell in row) for row in self.state().tolist())

    def image(self) -> np.ndarray:
        """gym-sokoban's rgb_array: one 16×16 tile a cell, uint8 (16·rows, 16·cols, 3)."""
        tiles = load_tiles(resolve_data_root(self.data_root))
        state = self.state()
        rows, cols = state.shape
        return tiles[state].transpose(0, 2, 1, 3, 4).reshape(rows * TILE, cols * TILE, 3).copy()

    # ---- dynamics (gym-sokoban SokobanEnv.step behind verl-agent SokobanEnv.step)

    def success(self) -> bool:
        return self.boxes_on_target == self.num_boxes

    def finished(self) -> bool:
        """verl-agent's finished(): max_steps used or solved."""
        return self.num_env_steps >= self.max_steps or self.success()

    def step(self, action: int) -> tuple[float, bool, bool, bool]:
        """(reward, done, won, effective) for action 0 still, 1 up, 2 down, 3 left, 4 right."""
        if action not in ACTION_NAMES or isinstance(action, bool):
            raise ValueError(f"Sokoban action must be 0-4, got {action!r}")
        if action == 0:
            return -0.1, False, False, False
        previous = self.player_position
        self.num_env_steps += 1
        self._push(action)
        self._calc_reward()
        done = self._all_boxes_on_target() or self.max_steps == self.num_env_steps
        effective = not np.array_equal(previous, self.player_position)
        return self.reward_last, bool(done), self.success(), effective

    def _push(self, action: int) -> bool:
        change = _CHANGE[(action - 1) % 4]
        new_position = self.player_position + change
        current = self.player_position.copy()
        new_box = new_position + change
        if new_box[0] >= self.room_state.shape[0] or new_box[1] >= self.room_state.shape[1]:
            return False
        can_push = self.room_state[new_position[0], new_position[1]] in [3, 4]
        can_push &= self.room_state[new_box[0], new_box[1]] in [1, 2]
        if not can_push:
            return self._move(action)
        self.player_position = new_position
        self.room_state[new_position[0], new_position[1]] = 5
        self.room_state[current[0], current[1]] = self.room_fixed[current[0], current[1]]
        self.room_state[new_box[0], new_box[1]] = 3 if self.room_fixed[new_box[0], new_box[1]] == 2 else 4
        return True

    def _move(self, action: int) -> bool:
        change = _CHANGE[(action - 1) % 4]
        new_position = self.player_position + change
        current = self.player_position.copy()
        if self.room_state[new_position[0], new_position[1]] in [1, 2]:
            self.player_position = new_position
            self.room_state[new_position[0], new_position[1]] = 5
            self.room_state[current[0], current[1]] = self.room_fixed[current[0], current[1]]
            return True
        return False

    def _calc_reward(self) -> None:
        self.reward_last = -0.1
        empty_targets = self.room_state == 2
        player_on_target = (self.room_fixed == 2) & (self.room_state == 5)
        current = self.num_boxes - int(np.where(empty_targets | player_on_target)[0].shape[0])
        if current > self.boxes_on_target:
            self.reward_last += 1
        elif current < self.boxes_on_target:
            self.reward_last += -1
        if self._all_boxes_on_target():
            self.reward_last += 10
        self.boxes_on_target = current

    def _all_boxes_on_target(self) -> bool:
        empty_targets = self.room_state == 2
        player_hiding_target = (self.room_fixed == 2) & (self.room_state == 5)
        return np.where(empty_targets | player_hiding_target)[0].shape[0] == 0


# --------------------------------------------------------------------------------------------------------------
# Splits


def train_seeds(n: int, seed: int = 0) -> list[int]:
    """`n` training seeds as verl-agent draws them: RandomState(seed).randint(0, 2**16 - 1) (high exclusive)."""
    return [int(s) for s in np.random.RandomState(seed).randint(0, TRAIN_SEED_HIGH, size=n)]


def test_seeds(n: int = TEST_LIST_SIZE) -> list[int]:
    """The fixed test list's first `n` seeds (at most 512): NumPy RandomState(1000).randint(2**16, 2**32 - 1,
    size=512), verl-agent's first validation draw with env.seed 0."""
    if not 0 <= n <= TEST_LIST_SIZE:
        raise ValueError(f"the Sokoban test list has {TEST_LIST_SIZE} seeds, asked for {n}")
    return _test_list()[:n]


@lru_cache(maxsize=1)
def _test_list() -> list[int]:
    draws = np.random.RandomState(TEST_LIST_SEED).randint(TEST_SEED_LOW, TEST_SEED_HIGH, size=TEST_LIST_SIZE)
    return [int(s) for s in draws]
