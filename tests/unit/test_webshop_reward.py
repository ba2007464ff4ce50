"""WebShop's purchase reward (seedcli.envs.webshop.reward) on hand-worked purchases.

The goal: J. Crew men's straight-fit chino (B07GYWW3NY), attributes [straight leg, machine washable], options
color: coal grey and size: 36w x 32l, price cap 80 dollars. With 2 attributes, 2 options and the price term the
reward is r_type * (attributes + options + price) / 5.
"""

from __future__ import annotations

import pytest

from seedcli.envs.webshop.reward import get_reward, normalize_color, title_nouns

GOAL_OPTIONS = {"color": "coal grey", "size": "36w x 32l"}


@pytest.fixture(scope="module")
def goal(shop):
    product = shop.product_by_asin["B07GYWW3NY"]
    goal = next(g for g in shop.goals if g["asin"] == product["asin"] and g["goal_options"] == GOAL_OPTIONS)
    return {**goal, "price_upper": 80.0}


def test_exact_purchase_scores_one(shop, goal):
    product = shop.product_by_asin["B07GYWW3NY"]
    reward, info = get_reward(product, goal, price=59.5, options=dict(GOAL_OPTIONS))
    assert reward == 1.0  # (2 + 2 + 1) / 5
    assert info["r_type"] == 1.0 and info["r_att"] == 1.0 and info["r_option"] == 1.0 and info["r_price"] is True


def test_wrong_option_loses_its_share(shop, goal):
    # size 30w x 30l shares only "x" with ('size', '36w x 32l'): token_set_ratio 61 <= 85, so (2 + 1 + 1) / 5.
    # The colour still matches: "coal grey" normalises to "grey", which is a token of "color coal grey".
    product = shop.product_by_asin["B07GYWW3NY"]
    reward, info = get_reward(product, goal, price=59.5, options={"color": "coal grey", "size": "30w x 30l"})
    assert reward == pytest.approx(0.8)
    assert info["r_option"] == 0.5


def test_over_budget_loses_the_price_term(shop, goal):
    product = shop.product_by_asin["B07GYWW3NY"]
    reward, info = get_reward(product, goal, price=85.0, options=dict(GOAL_OPTIONS))
    assert reward == pytest.approx(0.8)  # (2 + 2 + 0) / 5
    assert info["r_price"] is False


def test_other_product_of_the_same_query(shop, goal):
    # Wrangler men's straight leg jean (same query "men's jeans"), bought without options at $63.05:
    # title nouns shared with the goal's 12: men, fit, straight -> title_score 3/12 = 0.25, r_type 1 (query match);
    # attributes: "straight leg" is one of its own, "machine washable" appears nowhere -> 1 of 2;
    # options: none chosen -> 0; price 63.05 <= 80 -> 1. Reward (1 + 0 + 1) / 5 = 0.4.
    other = shop.product_by_asin["B01MSP2B0I"]
    assert other["query"] == goal["query"]
    assert len(title_nouns(goal["name"])) == 12
    reward, info = get_reward(other, goal, price=shop.prices["B01MSP2B0I"], options={})
    assert info["title_score"] == 0.25 and info["r_type"] == 1.0
    assert info["r_att"] == 0.5 and info["r_option"] == 0.0
    assert reward == pytest.approx(0.4)


def test_unrelated_product_scores_zero(shop, goal):
    # A novel shares no title noun with the chino: title_score 0 -> r_type 0 -> reward 0 whatever else matches.
    book = next(p for p in shop.products if p["name"].startswith("A Novel ; Still Life with Bread Crumbs"))
    reward, info = get_reward(book, goal, price=5.0, options={})
    assert info["title_score"] == 0.0 and info["r_type"] == 0.0
    assert reward == 0.0


def test_goal_options_are_compared_as_pairs_quirk(shop):
    # WebShop passes goal options as (name, value) pairs: normalize_color tests tuple membership, so the pair
    # ('color', 'black1901') stays as it is while the bought "black1901" becomes "black". thefuzz then compares
    # "black" with "color black1901": no common token, no match. An exact purchase of such a goal scores < 1.
    assert normalize_color(("color", "black")) == "black"
    assert normalize_color(("color", "black1901")) == ("color", "black1901")
    assert normalize_color("black1901") == "black"
    goal = next(g for g in shop.goals if g["goal_options"].get("color") == "black1901")
    product = shop.product_by_asin[goal["asin"]]
    price = min(shop.prices[goal["asin"]], goal["price_upper"])
    reward, info = get_reward(product, goal, price=price, options=dict(goal["goal_options"]))
    n_opts = len(goal["goal_options"])
    assert info["r_option"] == pytest.approx((n_opts - 1) / n_opts)
    assert reward < 1.0


def test_goal_without_options_has_no_option_term(shop):
    goal = next(g for g in shop.goals if not g["goal_options"])
    product = shop.product_by_asin[goal["asin"]]
    reward, info = get_reward(product, goal, price=shop.prices[goal["asin"]], options={})
    assert "r_option" not in info
    assert reward == pytest.approx(
        info["r_type"] * (info["r_att"] * len(goal["attributes"]) + 1) / (len(goal["attributes"]) + 1)
    )


# A fresh process in which nothing has loaded the shop: get_reward alone, as the module docstring shows it.
_ALONE = """
import json, sys
from pathlib import Path
from seedcli.envs.webshop import reward
from seedcli.envs.webshop.data import ATTRIBUTE_FILE, PRODUCT_FILE, load_products, resolve_data_root
assert not reward._NOUNS  # nothing registered the nouns
root = resolve_data_root()
product = next(p for p in load_products(root / PRODUCT_FILE, root / ATTRIBUTE_FILE) if p["asin"] == "B07GYWW3NY")
goal = {"query": product["query"], "product_category": product["product_category"], "name": product["name"],
        "attributes": ["straight leg", "machine washable"], "goal_options": {}, "price_upper": 80.0}
total, info = reward.get_reward(product, goal, price=59.5, options={})
print(json.dumps({"reward": total, "r_type": info["r_type"], "title_score": info["title_score"]}))
"""


def test_get_reward_alone_reads_the_nouns_from_the_data_root(shop, tmp_path):
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "WEBSHOP_DATA": str(shop.root)}
    proc = subprocess.run([sys.executable, "-c", _ALONE], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    # the same product bought for its own goal: type reward 1, every noun of the name matched
    assert out == {"reward": 1.0, "r_type": 1.0, "title_score": 1.0}


def test_a_name_missing_everywhere_says_where_it_looked(shop, monkeypatch):
    import importlib.util

    from seedcli.envs.webshop import reward

    if importlib.util.find_spec("en_core_web_sm") is not None:
        pytest.skip("en_core_web_sm is installed: the name is parsed instead")
    monkeypatch.setattr(reward, "_SPACY", None)
    with pytest.raises(Exception, match=r"is not in the title_nouns.json of .*webshop and spaCy's en_core_web_sm"):
        title_nouns("A Product Name No Data Root Knows 12345")
