"""EZPoints port against the original gym-cards EZPointEnv (verl-agent d0b9724, `gym_cards/envs/ezpoints.py`).

Golden values were recorded by running the ORIGINAL module (copied to /tmp, `gymnasium` stubbed for its base
classes, Pillow 13.0.0, numpy 2.4.6, its own img/ folder, which is byte-identical to ../shared/ezpoints/cards):
`env.reset(seed=s)` then `env.step(a)` for each action, writing down `info["Cards"]`, `info["Numbers"]`, the step's
(reward, terminated, truncated, info["won"]), `"".join(map(str, info["Formula"]))` and sha256(obs.tobytes()).
"""

import hashlib
import itertools
import random

import numpy as np
import pytest

from seedcli.envs.ezpoints.expert import solve
from seedcli.envs.ezpoints.game import (
    ACTION_NAMES,
    EZPoints,
    evaluate,
    has_original_font,
    resolve_data_root,
    test_seeds,
    train_seeds,
)
from seedcli.errors import UserError

# seed -> (info["Cards"], info["Numbers"]) after the original's reset(seed=seed)
GOLDEN_CARDS = {
    0: (["H4", "C8"], [4, 8]),
    1: (["H4", "C3"], [4, 3]),
    2: (["H2", "S6"], [2, 6]),
    3: (["S5", "D7"], [5, 7]),
    7: (["S7", "C5"], [7, 5]),
    42: (["HQ", "H2"], [10, 2]),
    1000: (["C4", "H8"], [4, 8]),
    12345: (["H8", "D4"], [8, 4]),
    65535: (["S6", "D2"], [6, 2]),
    65536: (["C4", "H8"], [4, 8]),
    4294967294: (["D4", "S3"], [4, 3]),
}

# (seed, actions) -> per step (reward, terminated, truncated, won, formula), from the original
GOLDEN_STEPS = [
    (3, [4, 10, 6, 12], [(0, 0, 0, 0, "5"), (0, 0, 0, 0, "5+"), (0, 0, 0, 0, "5+7"), (10, 1, 0, 1, "5+7")]),
    (3, [6, 11, 4, 12], [(0, 0, 0, 0, "7"), (0, 0, 0, 0, "7*"), (0, 0, 0, 0, "7*5"), (0, 1, 0, 0, "7*5")]),
    # a reused 5, a 1 and a 10 not on the cards: refused, nothing changes; "57" is one number
    (3, [4, 4, 0, 9, 6, 12], [(0, 0, 0, 0, "5")] * 4 + [(0, 0, 0, 0, "57"), (0, 1, 0, 0, "57")]),
    (3, [4, 12], [(0, 0, 0, 0, "5"), (0, 1, 0, 0, "5")]),  # "=" with one card: ends, no reward
    # Python's grammar: unary plus and "5++7" are valid and worth 12
    (
        3,
        [10, 4, 10, 6, 12],
        [(0, 0, 0, 0, "+"), (0, 0, 0, 0, "+5"), (0, 0, 0, 0, "+5+"), (0, 0, 0, 0, "+5+7"), (10, 1, 0, 1, "+5+7")],
    ),
    (
        3,
        [4, 10, 10, 6, 12],
        [(0, 0, 0, 0, "5"), (0, 0, 0, 0, "5+"), (0, 0, 0, 0, "5++"), (0, 0, 0, 0, "5++7"), (10, 1, 0, 1, "5++7")],
    ),
    # a 5-token formula that does not parse
    (
        3,
        [4, 10, 6, 11, 12],
        [(0, 0, 0, 0, "5"), (0, 0, 0, 0, "5+"), (0, 0, 0, 0, "5+7"), (0, 0, 0, 0, "5+7*"), (0, 1, 0, 0, "5+7*")],
    ),
    # truncation: a step on a 6-token formula is truncated (not terminated) and changes nothing, "=" included
    (
        3,
        [10, 10, 10, 10, 10, 4, 6, 12],
        [(0, 0, 0, 0, "+" * k) for k in range(1, 6)]
        + [(0, 0, 0, 0, "+++++5"), (0, 0, 1, 0, "+++++5"), (0, 0, 1, 0, "+++++5")],
    ),
    (3, [10] * 6 + [4, 12], [(0, 0, 0, 0, "+" * k) for k in range(1, 7)] + [(0, 0, 1, 0, "++++++")] * 2),
    # -1 (verl-agent's unparseable reply) is a no-op; the original keeps playing after "=": it wins again
    (
        3,
        [4, -1, 10, -1, 6, 12, 4, 12],
        [(0, 0, 0, 0, "5")] * 2
        + [(0, 0, 0, 0, "5+")] * 2
        + [(0, 0, 0, 0, "5+7"), (10, 1, 0, 1, "5+7"), (0, 0, 0, 0, "5+7"), (10, 1, 0, 1, "5+7")],
    ),
    (1, [3, 11, 2, 12], [(0, 0, 0, 0, "4"), (0, 0, 0, 0, "4*"), (0, 0, 0, 0, "4*3"), (10, 1, 0, 1, "4*3")]),
    (1, [3, 10, 2, 12], [(0, 0, 0, 0, "4"), (0, 0, 0, 0, "4+"), (0, 0, 0, 0, "4+3"), (0, 1, 0, 0, "4+3")]),
    (
        1,
        [3, 11, 11, 2, 12],
        [(0, 0, 0, 0, "4"), (0, 0, 0, 0, "4*"), (0, 0, 0, 0, "4**"), (0, 0, 0, 0, "4**3"), (0, 1, 0, 0, "4**3")],
    ),
]

# sha256 of the original's observation pixels (obs.tobytes()), drawn with DejaVuSans 20 (Debian fonts-dejavu-core)
GOLDEN_IMAGES = {
    (3, (4, 10)): "121feebfdcd5d58468902170a7d62e4d8c31013c4fb5d6c6e752637b73f529d6",  # S5 D7, "Formula: 5 +"
    (42, ()): "5e1221484714646f89076f7c788dfe30ee1478d7821c90a31ed8415e2c88422c",  # HQ H2, "Formula: "
}


@pytest.mark.parametrize("seed", sorted(GOLDEN_CARDS))
def test_cards_match_the_original(seed):
    game = EZPoints(seed)
    assert (game.cards, game.numbers) == GOLDEN_CARDS[seed]
    assert game.formula == [] and not game.won


def test_seeding_leaves_the_global_random_state_alone():
    random.seed(5)
    state = random.getstate()
    EZPoints(3)
    assert random.getstate() == state


def test_actions_are_the_originals_order():
    assert ACTION_NAMES == ["1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "+", "*", "="]


@pytest.mark.parametrize(("seed", "actions", "want"), GOLDEN_STEPS)
def test_steps_match_the_original(seed, actions, want):
    game = EZPoints(seed)
    got = []
    for action in actions:
        reward, terminated, truncated, won = game.step(action)
        got.append((reward, int(terminated), int(truncated), int(won), "".join(game.formula)))
    assert got == want


def test_formula_is_a_list_of_str_and_bad_actions_raise():
    game = EZPoints(3)
    game.step(4)
    game.step(10)
    assert game.formula == ["5", "+"] and game.formula_text() == "5+"
    for bad in (13, -2):
        with pytest.raises(ValueError):
            game.step(bad)


def test_evaluate_follows_python_grammar():
    assert evaluate(["5", "+", "7"]) == 12
    assert evaluate(["2", "*", "*", "3"]) == 8
    assert evaluate(["+", "6", "*", "2"]) == 12
    assert evaluate(["5", "+"]) is None and evaluate([]) is None and evaluate(["*", "5"]) is None


def test_text_names_the_cards_in_words():
    game = EZPoints(42)
    assert game.text() == "Cards: Queen of Hearts, 2 of Hearts. Formula:"
    game.step(9)
    assert game.text() == "Cards: Queen of Hearts, 2 of Hearts. Formula: 10"


@pytest.mark.parametrize(("key", "digest"), sorted(GOLDEN_IMAGES.items()))
def test_image_matches_the_original(key, digest):
    seed, actions = key
    game = EZPoints(seed)
    for action in actions:
        game.step(action)
    image = game.image()
    assert image.shape == (300, 300, 3) and image.dtype == np.uint8
    assert tuple(image[5, 5]) == (0x35, 0x65, 0x4D)  # the green canvas
    if not has_original_font():
        pytest.skip("DejaVuSans.ttf not found: the formula line uses Pillow's default font, pixels differ")
    assert hashlib.sha256(image.tobytes()).hexdigest() == digest


def test_missing_card_folder_is_a_user_error(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="EZPoints data not found"):
        resolve_data_root(tmp_path)
    monkeypatch.setenv("EZPOINTS_DATA", str(tmp_path))
    with pytest.raises(UserError, match="EZPOINTS_DATA"):
        EZPoints(3).image()


def test_splits():
    seeds = test_seeds()
    assert len(seeds) == 512 and len(set(seeds)) == 512
    assert all(2**16 <= s < 2**32 - 1 for s in seeds)
    # np.random.seed(1000); np.random.randint(2**16, 2**32 - 1, size=128): verl-agent's first validation batch
    assert seeds[:3] == [2807211443, 882774615, 494016583] and test_seeds(3) == seeds[:3]
    assert seeds[128:130] == [1882228812, 327075419]  # its second batch
    assert all(0 <= s < 2**16 - 1 for s in train_seeds(100))


def _winnable(numbers):
    """Independent enumeration: any token string of <= 5 tokens (each card number at most as often as dealt,
    operators + and *) that Python's eval puts at 12 with both cards used."""
    tokens = [str(n) for n in set(numbers)] + ["+", "*"]
    for length in range(3, 6):
        for formula in itertools.product(tokens, repeat=length):
            used = sorted(int(t) for t in formula if t.isdigit())
            if used != sorted(numbers):
                continue
            try:
                if eval("".join(formula)) == 12:  # noqa: S307 (digits, + and * only)
                    return True
            except SyntaxError:
                pass
    return False


def test_expert_wins_every_solvable_test_game():
    unsolvable = 0
    for seed in test_seeds(100):
        game = EZPoints(seed)
        if not _winnable(game.numbers):
            unsolvable += 1
            assert solve(game) == []
            continue
        plan = solve(game)
        results = [game.step(action) for action in plan]
        assert results[-1] == (10, True, False, True), (seed, game.cards, plan)
        assert len(plan) == 4
    assert unsolvable == 0  # by construction the second card makes 12 with the first by + or *


def test_expert_reports_a_lost_position():
    game = EZPoints(3)  # 5 and 7
    game.step(4)
    game.step(11)  # "5 *": 5*7, 5**7, 5*+7 ... none is 12
    assert solve(game) == []


def test_without_dejavu_the_default_font_draws(monkeypatch):
    from PIL import ImageFont

    from seedcli.envs.ezpoints import game as game_module

    real_truetype = ImageFont.truetype

    def no_font_files(font, *args, **kwargs):  # font files are missing; Pillow's embedded default font is not
        if isinstance(font, str):
            raise OSError("cannot open resource")
        return real_truetype(font, *args, **kwargs)

    monkeypatch.setattr(ImageFont, "truetype", no_font_files)
    game_module.formula_font.cache_clear()
    try:
        assert not has_original_font()
        game = EZPoints(3)
        game.step(4)
        image = game.image()
        assert image.shape == (300, 300, 3)
        assert (image[250:290, 10:120] == 255).all(axis=-1).any()  # some white text on the formula line
    finally:
        game_module.formula_font.cache_clear()
