"""WebShop's search engine against real Lucene: lucene_reference.jsonl holds pyserini's top 10 for 1,215 queries."""

from __future__ import annotations

import json

import pytest

from seedcli.envs.webshop.data import LUCENE_REFERENCE_FILE, load_shop
from seedcli.errors import UserError


@pytest.fixture(scope="module")
def shop():
    try:
        shop = load_shop()
    except UserError as err:
        pytest.skip(str(err))
    if not (shop.root / LUCENE_REFERENCE_FILE).is_file():
        pytest.skip(f"no {LUCENE_REFERENCE_FILE} in {shop.root}")
    return shop


def agreement(shop) -> tuple[float, float, float]:
    """(top-1 agreement, mean top-10 set agreement, share of identical top-10 lists) over the reference queries."""
    lines = (shop.root / LUCENE_REFERENCE_FILE).read_text(encoding="utf-8").splitlines()
    refs = [json.loads(line) for line in lines if line.strip()]
    top1 = sets = same = 0.0
    for ref in refs:
        got = shop.engine.search(ref["query"], k=50)[:10]
        top1 += got[:1] == ref["top10"][:1]
        sets += len(set(got) & set(ref["top10"])) / max(len(ref["top10"]), 1)
        same += got == ref["top10"]
    n = len(refs)
    return top1 / n, sets / n, same / n


def test_bm25_agrees_with_lucene(shop):
    top1, top10, identical = agreement(shop)
    print(
        f"\nBM25 vs Lucene on 1,215 queries: top-1 {top1:.2%}, top-10 set {top10:.2%}, identical top-10 {identical:.2%}"
    )
    assert top1 >= 0.98
    assert top10 >= 0.98


def test_search_returns_at_most_50_products(shop):
    hits = shop.engine.search("black color size for women and men", k=50)
    assert len(hits) == 50 and len(set(hits)) == 50
    assert all(a in shop.product_by_asin for a in hits)
    assert len(shop.engine.search("shoes", k=50)) < 50  # only products holding the word are hits
