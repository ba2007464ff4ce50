"""WebShop's reward: its purchase reward (web_agent_site/engine/goal.py, ported with its quirks), what the trainer
trains on, and the leak rule of its hindsight skills.

Trained on: the episode's success, a purchase whose reward is exactly 1.0 (`outcome`). GRPO scores every turn of an
episode `SUCCESS_REWARD`·won − `INVALID_PENALTY` if that turn's reply was invalid (`projection.project_action`), and
normalises the scores of a group by their mean only (`ADVANTAGE_NORM`, as the SEED code does for WebShop); the
trajectory's reward is `SUCCESS_REWARD`·won. Logged and evaluated, not trained on: the purchase reward itself, in
[0, 1] (`StepResult.reward` of the buying step and the episode's `StepResult.score`; eval's "score").

    reward, info = get_reward(product, goal, price=12.5, options={"color": "black", "size": "large"})

reward = r_type * (attributes matched + options matched + [price <= cap]) / (attributes + options + 1).
Quirks kept on purpose, because every published WebShop number has them:
- the goal options reach `normalize_color` and `fuzz.token_set_ratio` as `(name, value)` pairs, so a goal color is
  normalised only when its value is exactly a colour word, and thefuzz compares the pair's text "('color', 'navy')";
- an attribute not matched by fuzzy matching still counts when it occurs as a substring of the title, the bullet
  points or the description;
- the type reward reads the nouns spaCy finds in the product names (`title_nouns.json` holds them for every product;
  a session hands its shop's nouns to `get_reward`; without them the data root's file is read on first use, so
  `get_reward` works on its own, and `load_title_nouns(root)` names another data root).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from thefuzz import fuzz

from seedcli.envs.base import merge_spans
from seedcli.envs.webshop.data import read_title_nouns, resolve_data_root
from seedcli.errors import UserError

SUCCESS_REWARD = 10.0  # episode reward = SUCCESS_REWARD · won
INVALID_PENALTY = 0.1  # per invalid turn
ADVANTAGE_NORM = "mean"  # a group's turn scores: minus their mean (the SEED code does not divide by the std here)

COLOR_SET = [
    "alabaster",
    "apricot",
    "aqua",
    "ash",
    "asphalt",
    "azure",
    "banana",
    "beige",
    "black",
    "blue",
    "blush",
    "bordeaux",
    "bronze",
    "brown",
    "burgundy",
    "camel",
    "camo",
    "caramel",
    "champagne",
    "charcoal",
    "cheetah",
    "chestnut",
    "chocolate",
    "christmas",
    "coffee",
    "cognac",
    "copper",
    "coral",
    "cranberry",
    "cream",
    "crystal",
    "dark",
    "denim",
    "eggplant",
    "elephant",
    "espresso",
    "fuchsia",
    "gold",
    "granite",
    "grape",
    "graphite",
    "grass",
    "gray",
    "green",
    "grey",
    "heather",
    "indigo",
    "ivory",
    "ivy",
    "khaki",
    "lavender",
    "lemon",
    "leopard",
    "light",
    "lilac",
    "lime",
    "magenta",
    "maroon",
    "mauve",
    "merlot",
    "midnight",
    "mint",
    "mocha",
    "multicolor",
    "mushroom",
    "mustard",
    "natural",
    "navy",
    "nude",
    "olive",
    "orange",
    "peach",
    "pewter",
    "pink",
    "plum",
    "purple",
    "rainbow",
    "red",
    "rose",
    "royal",
    "rust",
    "sand",
    "sapphire",
    "seashell",
    "silver",
    "skull",
    "slate",
    "steel",
    "stone",
    "stonewash",
    "sunflower",
    "tan",
    "taupe",
    "teal",
    "tiger",
    "turquoise",
    "violet",
    "walnut",
    "wheat",
    "white",
    "wine",
    "yellow",
]

_NOUNS: dict[str, list[str]] = {}  # product name -> spaCy noun tokens (`set_title_nouns`, or the data root's file)
_DEFAULT_NOUNS: dict[str, Any] = {}  # {"root": the data root whose title_nouns.json was read (None: none found)}
_SPACY: Any = None


def set_title_nouns(nouns: Mapping[str, list[str]]) -> None:
    """Register the noun tokens of product names (title_nouns.json) that the type reward reads."""
    _NOUNS.update(nouns)


def load_title_nouns(root: str | os.PathLike | None = None) -> Path | None:
    """Register the title_nouns.json of a WebShop data root, found as the environment finds it (`root`, else
    $WEBSHOP_DATA, else ../shared/webshop); names registered earlier keep their nouns. Returns the data root, or None
    when `root` is None and there is no data root (names then come from `set_title_nouns` or spaCy)."""
    try:
        found = resolve_data_root(root)
    except UserError:
        if root is not None:
            raise
        found = None
    _DEFAULT_NOUNS["root"] = found
    if found is not None:
        for name, nouns in read_title_nouns(found).items():
            _NOUNS.setdefault(name, nouns)
    return found


def title_nouns(name: str, known: Mapping[str, list[str]] | None = None) -> list[str]:
    """Lower-cased NOUN/PROPN tokens of a product name: from `known` (the shop's title_nouns.json), else from those
    registered (`set_title_nouns`, or the data root's file read on first use), else from spaCy if installed."""
    if known is not None and name in known:
        return known[name]
    nouns = _NOUNS.get(name)
    if nouns is None and not _DEFAULT_NOUNS:
        load_title_nouns()  # first use: so that get_reward works on its own, without the environment
        nouns = _NOUNS.get(name)
    if nouns is not None:
        return nouns
    global _SPACY
    if _SPACY is None:
        try:
            import spacy  # optional: only for product names outside title_nouns.json

            _SPACY = spacy.load("en_core_web_sm")
        except (ImportError, OSError) as err:
            root = _DEFAULT_NOUNS.get("root")
            where = f"the title_nouns.json of {root}" if root else "title_nouns.json (no WebShop data root found)"
            raise UserError(
                f"product name {name[:60]!r} is not in {where} and spaCy's en_core_web_sm is not "
                "installed: add the name to title_nouns.json or `pip install spacy` and its en_core_web_sm model"
            ) from err
    nouns = [t.text.lower() for t in _SPACY(name) if t.pos_ in ("PNOUN", "NOUN", "PROPN")]
    _NOUNS[name] = nouns
    return nouns


def normalize_color(color_string: Any) -> Any:
    """The first colour word found in the string, else the string unchanged (on a tuple: tuple membership)."""
    for norm_color in COLOR_SET:
        if norm_color in color_string:
            return norm_color
    return color_string


def get_type_reward(
    purchased_product: Mapping[str, Any], goal: Mapping[str, Any], nouns: Mapping[str, list[str]] | None = None
) -> dict[str, Any]:
    """r_type: 1 for the same kind of product, 0.5 when query, category and title all differ, 0.1 / 0 for little
    or no title-noun overlap (`nouns`: the product names' nouns, `title_nouns`)."""
    query_match = purchased_product["query"] == goal["query"]
    purchased_category = [x.strip() for x in purchased_product["product_category"].split("›")]
    goal_category = [x.strip() for x in goal["product_category"].split("›")]
    category_match = len(set(purchased_category) & set(goal_category)) >= 2

    purchased_type = title_nouns(purchased_product["name"], nouns)
    desired_type = title_nouns(goal["name"], nouns)
    n_intersect_type = len(set(purchased_type) & set(desired_type))
    title_score = 0.2 if len(desired_type) == 0 else n_intersect_type / len(desired_type)

    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match, "title_score": title_score}


def get_attribute_reward(purchased_product: Mapping[str, Any], goal: Mapping[str, Any]) -> tuple[float, int]:
    """(share of goal attributes matched, count): fuzzy match against the product's attributes, else a substring
    of its title, bullet points or description."""
    purchased_attrs = purchased_product["Attributes"]
    goal_attrs = goal["attributes"]
    num_attr_matches = 0
    for g_attr in goal_attrs:
        matched = False
        for p_attr in purchased_attrs:
            if fuzz.token_set_ratio(p_attr, g_attr) > 85:
                num_attr_matches += 1
                matched = True
                break
        if not matched and (
            g_attr in purchased_product["Title"].lower()
            or g_attr in " ".join(purchased_product["BulletPoints"]).lower()
            or g_attr in purchased_product["Description"].lower()
        ):
            num_attr_matches += 1
    return num_attr_matches / len(goal_attrs), num_attr_matches


def get_option_reward(purchased_options: Iterable[Any], goal_options: Iterable[Any]) -> tuple[float | None, int]:
    """(share of goal options matched, count), None when the goal has no options."""
    purchased = [normalize_color(o) for o in purchased_options]
    wanted = [normalize_color(o) for o in goal_options]
    num_option_matches = 0
    for g_option in wanted:
        for p_option in purchased:
            if fuzz.token_set_ratio(p_option, g_option) > 85:
                num_option_matches += 1
                break
    r_option = num_option_matches / len(wanted) if len(wanted) > 0 else None
    return r_option, num_option_matches


def get_reward(
    product: Mapping[str, Any],
    goal: Mapping[str, Any],
    price: float,
    options: Mapping[str, str],
    nouns: Mapping[str, list[str]] | None = None,
) -> tuple[float, dict[str, Any]]:
    """WebShop's `get_reward(..., verbose=True)`: the purchase reward in [0, 1] and its parts (r_type, r_att,
    r_option when the goal has options, r_price, and their weights). `nouns`: the shop's title nouns (`title_nouns`)."""
    r_type = get_type_reward(product, goal, nouns)
    r_price = (price <= goal["price_upper"]) if goal["price_upper"] > 0 else None
    r_att, num_attr_matches = get_attribute_reward(product, goal)
    goal_options = goal["goal_options"]
    # WebShop hands dict goals over as .items(): (name, value) pairs, which thefuzz compares as text.
    r_option, num_option_matches = get_option_reward(
        list(options.values()), goal_options.items() if isinstance(goal_options, dict) else goal_options
    )
    denominator = len(goal["attributes"]) + len(goal_options) + 1
    total = (num_attr_matches + num_option_matches + r_price) / denominator
    total *= r_type["r_type"]
    info: dict[str, Any] = {
        "r_type": r_type["r_type"],
        "r_att": r_att,
        "w_att": len(goal["attributes"]) / denominator,
        "query_match": r_type["query_match"],
        "category_match": r_type["category_match"],
        "title_score": r_type["title_score"],
    }
    if r_option is not None:
        info["r_option"] = r_option
        info["w_option"] = len(goal_options) / denominator
    if r_price is not None:
        info["r_price"] = r_price
        info["w_price"] = 1 / denominator
    return total, info


def outcome(purchase_reward: float, done: bool) -> tuple[bool, float]:
    """(success, score) of a session: once it is over (bought), success is a purchase reward of exactly 1.0 and the
    score is that reward; before, neither."""
    return bool(done and purchase_reward == 1.0), float(purchase_reward) if done else 0.0


def goal_spans(skill: str, asin: str, title: str) -> list[tuple[int, int]]:
    """The (start, end) spans of `skill` naming the goal product: its ASIN (not inside a longer run of letters and
    digits) or its whole title (words separated by any whitespace), both case-insensitive; overlaps merged."""
    spans: list[tuple[int, int]] = []
    if asin.strip():
        pattern = rf"(?<![A-Za-z0-9]){re.escape(asin.strip())}(?![A-Za-z0-9])"
        spans += [m.span() for m in re.finditer(pattern, skill, re.IGNORECASE)]
    words = title.split()
    if words:
        pattern = r"\s+".join(re.escape(w) for w in words)
        spans += [m.span() for m in re.finditer(pattern, skill, re.IGNORECASE)]
    return merge_spans(spans)
