"""WebShop's products and synthetic goals, built exactly as WebShop's `load_products` and `get_synthetic_goals` do.

    root = resolve_data_root()              # explicit path, $WEBSHOP_DATA, or ../shared/webshop
    shop = load_shop(root)                  # cached per process: products, prices, goals, nouns, search index
    shop.goals[0]["instruction_text"], len(shop.goals)   # 6,910 goals; test = 0-499, train = 500 onward

The randomness follows verl-agent / SEED with seed 0: one `random.Random(seed)` draws the prices of products sold
at a price range (`generate_product_prices`) and then each goal's price cap (`get_synthetic_goals`); a fresh
`random.Random(seed)` then shuffles the goals, as `SimServer` does after `random.seed(seed)`.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from seedcli.envs.base import find_data_root
from seedcli.errors import UserError

PRODUCT_FILE = "items_shuffle_1000.json"
ATTRIBUTE_FILE = "items_ins_v2_1000.json"
NOUNS_FILE = "title_nouns.json"
LUCENE_REFERENCE_FILE = "lucene_reference.jsonl"
EXPECTED_GOALS = 6910  # WebShop's small setting: 415 products with an instruction, one goal per option combination
TEST_GOALS = 500  # verl-agent and SEED: test = goals 0-499, train = goals 500 onward
PRICE_RANGE = [10.0 * i for i in range(1, 100)]
_SCRAPE_KEYS = (
    "product_information",
    "brand",
    "brand_url",
    "list_price",
    "availability_quantity",
    "availability_status",
    "total_reviews",
    "total_answered_questions",
    "seller_id",
    "seller_name",
    "fulfilled_by_amazon",
    "fast_track_message",
    "aplus_present",
    "small_description_old",
)


def _has_data(root: Path) -> bool:
    return (root / PRODUCT_FILE).is_file() and (root / ATTRIBUTE_FILE).is_file()


def resolve_data_root(explicit: str | os.PathLike | None = None) -> Path:
    """The WebShop data folder (holding items_shuffle_1000.json and items_ins_v2_1000.json): `explicit`, else
    $WEBSHOP_DATA, else ../shared/webshop next to the current directory or the repository."""
    need = f"{PRODUCT_FILE} and {ATTRIBUTE_FILE}"

    def missing(source: str, root: Path | None) -> str:
        if source == "explicit":
            return f"WebShop data not found at {root} (no {need} inside): pass the folder that holds them"
        if source == "env":
            return f"WebShop data not found: WEBSHOP_DATA={root} has no {need} inside; set WEBSHOP_DATA to the folder that holds them"
        return f"WebShop data not found: set WEBSHOP_DATA=/path/to/webshop (the folder holding {need}, from WebShop's `setup.sh -d small`)"

    return find_data_root(explicit, "WEBSHOP_DATA", "webshop", _has_data, missing)


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read WebShop data file {path}: {err}; restore it from WebShop's data") from err


def parse_pricing(pricing: str | None) -> tuple[list[float], str]:
    """(prices, price tag) of an Amazon price string: "$19.99$27.99" -> ([19.99, 27.99], "$19.99 to $27.99");
    an empty price is WebShop's default ([100.0], "$100.0")."""
    if pricing is None or not pricing:
        return [100.0], "$100.0"
    prices = [float(Decimal(re.sub(r"[^\d.]", "", price))) for price in pricing.split("$")[1:]]
    if len(prices) == 1:
        return prices, f"${prices[0]}"
    return prices[:2], f"${prices[0]} to ${prices[1]}"


def load_products(product_path: Path, attribute_path: Path) -> list[dict[str, Any]]:
    """WebShop's `load_products(..., human_goals=False)`: the product dicts the text environment serves."""
    products = _read_json(product_path)
    attributes = _read_json(attribute_path)
    if not isinstance(products, list) or not isinstance(attributes, dict):
        raise UserError(f"{product_path} must hold a list of products and {attribute_path} a dict keyed by ASIN")
    asins: set[str] = set()
    all_products: list[dict[str, Any]] = []
    for p in products:
        for key in _SCRAPE_KEYS:
            p.pop(key, None)
        asin = p["asin"]
        if asin == "nan" or len(asin) > 10 or asin in asins:
            continue
        asins.add(asin)
        p["Title"] = p["name"]
        p["Description"] = p["full_description"]
        p["Reviews"] = []  # the small setting ships no reviews
        p["Rating"] = "N.A."
        small = p["small_description"]
        p["BulletPoints"] = small if isinstance(small, list) else [small]
        p["pricing"], p["Price"] = parse_pricing(p.get("pricing"))

        options: dict[str, list[str]] = {}
        option_to_image: dict[str, Any] = {}
        for option_name, option_contents in (p["customization_options"] or {}).items():
            if option_contents is None:
                continue
            values = []
            for content in option_contents:
                value = content["value"].strip().replace("/", " | ").lower()
                values.append(value)
                option_to_image[value] = content.get("image", None)
            options[option_name.lower()] = values
        p["options"] = options
        p["option_to_image"] = option_to_image

        attrs = attributes.get(asin, {})
        p["Attributes"] = attrs["attributes"] if "attributes" in attrs else ["DUMMY_ATTR"]
        p["instruction_text"] = attrs.get("instruction", None)
        p["instruction_attributes"] = attrs.get("instruction_attributes", None)
        p["MainImage"] = p["images"][0] if p.get("images") else None
        p["query"] = p["query"].lower().strip()
        all_products.append(p)
    return all_products


def generate_product_prices(products: list[dict[str, Any]], rng: random.Random) -> dict[str, float]:
    """WebShop's `generate_product_prices`: the listed price, or a uniform draw inside a price range."""
    prices: dict[str, float] = {}
    for p in products:
        pricing = p["pricing"]
        if not pricing:
            price = 100.0
        elif len(pricing) == 1:
            price = pricing[0]
        else:
            price = rng.uniform(*pricing[:2])
        prices[p["asin"]] = price
    return prices


def get_synthetic_goals(
    products: list[dict[str, Any]], prices: dict[str, float] | None, rng: random.Random
) -> list[dict[str, Any]]:
    """WebShop's `get_synthetic_goals`: one goal per option combination of every product with an instruction."""
    goals: list[dict[str, Any]] = []
    cnt_atts: dict[str, int] = defaultdict(int)
    for product in products:
        if product.get("instruction_text") is None:
            continue
        asin = product["asin"]
        attributes = product["instruction_attributes"]
        assert len(attributes) > 0
        price_upper, price_text = 1000000, ""
        if prices is not None:
            price_range = [p for p in PRICE_RANGE if p > prices[asin]][:4]
            if len(price_range) >= 2:
                _, price_upper = sorted(rng.sample(price_range, 2))
                price_text = f", and price lower than {price_upper:.2f} dollars"
        options = product["options"]
        option_names = sorted(options)
        for combination in itertools.product(*(options[name] for name in option_names)):
            goal_options = dict(zip(option_names, combination, strict=True))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = " with " + option_text if option_text else ""
            goals.append(
                {
                    "asin": asin,
                    "category": product["category"],
                    "query": product["query"],
                    "name": product["Title"],  # WebShop sets 'name' twice; the second, the Title, wins
                    "product_category": product["product_category"],
                    "instruction_text": f"{product['instruction_text']}{option_text}{price_text}",
                    "attributes": attributes,
                    "price_upper": price_upper,
                    "goal_options": goal_options,
                }
            )
            for att in attributes:
                cnt_atts[att] += 1
    for goal in goals:
        goal["weight"] = sum(1.0 / cnt_atts[att] for att in goal["attributes"]) / len(goal["attributes"])
    return goals


def search_document(product: dict[str, Any]) -> str:
    """The text WebShop indexes for a product (search_engine/convert_product_file_format.py)."""
    option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in product["options"].items())
    return " ".join([product["Title"], product["Description"], product["BulletPoints"][0], option_text]).lower()


@dataclass
class Shop:
    """Everything one process needs to serve WebShop: products, prices, shuffled goals, title nouns, search."""

    root: Path
    seed: int
    products: list[dict[str, Any]]
    product_by_asin: dict[str, dict[str, Any]]
    prices: dict[str, float]
    goals: list[dict[str, Any]]
    nouns: dict[str, list[str]]
    attribute_to_asins: dict[str, set[str]] = field(default_factory=dict)
    _engine: Any = None

    @property
    def engine(self):
        """The BM25 search engine over the products (built on first use, about a second for 1,000 products)."""
        if self._engine is None:
            from seedcli.envs.webshop.engine import SearchEngine

            self._engine = SearchEngine(self.products)
        return self._engine

    def split_goals(self, split: str) -> range:
        """Goal indices of a split: test = 0-499, train = 500 onward (verl-agent's convention)."""
        if split == "test":
            return range(0, min(TEST_GOALS, len(self.goals)))
        if split == "train":
            return range(min(TEST_GOALS, len(self.goals)), len(self.goals))
        raise UserError(f"unknown WebShop split {split!r}: use test or train")


_CACHE: dict[tuple[str, int], Shop] = {}
_LOCK = threading.Lock()


def load_shop(root: str | os.PathLike | None = None, seed: int = 0) -> Shop:
    """The WebShop data of `root` (resolved as `resolve_data_root` does), built once per process and seed."""
    path = resolve_data_root(root)
    key = (str(path), int(seed))
    with _LOCK:
        if key not in _CACHE:
            products = load_products(path / PRODUCT_FILE, path / ATTRIBUTE_FILE)
            if not products:
                raise UserError(f"WebShop data at {path} has no products in {PRODUCT_FILE}: restore the file")
            rng = random.Random(seed)
            prices = generate_product_prices(products, rng)
            goals = get_synthetic_goals(products, prices, rng)
            random.Random(seed).shuffle(goals)
            nouns_path = path / NOUNS_FILE
            nouns = _read_json(nouns_path) if nouns_path.is_file() else {}
            from seedcli.envs.webshop.reward import set_title_nouns

            set_title_nouns(nouns)
            attribute_to_asins: dict[str, set[str]] = defaultdict(set)
            for p in products:
                for a in p["Attributes"]:
                    attribute_to_asins[a].add(p["asin"])
            _CACHE[key] = Shop(
                path,
                int(seed),
                products,
                {p["asin"]: p for p in products},
                prices,
                goals,
                nouns,
                dict(attribute_to_asins),
            )
        return _CACHE[key]
