"""Search-QA splits from ../shared/search: closed train/dev, the five test sets, filters, limits, user files."""

from pathlib import Path

import pytest

from seedcli.envs.search.data import TEST_SETS, load_split, read_questions, resolve_data_root
from seedcli.errors import UserError


@pytest.fixture(scope="module")
def search_root() -> Path:
    try:
        return resolve_data_root()
    except UserError as e:
        pytest.skip(str(e))


def test_closed_splits(search_root: Path) -> None:
    train, dev = load_split("train", search_root), load_split("dev", search_root)
    # the data README's table: 501 = 89 + 82 + 330 and 112 = 11 + 18 + 83
    assert len(train) == 501 and len(dev) == 112
    assert sum(q.data_source == "2wiki_dev" for q in dev) == 83
    assert not {q.id for q in train} & {q.id for q in dev}
    assert all(q.golden_answers and q.question for q in train + dev)


def test_test_split_drops_questions_seen_in_training(search_root: Path) -> None:
    names = ["nq", "bamboogle"]
    small = load_split("test", search_root, datasets=names)
    assert [q.data_source for q in small].count("nq") == 3610 and len(small) == 3610 + 125
    wiki = load_split("test", search_root, datasets=["2wiki"])
    # closed/train.jsonl holds 330 2Wiki dev questions under the same ids; the README says to drop them
    assert len(wiki) == 12576 - 330
    train_ids = {q.id for q in load_split("train", search_root)}
    assert not train_ids & {q.id for q in wiki}


def test_limit_applies_per_data_source(search_root: Path) -> None:
    qs = load_split("test", search_root, limit=7)
    assert len(qs) == 7 * len(TEST_SETS)
    assert [q.data_source for q in qs[:7]] == ["nq"] * 7 and qs[0].id == "nq-0"
    dev = load_split("dev", search_root, datasets=["musique_train"], limit=5)
    assert len(dev) == 5 and {q.data_source for q in dev} == {"musique_train"}


def test_bad_names(search_root: Path) -> None:
    with pytest.raises(UserError, match="unknown test set.*triviaqa"):
        load_split("test", search_root, datasets=["triviaqa"])
    with pytest.raises(UserError, match="unknown search split 'validation'"):
        load_split("validation", search_root)
    with pytest.raises(UserError, match="no data source.*nq"):
        load_split("dev", search_root, datasets=["nq"])


def test_user_split_file(tmp_path: Path) -> None:
    f = tmp_path / "popqa.jsonl"
    f.write_text(
        '{"id": "p0", "question": "Who?", "golden_answers": ["Ann"], "data_source": "popqa"}\n'
        '{"question": "Where?", "golden_answers": "Rome"}\n'
    )
    qs = load_split(str(f))
    assert [(q.id, q.data_source, q.golden_answers) for q in qs] == [
        ("p0", "popqa", ("Ann",)),
        ("popqa-1", "popqa", ("Rome",)),  # id and source default to the file's name and the line
    ]
    f.write_text('{"id": "p0", "question": "Who?"}\n')
    with pytest.raises(UserError, match=r"popqa.jsonl:1: missing field\(s\) golden_answers"):
        read_questions(f)
    f.write_text("{not json\n")
    with pytest.raises(UserError, match="popqa.jsonl:1: not valid JSON"):
        read_questions(f)
