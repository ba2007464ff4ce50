"""The Lucene-like analyzer and BM25 index (seedcli.envs.lucene) on hand-worked cases."""

from __future__ import annotations

import math

import pytest

from seedcli.envs.lucene import (
    ENGLISH_STOP_WORDS,
    BM25Index,
    LuceneAnalyzer,
    PorterStemmer,
    decode_length,
    encode_length,
    standard_tokenize,
)


def test_readme_example_analyzes_like_anserini():
    # The example in the WebShop data README, produced by Anserini's DefaultEnglishAnalyzer.
    assert LuceneAnalyzer().tokens("the running shoes are for a women's size") == ["run", "shoe", "women", "size"]


def test_stop_words_are_lucenes_33():
    assert len(ENGLISH_STOP_WORDS) == 33
    assert {"the", "a", "with", "will", "their"} <= ENGLISH_STOP_WORDS
    assert "me" not in ENGLISH_STOP_WORDS and "from" not in ENGLISH_STOP_WORDS


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("Wi-Fi 3.5mm USB_C", ["Wi", "Fi", "3.5mm", "USB_C"]),  # hyphen splits; digits, letters and _ join
        ("e.g. don't 1,000 a.1", ["e.g", "don't", "1,000", "a", "1"]),  # '.' joins letters or digits, not both
        ("color:black $19.99", ["color:black", "19.99"]),  # ':' is a MidLetter in UAX#29
        ("love❤️you ★★", ["love", "❤️", "you", "★", "★"]),  # pictographs are tokens of their own
        ("【premium】 漢字", ["premium", "漢", "字"]),  # brackets break; each ideograph is a token
    ],
)
def test_standard_tokenizer_word_breaks(text, tokens):
    assert standard_tokenize(text) == tokens


@pytest.mark.parametrize(
    ("word", "stem"),
    [
        # Porter (1980)'s own examples, steps 1a-5b
        ("caresses", "caress"),
        ("ponies", "poni"),
        ("cats", "cat"),
        ("agreed", "agre"),
        ("plastered", "plaster"),
        ("hopping", "hop"),
        ("filing", "file"),
        ("happy", "happi"),
        ("relational", "relat"),
        ("conditional", "condit"),
        ("digitizer", "digit"),
        ("vietnamization", "vietnam"),
        ("hopefulness", "hope"),
        ("sensitiviti", "sensit"),
        ("triplicate", "triplic"),
        ("electrical", "electr"),
        ("adjustment", "adjust"),
        ("adoption", "adopt"),
        ("controll", "control"),
        ("rate", "rate"),
        # Lucene's (Porter's own code's) departures from the paper: -bli -> -ble, -logi -> -log
        ("possibli", "possibl"),
        ("archaeologi", "archaeolog"),
        # words of one or two letters are left alone
        ("as", "as"),
        ("is", "is"),
    ],
)
def test_porter_stemmer_matches_lucene(word, stem):
    assert PorterStemmer().stem(word) == stem


def test_possessive_is_removed_before_lower_casing():
    assert LuceneAnalyzer().tokens("WOMEN'S Men’s kids'") == ["women", "men", "kid"]


def test_lengths_are_stored_in_one_byte_like_lucene():
    # below 24 exact; 100 -> 100-24 = 76 = 0b1001100: 7 bits, shift 3, mantissa (76>>3)&7 = 1, exponent 4:
    # 1 | 4<<3 = 33, byte 24+33 = 57, which decodes to 24 + (1|8)<<3 = 96
    assert [encode_length(n) for n in (0, 5, 23)] == [0, 5, 23]
    assert encode_length(100) == 57
    assert decode_length(57) == 96
    for n in range(0, 5000, 7):
        assert decode_length(encode_length(n)) <= n  # lossy, never longer


def test_bm25_scores_a_hand_worked_example():
    # 3 docs of 2, 5, 2 terms: avgdl 3; idf(red) = ln(1 + (3-2+0.5)/(2+0.5)) = ln 1.6 = 0.470004
    # doc 0 (tf 1, L 2): 0.470004 * 1 / (1 + 0.9 * (0.6 + 0.4*2/3)) = 0.470004 / 1.78 = 0.264047
    # doc 1 (tf 2, L 5): 0.470004 * 2 / (2 + 0.9 * (0.6 + 0.4*5/3)) = 0.940008 / 3.14 = 0.299366
    index = BM25Index.build(["red shoes", "red red shoes shoes shoes", "blue hat"])
    hits = index.search("red", k=10)
    assert [d for d, _ in hits] == [1, 0]
    assert hits[0][1] == pytest.approx(2 * math.log(1.6) / 3.14, abs=1e-6)
    assert hits[1][1] == pytest.approx(math.log(1.6) / 1.78, abs=1e-6)
    assert index.search("green", k=10) == []


def test_repeated_query_terms_count_as_a_boost():
    # Anserini's bag-of-words query weighs a term by how often the query repeats it.
    index = BM25Index.build(["red shoes", "blue hat", "green scarf"])
    once = dict(index.search("red", k=3))
    twice = dict(index.search("red red", k=3))
    assert twice[0] == pytest.approx(2 * once[0], rel=1e-6)


def test_ties_are_broken_by_id_ascending():
    index = BM25Index.build(["red shoes", "red shoes", "blue hat"], ids=["B2", "B1", "B3"])
    assert [d for d, _ in index.search("red shoes", k=2)] == [1, 0]


def test_save_and_load_give_the_same_ranking(tmp_path):
    docs = ["red running shoes", "blue shoes for women", "a cat's toy", "women's red dress ❤"]
    index = BM25Index.build(docs, ids=["d", "c", "b", "a"])
    index.save(tmp_path / "index.npz")
    loaded = BM25Index.load(tmp_path / "index.npz")
    for query in ("red shoes", "women", "cat toy dress"):
        assert loaded.search(query, k=4) == index.search(query, k=4)
    assert loaded.ids == index.ids and loaded.avgdl == index.avgdl
