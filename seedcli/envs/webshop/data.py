"""WebShop's products and synthetic goals, built exactly as WebShop's `load_products` and `get_synthetic_goals` do.

    root = resolve_data_root()              # explicit path, $WEBSHOP_DATA, or ../shared/webshop
    shop = load_shop(root)                  # cached per process: products, prices, goals, nouns, search index
    shop.goals[0]["instruction_text"], len(shop.goals)   # 6,910 goals; test = 0-499, train = 500 onward

The randomness follows verl-agent / SEED with seed 0: one `random.Random(seed)` draws the prices of products sold
at a price range (`generate_product_prices`) and then each goal's price cap (`get_synthetic_goals`); a fresh
`random.Random(seed)` then shuffles the goals, as `SimServer` does after `random.seed(seed)`.

The data root holds the small set (items_shuffle_1000.json + items_ins_v2_1000.json) or WebShop's full product files
(items_shuffle.json + items_ins_v2.json from `setup.sh -d all`, 1.18M products); it may also name a product file
itself, its attribute file lying beside it. Both files are streamed one top-level value at a time (the full product
file is several GB), then processed exactly as `load_products` does.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import logging
import os
import random
import re
import sys
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from seedcli.envs.base import find_data_root
from seedcli.envs.lucene import BM25Index
from seedcli.errors import UserError

logger = logging.getLogger(__name__)

PRODUCT_FILE = "items_shuffle_1000.json"
ATTRIBUTE_FILE = "items_ins_v2_1000.json"
FULL_PRODUCT_FILE = "items_shuffle.json"  # WebShop's `setup.sh -d all`: 1.18M products
FULL_ATTRIBUTE_FILE = "items_ins_v2.json"
# the fields WebShop's `load_products` reads from every kept product (asin first: it decides whether one is kept)
PRODUCT_FIELDS = (
    "asin",
    "category",
    "query",
    "product_category",
    "name",
    "full_description",
    "small_description",
    "customization_options",
)
NOUNS_FILE = "title_nouns.json"
LUCENE_REFERENCE_FILE = "lucene_reference.jsonl"
EXPECTED_GOALS = 6910  # WebShop's small setting: 415 products with an instruction, one goal per option combination
TEST_GOALS = 500  # verl-agent and SEED: test = goals 0-499, train = goals 500 onward
PRICE_RANGE = [10.0 * i for i in range(1, 100)]
CATEGORIES = ("beauty", "electronics", "fashion", "garden", "grocery")  # the goals' product categories
TASK_ID_RE = re.compile(r"^goal-(\d+)$")  # `task_id`'s form
SEARCH_RETURN_N = 50  # WebShop's search page draws from its top 50 products
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


def product_files(root: Path) -> tuple[Path, Path] | None:
    """(product file, attribute file) of a data root: a folder with the small pair (preferred) or the full pair, or
    a product file `items_shuffle*.json` whose `items_ins_v2*.json` lies beside it; None when there is none."""
    root = Path(root)
    if root.is_file():
        if not root.name.startswith("items_shuffle"):
            return None
        attributes = root.with_name("items_ins_v2" + root.name[len("items_shuffle") :])
        return (root, attributes) if attributes.is_file() else None
    for products, attributes in ((PRODUCT_FILE, ATTRIBUTE_FILE), (FULL_PRODUCT_FILE, FULL_ATTRIBUTE_FILE)):
        if (root / products).is_file() and (root / attributes).is_file():
            return root / products, root / attributes
    return None


def _has_data(root: Path) -> bool:
    return product_files(root) is not None


def data_folder(root: Path) -> Path:
    """The folder of a data root (the root itself, or the folder of a product file named as the root)."""
    return root.parent if root.is_file() else root


def resolve_data_root(explicit: str | os.PathLike | None = None) -> Path:
    """The WebShop data root: `explicit`, else $WEBSHOP_DATA, else ../shared/webshop next to the current directory
    or the repository. It is a folder holding items_shuffle_1000.json and items_ins_v2_1000.json (or the full
    items_shuffle.json and items_ins_v2.json), or the product file itself with its attribute file beside it."""
    need = f"{PRODUCT_FILE} and {ATTRIBUTE_FILE}, or the full {FULL_PRODUCT_FILE} and {FULL_ATTRIBUTE_FILE},"

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


_WS = re.compile(r"[ \t\n\r]*")
_CHUNK_CHARS = 1 << 20
_MAX_VALUE_CHARS = 1 << 26  # one product or attribute entry larger than this means a damaged file


class _JsonStream:
    """A JSON text read one top-level container member at a time: the file is never held whole in memory."""

    def __init__(self, fh, path: Path):
        self.fh, self.path, self.chunk_chars = fh, path, _CHUNK_CHARS
        self.buf, self.pos, self.offset, self.eof = "", 0, 0, False
        self.decoder = json.JSONDecoder()

    def error(self, what: str, pos: int | None = None) -> UserError:
        """A one-line error at character `pos` of the buffer (default: the read position; -1: no position)."""
        where = "" if pos == -1 else f" at character {self.offset + (self.pos if pos is None else pos)}"
        return UserError(f"cannot read WebShop data file {self.path}: {what}{where}; restore it from WebShop's data")

    def _more(self) -> bool:
        if self.eof:
            return False
        try:
            data = self.fh.read(self.chunk_chars)
        except (OSError, UnicodeDecodeError) as err:
            raise self.error(f"{type(err).__name__}: {err}", -1) from None
        if not data:
            self.eof = True
            return False
        self.offset += self.pos
        self.buf, self.pos = self.buf[self.pos :] + data, 0
        return True

    def peek(self) -> str:
        """The next character that is not white space ("" at the end of the file), not consumed."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more():
                return ""

    def expect(self, chars: str, what: str) -> str:
        c = self.peek()
        if c == "" or c not in chars:
            raise self.error(f"expected {what}, found {c!r}" if c else f"expected {what}, the file ends")
        self.pos += 1
        return c

    def value(self) -> Any:
        """The next complete JSON value, read as `json.load` would read it."""
        self.peek()
        while True:
            try:
                obj, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as err:
                if len(self.buf) - self.pos < _MAX_VALUE_CHARS and self._more():
                    continue  # the value goes on in the next chunk
                raise self.error(err.msg, err.pos) from None
            if end == len(self.buf) and self._more():
                continue  # a number could go on in the next chunk
            self.pos = end
            return obj


def _iter_container(path: Path, kind: str) -> Iterator[Any]:
    """The members of the JSON list (kind "list": each value) or object (kind "dict": (key, value) pairs) that a
    file holds, one at a time."""
    opening, closing = ("[", "]") if kind == "list" else ("{", "}")
    try:
        fh = open(path, encoding="utf-8")
    except OSError as err:
        raise UserError(f"cannot read WebShop data file {path}: {err}; restore it from WebShop's data") from err
    with fh:
        stream = _JsonStream(fh, path)
        if stream.peek() != opening:
            raise UserError(
                f"{path} must hold a JSON {'list of products' if kind == 'list' else 'object keyed by ASIN'}: "
                "restore it from WebShop's data"
            )
        stream.pos += 1
        if stream.peek() == closing:
            stream.pos += 1
        else:
            while True:
                if kind == "list":
                    yield stream.value()
                else:
                    if stream.peek() != '"':
                        raise stream.error("expected a key")
                    key = stream.value()
                    stream.expect(":", "':'")
                    yield key, stream.value()
                if stream.expect("," + closing, f"',' or '{closing}'") == closing:
                    break
        if stream.peek() != "":
            raise stream.error("extra data after the JSON value")


def iter_json_list(path: Path) -> Iterator[Any]:
    """The values of the JSON list a file holds, one at a time (equal to iterating `json.load`'s list)."""
    return _iter_container(Path(path), "list")


def iter_json_dict(path: Path) -> Iterator[tuple[str, Any]]:
    """The (key, value) pairs of the JSON object a file holds, one at a time (equal to `json.load(f).items()`)."""
    return _iter_container(Path(path), "dict")


def parse_pricing(pricing: str | None) -> tuple[list[float], str]:
    """(prices, price tag) of an Amazon price string: "$19.99$27.99" -> ([19.99, 27.99], "$19.99 to $27.99");
    an empty price is WebShop's default ([100.0], "$100.0")."""
    if pricing is None or not pricing:
        return [100.0], "$100.0"
    prices = [float(Decimal(re.sub(r"[^\d.]", "", price))) for price in pricing.split("$")[1:]]
    if len(prices) == 1:
        return prices, f"${prices[0]}"
    return prices[:2], f"${prices[0]} to ${prices[1]}"


def read_attributes(path: Path) -> dict[str, dict[str, Any]]:
    """items_ins_v2*.json, streamed: per ASIN the three entries `load_products` reads (attributes, instruction,
    instruction_attributes), when present."""
    keep = ("attributes", "instruction", "instruction_attributes")
    attributes: dict[str, dict[str, Any]] = {}
    for asin, entry in iter_json_dict(path):
        if not isinstance(entry, dict):
            raise UserError(f"{path}: the entry of {asin} is a {type(entry).__name__}, not an object: restore the file")
        attributes[asin] = {k: entry[k] for k in keep if k in entry}
    return attributes


def _missing_field(path: Path, index: int, asin: Any, field: str) -> UserError:
    which = f"product {index}" + (f" ({asin})" if isinstance(asin, str) else "")
    return UserError(
        f"{path}: {which} has no {field!r} field, which WebShop's load_products reads; restore the file from "
        "WebShop's data (setup.sh)"
    )


def process_product(
    p: dict[str, Any], attributes: dict[str, dict[str, Any]], *, path: Path, index: int
) -> dict[str, Any]:
    """One raw product turned into the dict WebShop's `load_products(..., human_goals=False)` serves, in place:
    scrape keys dropped; Title, Description, Reviews, Rating, BulletPoints, Price, options, option_to_image,
    Attributes, instruction_text, instruction_attributes and MainImage added; pricing parsed; query lower-cased."""
    for key in _SCRAPE_KEYS:
        p.pop(key, None)
    for name in PRODUCT_FIELDS[1:]:
        if name not in p:
            raise _missing_field(path, index, p["asin"], name)
    asin = p["asin"]
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
            if "value" not in content:
                raise _missing_field(path, index, asin, f"customization_options.{option_name}[].value")
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
    return p


def load_products(product_path: Path, attribute_path: Path) -> list[dict[str, Any]]:
    """WebShop's `load_products(..., human_goals=False)`: the product dicts the text environment serves. Both files
    are streamed, so WebShop's full items_shuffle.json (1.18M products, several GB) loads without being read whole;
    a product lacking a field WebShop reads is a one-line UserError naming the file and the field."""
    product_path, attribute_path = Path(product_path), Path(attribute_path)
    attributes = read_attributes(attribute_path)
    asins: set[str] = set()
    all_products: list[dict[str, Any]] = []
    for index, p in enumerate(iter_json_list(product_path)):
        if not isinstance(p, dict):
            raise UserError(f"{product_path}: product {index} is a {type(p).__name__}, not an object: restore the file")
        if "asin" not in p:
            raise _missing_field(product_path, index, None, "asin")
        # json.load shares the key strings of the whole file; a streamed value has its own: share them again
        p = {sys.intern(k): v for k, v in p.items()}
        asin = p["asin"]
        if asin == "nan" or len(asin) > 10 or asin in asins:
            continue
        asins.add(asin)
        product = process_product(p, attributes, path=product_path, index=index)
        if product["instruction_text"] is not None and not product["instruction_attributes"]:
            raise UserError(
                f"{attribute_path}: {asin} has an 'instruction' but no 'instruction_attributes', which WebShop's "
                "goals need; restore the file from WebShop's data"
            )
        all_products.append(product)
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


class SearchEngine:
    """BM25 (Lucene's English analyzer, k1 0.9, b 0.4) over WebShop's product documents, ranked as pyserini does."""

    def __init__(self, products: Sequence[dict[str, Any]], cache_size: int = 4096):
        self.asins = [p["asin"] for p in products]
        self.index = BM25Index.build([search_document(p) for p in products], ids=self.asins)
        self._cache: OrderedDict[str, list[str]] = OrderedDict()
        self._cache_size = cache_size

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[str]:
        """ASINs of the top `k` products for `query`, best first."""
        key = f"{k}\t{query}"
        hit = self._cache.get(key)
        if hit is None:
            hit = [self.asins[d] for d, _ in self.index.search(query, k)]
            self._cache[key] = hit
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return list(hit)


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
            self._engine = SearchEngine(self.products)
        return self._engine

    def split_goals(self, split: str) -> range:
        """Goal indices of a split: test = 0-499, train = 500 onward (verl-agent's convention)."""
        if split == "test":
            return range(0, min(TEST_GOALS, len(self.goals)))
        if split == "train":
            return range(min(TEST_GOALS, len(self.goals)), len(self.goals))
        raise UserError(f"unknown WebShop split {split!r}: use test or train")


def task_id(goal_index: int) -> str:
    """The stable id of a goal: its index in the seeded goal order."""
    return f"goal-{goal_index}"


def read_title_nouns(root: Path) -> dict[str, list[str]]:
    """title_nouns.json of a data root ({} when it has none: names are then parsed with spaCy)."""
    path = data_folder(Path(root)) / NOUNS_FILE
    nouns = _read_json(path) if path.is_file() else {}
    if not isinstance(nouns, dict):
        raise UserError(f"{path} must hold an object {{product name: [nouns]}}: restore it from the WebShop data")
    return nouns


def _check_nouns(products: list[dict[str, Any]], nouns: dict[str, list[str]], nouns_path: Path) -> None:
    """Names without nouns need spaCy's en_core_web_sm at the first purchase: say so now, not in the middle of a run."""
    missing = sum(p["name"] not in nouns for p in products)
    if not missing:
        return

    if importlib.util.find_spec("en_core_web_sm") is None:
        raise UserError(
            f"{missing} of {len(products)} WebShop product names have no nouns in {nouns_path}, and spaCy's "
            "en_core_web_sm (which WebShop's type reward parses them with) is not installed: `pip install spacy` "
            "and `python -m spacy download en_core_web_sm`, or add them to title_nouns.json"
        )
    logger.info("%d product names are not in %s: the type reward parses them with spaCy", missing, nouns_path)


_CACHE: dict[tuple[str, int], Shop] = {}
_LOCK = threading.Lock()


def load_shop(root: str | os.PathLike | None = None, seed: int = 0) -> Shop:
    """The WebShop data of `root` (resolved as `resolve_data_root` does), built once per process and seed."""
    path = resolve_data_root(root)
    key = (str(path), int(seed))
    with _LOCK:
        if key not in _CACHE:
            files = product_files(path)
            assert files is not None  # resolve_data_root checked it
            products = load_products(*files)
            if not products:
                raise UserError(f"WebShop data at {path} has no products in {files[0].name}: restore the file")
            rng = random.Random(seed)
            prices = generate_product_prices(products, rng)
            goals = get_synthetic_goals(products, prices, rng)
            random.Random(seed).shuffle(goals)
            nouns = read_title_nouns(path)
            _check_nouns(products, nouns, data_folder(path) / NOUNS_FILE)
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
