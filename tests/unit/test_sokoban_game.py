"""The Sokoban port (seedcli.envs.sokoban) against the original verl-agent + gym-sokoban 0.0.6 behaviour.

Golden values were recorded by running the ORIGINAL code: verl-agent's
`agent_system/environments/env_package/sokoban/sokoban/env.py` `SokobanEnv("tiny_rgb_array", dim_room=(6, 6),
num_boxes=1, max_steps=15, search_depth=30)` on gym-sokoban 0.0.6's `SokobanEnv` (gym stubbed out), with
`PYTHONHASHSEED=0`: `env.reset(seed=s)`, then `env.render("state")`, `env.render("tiny_rgb_array")` and
`(reward, done, info["won"], info["action_is_effective"])` of each `env.step(a)`. The expert's plan for seed 0 is
the original `room_utils.get_shortest_action_path`'s.
"""

import itertools
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from seedcli.envs.sokoban.expert import solve
from seedcli.envs.sokoban.game import (
    TILE_NAMES,
    Sokoban,
    _str_hash,
    resolve_data_root,
    retry_seed,
    train_seeds,
)
from seedcli.envs.sokoban.game import test_seeds as sokoban_test_seeds
from seedcli.errors import UserError

W, F, T, BT, B, P = 0, 1, 2, 3, 4, 5
WALLS = [0, 0, 0, 0, 0, 0]

# seed -> (state grid, text grid) from the original.
GOLDEN_ROOMS = {
    0: (
        [WALLS, [0, 1, 1, 1, 1, 0], [0, 0, 2, 1, 5, 0], [0, 0, 0, 4, 1, 0], [0, 0, 0, 1, 1, 0], WALLS],
        " # \t # \t # \t # \t # \t # \t\n # \t _ \t _ \t _ \t _ \t # \t\n # \t # \t O \t _ \t P \t # \t\n"
        " # \t # \t # \t X \t _ \t # \t\n # \t # \t # \t _ \t _ \t # \t\n # \t # \t # \t # \t # \t # \t",
    ),
    1: (
        [WALLS, [0, 2, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0], [0, 4, 1, 0, 0, 0], [0, 5, 1, 0, 0, 0], WALLS],
        " # \t # \t # \t # \t # \t # \t\n # \t O \t _ \t # \t # \t # \t\n # \t _ \t # \t # \t # \t # \t\n"
        " # \t X \t _ \t # \t # \t # \t\n # \t P \t _ \t # \t # \t # \t\n # \t # \t # \t # \t # \t # \t",
    ),
    42: (
        [WALLS, [0, 5, 4, 1, 2, 0], [0, 1, 1, 1, 1, 0], WALLS, WALLS, WALLS],
        " # \t # \t # \t # \t # \t # \t\n # \t P \t X \t _ \t O \t # \t\n # \t _ \t _ \t _ \t _ \t # \t\n"
        " # \t # \t # \t # \t # \t # \t\n # \t # \t # \t # \t # \t # \t\n # \t # \t # \t # \t # \t # \t",
    ),
    65536 + 7: (
        [WALLS, [0, 1, 1, 0, 0, 0], [0, 4, 5, 0, 0, 0], [0, 2, 0, 0, 0, 0], WALLS, WALLS],
        " # \t # \t # \t # \t # \t # \t\n # \t _ \t _ \t # \t # \t # \t\n # \t X \t P \t # \t # \t # \t\n"
        " # \t O \t # \t # \t # \t # \t\n # \t # \t # \t # \t # \t # \t\n # \t # \t # \t # \t # \t # \t",
    ),
    # generate_room raises for seed 3248; the original retried with abs(hash("3248")) % 2**32 (PYTHONHASHSEED=0)
    3248: (
        [WALLS, [0, 1, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0], [0, 1, 1, 5, 1, 0], [0, 1, 4, 2, 1, 0], WALLS],
        " # \t # \t # \t # \t # \t # \t\n # \t _ \t _ \t # \t # \t # \t\n # \t _ \t # \t # \t # \t # \t\n"
        " # \t _ \t _ \t P \t _ \t # \t\n # \t _ \t X \t O \t _ \t # \t\n # \t # \t # \t # \t # \t # \t",
    ),
}

# (seed, [(action, reward, done, won, effective), ...]) from the original.
GOLDEN_PLAYS = [
    (  # the original BFS plan [2, 2, 3, 1, 4, 1, 3] between a still and two more moves
        0,
        [(0, -0.1, False, False, False)]
        + [(a, -0.1, False, False, True) for a in (2, 2, 3, 1, 4, 1)]
        + [(3, 10.9, True, True, True), (3, 9.9, True, True, False), (0, -0.1, False, False, False)],
    ),
    (  # still, bump a wall, push, push onto the target, push the box into the wall, walk away while solved
        42,
        [
            (0, -0.1, False, False, False),
            (1, -0.1, False, False, False),
            (4, -0.1, False, False, True),
            (4, 10.9, True, True, True),
            (4, 9.9, True, True, False),
            (3, 9.9, True, True, True),
            (3, 9.9, True, True, True),
        ],
    ),
    (  # timeout: still does not count; done at the 15th step only (gym-sokoban checks max_steps == steps)
        1,
        [(0, -0.1, False, False, False)]
        + [(3, -0.1, False, False, False)] * 14
        + [(3, -0.1, True, False, False), (3, -0.1, False, False, False)],
    ),
    (  # a solve at the last allowed step
        42,
        [(1, -0.1, False, False, False)] * 13 + [(4, -0.1, False, False, True), (4, 10.9, True, True, True)],
    ),
]


def _corridor() -> Sokoban:
    """`# P X O _ #` in row 1 of a walled 6×6 room (set on the game as the original's attributes)."""
    g = Sokoban(0)
    g.room_fixed = np.array([WALLS, [0, 1, 1, 2, 1, 0], WALLS, WALLS, WALLS, WALLS])
    g.room_state = np.array([WALLS, [0, 5, 4, 2, 1, 0], WALLS, WALLS, WALLS, WALLS])
    g.player_position = np.argwhere(g.room_state == 5)[0]
    g.num_env_steps = g.boxes_on_target = 0
    return g


@pytest.mark.parametrize("seed", sorted(GOLDEN_ROOMS))
def test_rooms_match_the_original(seed):
    state, text = GOLDEN_ROOMS[seed]
    g = Sokoban(seed)
    assert g.state().tolist() == state
    assert g.text() == text
    assert np.issubdtype(g.state().dtype, np.integer)
    assert (g.generation_seed != seed) == (seed == 3248)


@pytest.mark.parametrize("seed,play", GOLDEN_PLAYS)
def test_plays_match_the_original(seed, play):
    g = Sokoban(seed)
    for action, *expected in play:
        assert g.step(action) == tuple(expected), (seed, action)


def test_push_onto_and_off_a_target():
    # the original on the same corridor: 10.9 on, -1.1 off (player now on the target), then a box into the wall
    g = _corridor()
    assert g.step(4) == (10.9, True, True, True)
    assert g.step(4) == (-1.1, False, False, True)
    assert g.state()[1].tolist() == [0, 1, 1, 6, 4, 0]
    assert g.text().split("\n")[1] == " # \t _ \t _ \t S \t X \t # \t"
    assert g.step(4) == (-0.1, False, False, False)  # box against the wall: nothing moves
    assert g.step(3) == (-0.1, False, False, True)
    assert g.step(3) == (-0.1, False, False, True)
    assert g.state()[1].tolist() == [0, 5, 1, 2, 4, 0]  # the original's final state
    assert g.num_env_steps == 5


def test_generation_leaves_the_callers_generators_alone():
    import random

    random.seed(5)
    np.random.seed(5)
    expected = (random.random(), np.random.rand())
    random.seed(5)
    np.random.seed(5)
    Sokoban(3248)
    assert (random.random(), np.random.rand()) == expected
    assert Sokoban(123).state().tolist() == Sokoban(123).state().tolist()


def test_retry_seed_is_python_hash_with_hashseed_0():
    code = "print(hash('3248'), hash('0'), hash('4294967295'), abs(hash(str(7141))) % 2**32)"
    out = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONHASHSEED": "0"}, capture_output=True, text=True, check=True
    ).stdout.split()
    assert [int(v) for v in out] == [_str_hash("3248"), _str_hash("0"), _str_hash("4294967295"), retry_seed(7141)]
    assert retry_seed(3248) == 3536461583


def test_image_is_the_tiles():
    g = Sokoban(42)
    img = g.image()
    assert img.shape == (96, 96, 3) and img.dtype == np.uint8
    tiles = resolve_data_root() / "tiles"
    state = g.state()
    for (r, c), code in [((0, 0), W), ((1, 1), P), ((1, 2), B), ((1, 4), T), ((2, 1), F)]:
        assert state[r, c] == code
        tile = np.asarray(Image.open(tiles / f"{TILE_NAMES[code]}.png").convert("RGB"))
        assert np.array_equal(img[16 * r : 16 * r + 16, 16 * c : 16 * c + 16], tile)
    g.step(4)
    g.step(4)
    on_target = np.asarray(Image.open(tiles / "box_on_target.png").convert("RGB"))
    assert np.array_equal(g.image()[16:32, 64:80], on_target)


def test_missing_tiles_are_one_line(tmp_path, monkeypatch):
    (tmp_path / "tiles").mkdir()
    with pytest.raises(UserError, match="Sokoban tiles not found at"):
        Sokoban(0, data_root=tmp_path).image()
    monkeypatch.setenv("SOKOBAN_DATA", str(tmp_path))
    with pytest.raises(UserError, match="SOKOBAN_DATA="):
        resolve_data_root()
    assert Sokoban(0, data_root="/nonexistent").text()  # text needs no tiles


def test_bad_action():
    with pytest.raises(ValueError):
        Sokoban(0).step(5)


def test_splits():
    tr = train_seeds(1000, seed=3)
    assert all(0 <= s < 2**16 - 1 for s in tr) and tr == train_seeds(1000, seed=3)
    te = sokoban_test_seeds()
    assert len(te) == 512 and len(set(te)) == 512 and all(2**16 <= s < 2**32 - 1 for s in te)
    assert sokoban_test_seeds(10) == te[:10]
    # NumPy RandomState(1000).randint(2**16, 2**32 - 1, size=512), the first three:
    assert te[:3] == [2807211443, 882774615, 494016583]
    with pytest.raises(ValueError):
        sokoban_test_seeds(513)


def test_expert_matches_the_original_plan_and_solves_test_rooms():
    assert solve(Sokoban(0)) == [2, 2, 3, 1, 4, 1, 3]  # the original get_shortest_action_path's plan
    g = Sokoban(42)
    assert solve(g) == [4, 4]
    g.step(4), g.step(4)
    assert solve(g) == []
    for seed in sokoban_test_seeds(50):
        g = Sokoban(seed)
        plan = solve(g)
        assert plan, seed
        for i, action in enumerate(plan):
            reward, done, won, _ = g.step(action)
            assert done == (i == len(plan) - 1)
        assert won and reward == pytest.approx(10.9)


def test_expert_is_shortest_by_brute_force():
    seed = 65536 + 7
    plan = solve(Sokoban(seed))
    shortest = None
    for length in range(1, len(plan) + 1):
        for seq in itertools.product((1, 2, 3, 4), repeat=length):
            g = Sokoban(seed)
            if any(g.step(a)[2] for a in seq):
                shortest = length
                break
        if shortest:
            break
    assert shortest == len(plan) >= 3


def test_expert_none_when_out_of_steps():
    # test seed 1055611137 needs 16 moves, more than max_steps 15
    g = Sokoban(1055611137)
    assert solve(g) is None
    assert len(solve(g, max_len=100)) == 16
    g = Sokoban(0)
    assert solve(g, max_len=6) is None
    g = Sokoban(0, max_steps=7)
    assert len(solve(g)) == 7
