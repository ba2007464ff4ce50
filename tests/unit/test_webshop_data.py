"""WebShop's products and goals as WebShop builds them (seedcli.envs.webshop.data)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from seedcli.envs.webshop.data import (
    EXPECTED_GOALS,
    generate_product_prices,
    get_synthetic_goals,
    load_shop,
    parse_pricing,
    resolve_data_root,
)
from seedcli.errors import UserError


def test_pricing_strings_parse_as_webshop_does():
    assert parse_pricing("$19.99$27.99") == ([19.99, 27.99], "$19.99 to $27.99")
    assert parse_pricing("$1,847.00") == ([1847.0], "$1847.0")
    assert parse_pricing("") == ([100.0], "$100.0")  # WebShop's default for a missing price


def test_goal_count_and_splits(shop):
    assert len(shop.products) == 1000
    assert len(shop.goals) == EXPECTED_GOALS == 6910
    assert len({g["asin"] for g in shop.goals}) == 415  # products with an instruction
    assert len(shop.split_goals("test")) == 500 and shop.split_goals("train")[0] == 500
    assert len(shop.split_goals("train")) == 6410


def test_goals_are_one_per_option_combination(shop):
    # The first test goal's product has 2 option rows; every combination of them is a goal.
    asin = shop.goals[0]["asin"]
    options = shop.product_by_asin[asin]["options"]
    expected = 1
    for values in options.values():
        expected *= len(values)
    assert sum(g["asin"] == asin for g in shop.goals) == expected
    goal = shop.goals[0]
    assert sorted(goal["goal_options"]) == sorted(options)
    for name, value in goal["goal_options"].items():
        assert f"{name}: {value}" in goal["instruction_text"]
    assert goal["instruction_text"].endswith(f", and price lower than {goal['price_upper']:.2f} dollars")


def test_options_are_lower_cased_with_slashes_spelled_out(shop):
    values = [v for p in shop.products for vs in p["options"].values() for v in vs]
    assert values and all(v == v.lower() and "/" not in v for v in values)
    assert any(" | " in v for v in values)


def test_price_caps_follow_webshops_sampling(shop):
    # price_upper is the larger of two draws from the first four multiples of 10 above the price
    for goal in shop.goals[:200]:
        price = shop.prices[goal["asin"]]
        above = [10.0 * i for i in range(1, 100) if 10.0 * i > price][:4]
        if len(above) >= 2:
            assert goal["price_upper"] in above[1:]
        else:
            assert goal["price_upper"] == 1000000


def test_goal_order_is_seeded(shop):
    products = shop.products
    rng_a, rng_b = random.Random(0), random.Random(0)
    goals_a = get_synthetic_goals(products, generate_product_prices(products, rng_a), rng_a)
    goals_b = get_synthetic_goals(products, generate_product_prices(products, rng_b), rng_b)
    random.Random(0).shuffle(goals_a)
    random.Random(0).shuffle(goals_b)
    assert [g["instruction_text"] for g in goals_a] == [g["instruction_text"] for g in goals_b]
    assert [g["instruction_text"] for g in goals_a[:50]] == [g["instruction_text"] for g in shop.goals[:50]]
    other = load_shop(shop.root, seed=1)
    assert [g["instruction_text"] for g in other.goals[:50]] != [g["instruction_text"] for g in shop.goals[:50]]


def test_missing_data_is_a_one_line_error(tmp_path: Path, monkeypatch):
    with pytest.raises(UserError, match="WebShop data not found at") as err:
        resolve_data_root(tmp_path)
    assert "\n" not in str(err.value)
    monkeypatch.setenv("WEBSHOP_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(UserError, match="WEBSHOP_DATA="):
        resolve_data_root()
