"""WebShop's full product files (items_shuffle.json + items_ins_v2.json) by path, streamed (seedcli.envs.webshop.data).

The files written here have the shape of WebShop's own: a JSON list of raw scraped products (scrape fields, price
strings, customization options) and an object of attributes and instructions keyed by ASIN.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from seedcli.envs.webshop import data
from seedcli.envs.webshop.data import (
    ATTRIBUTE_FILE,
    FULL_ATTRIBUTE_FILE,
    FULL_PRODUCT_FILE,
    NOUNS_FILE,
    PRODUCT_FILE,
    iter_json_dict,
    iter_json_list,
    load_products,
    load_shop,
    resolve_data_root,
)
from seedcli.errors import UserError

SHARED = Path(__file__).resolve().parents[3] / "shared" / "webshop"
HAS_SPACY_MODEL = importlib.util.find_spec("en_core_web_sm") is not None


def raw_product(asin: str, name: str, **extra) -> dict:
    """A product as WebShop's items_shuffle.json holds it, scrape fields included."""
    product = {
        "name": name,
        "full_description": f"The {name.lower()}, described.",
        "pricing": "$19.99",
        "images": [f"https://m.media-amazon.com/images/I/{asin}.jpg"],
        "product_category": "Beauty & Personal Care \u203a Hair Care \u203a Shampoo & Conditioner \u203a Shampoos",
        "average_rating": "4.5 out of 5 stars",
        "small_description": ["Gentle formula ", "Sulfate free "],
        "customization_options": "",
        "asin": asin,
        "category": "beauty",
        "query": "Shampoos ",
        "page": 3,
        # scraped fields that WebShop's clean_product_keys drops
        "product_information": {"ASIN": asin},
        "brand": "Acme",
        "brand_url": "https://example.com",
        "list_price": "$25.00",
        "availability_quantity": 5,
        "availability_status": "In Stock.",
        "total_reviews": 12,
        "total_answered_questions": 0,
        "seller_id": "S1",
        "seller_name": "Seller",
        "fulfilled_by_amazon": True,
        "fast_track_message": "",
        "aplus_present": False,
        "small_description_old": "old",
    }
    product.update(extra)
    return product


PRODUCTS = [
    raw_product(
        "B000000001",
        "Herbal Repair Shampoo Bottle",
        pricing="$12.50$18.00",
        customization_options={
            "Color": [{"value": "Rose/Gold ", "image": "https://img/rose.jpg"}, {"value": "Black"}],
            "Size": [{"value": "8 Fl Oz"}, {"value": "16 Fl Oz"}],
            "Scent": None,
        },
    ),
    raw_product("B000000002", "Tea Tree Body Scrub Jar", pricing="", small_description="One bullet only"),
    raw_product("B000000001", "A duplicate ASIN, skipped as WebShop skips it"),
    raw_product("nan", "A product without ASIN, skipped"),
    raw_product("B0000000000003", "An ASIN longer than ten characters, skipped"),
    raw_product("B000000004", "Stainless Steel Garden Trowel", category="garden", pricing="$1,847.00", images=[]),
]
ATTRIBUTES = {
    "B000000001": {
        "attributes": ["sulfate free", "herbal"],
        "instruction": "i need a sulfate free herbal shampoo",
        "instruction_attributes": ["sulfate free", "herbal"],
    },
    "B000000002": {"attributes": []},
    "B000000004": {
        "attributes": ["stainless steel"],
        "instruction": "find a steel trowel",
        "instruction_attributes": ["stainless steel"],
    },
}
NOUNS = {
    "Herbal Repair Shampoo Bottle": ["repair", "shampoo", "bottle"],
    "Tea Tree Body Scrub Jar": ["tea", "tree", "body", "scrub", "jar"],
    "Stainless Steel Garden Trowel": ["steel", "garden", "trowel"],
}


def write_full(folder: Path, products=PRODUCTS, attributes=ATTRIBUTES, nouns=NOUNS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    # json.dumps with default separators and ensure_ascii, as WebShop's files are written
    (folder / FULL_PRODUCT_FILE).write_text(json.dumps(products))
    (folder / FULL_ATTRIBUTE_FILE).write_text(json.dumps(attributes))
    if nouns is not None:
        (folder / NOUNS_FILE).write_text(json.dumps(nouns))
    return folder


def test_full_files_load_as_webshop_processes_them(tmp_path: Path):
    folder = write_full(tmp_path / "data")
    products = load_products(folder / FULL_PRODUCT_FILE, folder / FULL_ATTRIBUTE_FILE)
    assert [p["asin"] for p in products] == ["B000000001", "B000000002", "B000000004"]
    first, second, third = products
    assert not set(first) & set(data._SCRAPE_KEYS)
    assert first["Title"] == "Herbal Repair Shampoo Bottle" and first["Description"].startswith("The herbal")
    assert first["pricing"] == [12.5, 18.0] and first["Price"] == "$12.5 to $18.0"
    assert first["options"] == {"color": ["rose | gold", "black"], "size": ["8 fl oz", "16 fl oz"]}
    assert first["option_to_image"] == {
        "rose | gold": "https://img/rose.jpg",
        "black": None,
        "8 fl oz": None,
        "16 fl oz": None,
    }
    assert first["Attributes"] == ["sulfate free", "herbal"]
    assert first["instruction_text"] == "i need a sulfate free herbal shampoo"
    assert first["BulletPoints"] == ["Gentle formula ", "Sulfate free "]
    assert first["query"] == "shampoos" and first["Reviews"] == [] and first["Rating"] == "N.A."
    assert first["MainImage"].endswith("B000000001.jpg")
    # WebShop's key order: the raw fields left (scrape fields gone), then those load_products adds, in its order
    assert list(first) == [
        *("name", "full_description", "pricing", "images", "product_category", "average_rating"),
        *("small_description", "customization_options", "asin", "category", "query", "page"),
        *("Title", "Description", "Reviews", "Rating", "BulletPoints", "Price", "options", "option_to_image"),
        *("Attributes", "instruction_text", "instruction_attributes", "MainImage"),
    ]
    assert second["pricing"] == [100.0] and second["Price"] == "$100.0"  # WebShop's default for an empty price
    assert second["BulletPoints"] == ["One bullet only"] and second["Attributes"] == []
    assert second["instruction_text"] is None
    assert third["pricing"] == [1847.0] and third["MainImage"] is None


@pytest.mark.parametrize("by", ["folder", "file", "env"])
def test_full_files_by_path_give_a_shop_and_goals(tmp_path: Path, monkeypatch, by: str):
    folder = write_full(tmp_path / "webshop-all")
    root = {"folder": folder, "file": folder / FULL_PRODUCT_FILE, "env": None}[by]
    if by == "env":
        monkeypatch.setenv("WEBSHOP_DATA", str(folder))
    assert resolve_data_root(root) in (folder.resolve(), (folder / FULL_PRODUCT_FILE).resolve())
    shop = load_shop(root, seed=0)
    assert len(shop.products) == 3
    # one goal per option combination of each product with an instruction: 2 colours x 2 sizes, and 1
    assert len(shop.goals) == 5
    assert {g["asin"] for g in shop.goals} == {"B000000001", "B000000004"}
    assert shop.nouns == NOUNS


def test_full_files_play_an_expert_episode(tmp_path: Path):
    from seedcli.envs.webshop.env import WebShopEnv

    folder = write_full(tmp_path / "webshop-all")
    env = WebShopEnv(data_root=str(folder / FULL_PRODUCT_FILE))
    tasks = env.list_tasks("test")
    assert len(tasks) == 5  # fewer goals than 500: the test split is all of them
    game = env.new_game(expert=True)
    result = game.reset(tasks[0])
    for _ in range(env.max_steps):
        result = game.step(result.expert_action)
        if result.done:
            break
    assert result.done and result.won and result.score == 1.0


def test_small_set_under_the_full_names_gives_the_same_shop(tmp_path: Path):
    if not (SHARED / PRODUCT_FILE).is_file():
        pytest.skip(f"no WebShop data at {SHARED}")
    folder = tmp_path / "renamed"
    folder.mkdir()
    shutil.copyfile(SHARED / PRODUCT_FILE, folder / FULL_PRODUCT_FILE)
    shutil.copyfile(SHARED / ATTRIBUTE_FILE, folder / FULL_ATTRIBUTE_FILE)
    shutil.copyfile(SHARED / NOUNS_FILE, folder / NOUNS_FILE)
    full, small = load_shop(folder), load_shop(SHARED)
    assert full.products == small.products
    assert [g["instruction_text"] for g in full.goals] == [g["instruction_text"] for g in small.goals]
    assert full.prices == small.prices


def test_streaming_reads_what_json_load_reads(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(data, "_CHUNK_CHARS", 7)  # values cut across many chunk boundaries
    path = tmp_path / "list.json"
    values = [{"a": 'x\u00e9\\"y', "n": [1, 2.5e3, None, True]}, 12345678901234567890, "s", [], {}, -0.5]
    path.write_text(json.dumps(values, indent=1))
    assert list(iter_json_list(path)) == values
    path.write_text("[]")
    assert list(iter_json_list(path)) == []
    obj = {"B1": {"attributes": ["a"]}, "B2": {}, "k\u00e9y": [1, {"x": "y"}]}
    path.write_text(json.dumps(obj))
    assert list(iter_json_dict(path)) == list(obj.items())
    if (SHARED / PRODUCT_FILE).is_file():
        monkeypatch.setattr(data, "_CHUNK_CHARS", 4096)
        with open(SHARED / ATTRIBUTE_FILE, encoding="utf-8") as f:
            assert dict(iter_json_dict(SHARED / ATTRIBUTE_FILE)) == json.load(f)
        with open(SHARED / PRODUCT_FILE, encoding="utf-8") as f:
            assert list(iter_json_list(SHARED / PRODUCT_FILE)) == json.load(f)


GOOD = json.dumps(PRODUCTS[1])


@pytest.mark.parametrize(
    "text, message",
    [
        (f'[{GOOD}, {{"name": ', r"Expecting value at character \d+"),
        (f"[{GOOD} {GOOD}]", "expected ',' or ']'"),
        (f"[{GOOD}] x", "extra data"),
        (GOOD, "must hold a JSON list of products"),
    ],
)
def test_a_damaged_product_file_is_one_line(tmp_path: Path, text: str, message: str):
    folder = write_full(tmp_path / "d")
    (folder / FULL_PRODUCT_FILE).write_text(text)
    with pytest.raises(UserError, match=message) as err:
        load_products(folder / FULL_PRODUCT_FILE, folder / FULL_ATTRIBUTE_FILE)
    assert "\n" not in str(err.value) and str(folder / FULL_PRODUCT_FILE) in str(err.value)


@pytest.mark.parametrize(
    "field",
    [
        "name",
        "full_description",
        "small_description",
        "customization_options",
        "query",
        "category",
        "product_category",
        "asin",
    ],
)
def test_a_product_lacking_a_field_names_the_file_and_the_field(tmp_path: Path, field: str):
    products = [dict(p) for p in PRODUCTS]
    del products[1][field]
    folder = write_full(tmp_path / "d", products=products)
    with pytest.raises(UserError) as err:
        load_shop(folder)
    msg = str(err.value)
    assert "\n" not in msg
    assert str(folder / FULL_PRODUCT_FILE) in msg and f"'{field}'" in msg and "product 1" in msg


def test_an_option_lacking_its_value_names_the_field(tmp_path: Path):
    products = [dict(p) for p in PRODUCTS]
    products[0] = dict(products[0], customization_options={"Color": [{"image": "x"}]})
    folder = write_full(tmp_path / "d", products=products)
    with pytest.raises(UserError, match=r"product 0 \(B000000001\) has no 'customization_options.Color\[\].value'"):
        load_shop(folder)


def test_an_instruction_without_its_attributes_names_the_attribute_file(tmp_path: Path):
    attributes = {**ATTRIBUTES, "B000000004": {"attributes": [], "instruction": "find a steel trowel"}}
    folder = write_full(tmp_path / "d", attributes=attributes)
    with pytest.raises(UserError, match="B000000004 has an 'instruction' but no 'instruction_attributes'") as err:
        load_shop(folder)
    assert str(folder / FULL_ATTRIBUTE_FILE) in str(err.value)


def test_a_folder_without_either_pair_is_a_one_line_error(tmp_path: Path):
    (tmp_path / FULL_PRODUCT_FILE).write_text("[]")  # no attribute file beside it
    with pytest.raises(UserError, match=f"or the full {FULL_PRODUCT_FILE} and {FULL_ATTRIBUTE_FILE}"):
        resolve_data_root(tmp_path)
    with pytest.raises(UserError, match="WebShop data not found at"):
        resolve_data_root(tmp_path / FULL_PRODUCT_FILE)


@pytest.mark.skipif(HAS_SPACY_MODEL, reason="en_core_web_sm is installed: names without nouns are parsed")
def test_names_without_nouns_need_spacy_and_say_so_before_a_run(tmp_path: Path):
    folder = write_full(tmp_path / "d", nouns={"Herbal Repair Shampoo Bottle": ["shampoo"]})
    with pytest.raises(UserError, match="2 of 3 WebShop product names have no nouns in .*en_core_web_sm") as err:
        load_shop(folder)
    assert "\n" not in str(err.value)


def test_a_product_file_that_is_not_utf8_is_one_line(tmp_path: Path):
    folder = write_full(tmp_path / "d")
    (folder / FULL_PRODUCT_FILE).write_bytes(b'[{"name": "\xff"}]')
    with pytest.raises(UserError, match="UnicodeDecodeError") as err:
        load_products(folder / FULL_PRODUCT_FILE, folder / FULL_ATTRIBUTE_FILE)
    assert "\n" not in str(err.value) and str(folder / FULL_PRODUCT_FILE) in str(err.value)


def test_reward_nouns_load_from_an_explicit_data_root(tmp_path: Path, monkeypatch):
    from seedcli.envs.webshop import reward

    folder = write_full(tmp_path / "d", nouns={"Only Here Widget": ["widget"]})
    monkeypatch.setattr(reward, "_NOUNS", {})
    monkeypatch.setattr(reward, "_DEFAULT_NOUNS", {})
    assert reward.load_title_nouns(folder / FULL_PRODUCT_FILE) == (folder / FULL_PRODUCT_FILE).resolve()
    assert reward.title_nouns("Only Here Widget") == ["widget"]
    with pytest.raises(UserError, match="WebShop data not found at"):
        reward.load_title_nouns(tmp_path / "nowhere")
