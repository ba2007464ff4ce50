"""Game discovery and selection on the real ALFWorld data folder (no game engine is started)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from seedcli.envs.alfworld.data import (
    SHORT_TASK_TYPES,
    SPLITS,
    TASK_TYPES,
    Game,
    list_games,
    resolve_data_root,
    resolve_split,
    select_games,
)
from seedcli.errors import UserError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def unseen(alfworld_root) -> list[Game]:
    return list_games(alfworld_root, "unseen")


def test_task_types_in_alfworld_order():
    assert list(TASK_TYPES.values()) == ["pick", "look", "clean", "heat", "cool", "pick_two"]
    assert SHORT_TASK_TYPES == ("pick", "look", "clean", "heat", "cool", "pick_two")
    assert list(TASK_TYPES)[0] == "pick_and_place_simple"


def test_split_aliases():
    assert resolve_split("seen") == resolve_split("valid_seen") == "valid_seen"
    assert resolve_split("unseen") == resolve_split("VALID_UNSEEN") == "valid_unseen"
    assert resolve_split("train") == "train"
    assert set(SPLITS.values()) == {"train", "valid_seen", "valid_unseen"}
    with pytest.raises(UserError, match=r"unknown ALFWorld split 'test'.*seen.*unseen"):
        resolve_split("test")


def test_unseen_counts_per_type(unseen):
    # ALFWorld's published valid_unseen composition: 134 games.
    assert len(unseen) == 134
    counts = Counter(g.task_type for g in unseen)
    assert [counts[t] for t in SHORT_TASK_TYPES] == [24, 18, 31, 23, 21, 17]


def test_seen_count(alfworld_root):
    seen = list_games(alfworld_root, "seen")
    assert len(seen) == 140
    assert all(g.split == "valid_seen" for g in seen)


def test_games_are_relative_sorted_and_consistent(alfworld_root, unseen):
    assert [g.name for g in unseen] == sorted(g.name for g in unseen)
    g = unseen[0]
    assert not Path(g.game_file).is_absolute()
    assert g.game_file == f"json_2.1.1/valid_unseen/{g.name}/game.tw-pddl"
    assert g.path(alfworld_root) == alfworld_root / g.game_file and g.path(alfworld_root).is_file()
    assert TASK_TYPES[g.name.split("-")[0]] == g.task_type
    assert g.split == "valid_unseen"


def test_list_games_skips_trials_without_game_file_and_unknown_types(tmp_path):
    split = tmp_path / "json_2.1.1" / "valid_seen"
    ok = split / "pick_and_place_simple-Book-None-Desk-302" / "trial_T1"
    ok.mkdir(parents=True)
    (ok / "game.tw-pddl").write_text('{"solvable": true}')
    (split / "pick_and_place_simple-Book-None-Desk-302" / "trial_T2").mkdir()  # no game file
    unsolvable = split / "look_at_obj_in_light-Book-None-DeskLamp-1" / "trial_T3"
    unsolvable.mkdir(parents=True)
    (unsolvable / "game.tw-pddl").write_text('{"solvable": false}')
    movable = split / "pick_and_place_with_movable_recep-Pen-Bowl-Desk-1" / "trial_T4"
    movable.mkdir(parents=True)
    (movable / "game.tw-pddl").write_text('{"solvable": true}')
    games = list_games(tmp_path, "seen")
    assert [g.name for g in games] == ["pick_and_place_simple-Book-None-Desk-302/trial_T1"]
    assert games[0].task_type == "pick"


def test_list_games_empty_split_names_folder_and_fix(tmp_path):
    (tmp_path / "json_2.1.1" / "train").mkdir(parents=True)
    with pytest.raises(UserError) as e:
        list_games(tmp_path, "train")
    msg = str(e.value)
    assert "\n" not in msg
    assert str(tmp_path / "json_2.1.1" / "train") in msg and "alfworld-download" in msg


def test_select_balanced_and_interleaved(alfworld_root):
    train = list_games(alfworld_root, "train")  # 40 per type
    picked = select_games(train, 180, seed=0)
    assert len(picked) == 180 and len(set(picked)) == 180
    assert Counter(g.task_type for g in picked) == {t: 30 for t in SHORT_TASK_TYPES}
    # any prefix is balanced: the first 12 hold two of each type, in TASK_TYPES order
    assert [g.task_type for g in picked[:6]] == list(SHORT_TASK_TYPES)
    assert Counter(g.task_type for g in picked[:12]) == {t: 2 for t in SHORT_TASK_TYPES}


def test_select_remainder_spread(unseen):
    picked = select_games(unseen, 8, seed=3)
    counts = Counter(g.task_type for g in picked)
    # 8 over six types: 2,2,1,1,1,1 with the extra ones to the first types
    assert [counts[t] for t in SHORT_TASK_TYPES] == [2, 2, 1, 1, 1, 1]


def test_select_deterministic_in_seed(unseen):
    a = select_games(unseen, 30, seed=1)
    assert a == select_games(list(reversed(unseen)), 30, seed=1)  # input order does not matter
    assert a != select_games(unseen, 30, seed=2)


def test_select_short_type_fills_from_others(unseen):
    # unseen has 18 look and 17 pick_two games: 120 = 20 a type leaves 2 + 3 = 5 to spread over the other four,
    # one each and the remainder to the first (pick): 22, 18, 21, 21, 21, 17
    picked = select_games(unseen, 120, seed=0)
    counts = Counter(g.task_type for g in picked)
    assert len(picked) == 120 and len(set(picked)) == 120
    assert [counts[t] for t in SHORT_TASK_TYPES] == [22, 18, 21, 21, 21, 17]
    # more than exists: everything, once
    everything = select_games(unseen, 1000, seed=0)
    assert len(everything) == 134 and set(everything) == set(unseen)


def test_select_task_type_subset_and_error(unseen):
    picked = select_games(unseen, 10, seed=0, task_types=["heat", "cool"])
    assert Counter(g.task_type for g in picked) == {"heat": 5, "cool": 5}
    with pytest.raises(UserError, match=r"unknown task type.*'boil'.*pick, look, clean, heat, cool, pick_two"):
        select_games(unseen, 10, seed=0, task_types=["heat", "boil"])
    assert select_games(unseen, 0, seed=0) == []


def test_resolve_data_root_explicit_sets_env(alfworld_root, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    assert resolve_data_root(str(alfworld_root)) == alfworld_root
    assert os.environ["ALFWORLD_DATA"] == str(alfworld_root)


def test_resolve_data_root_bad_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(UserError, match=r"ALFWORLD_DATA=.* has no json_2.1.1"):
        resolve_data_root()


def test_resolve_data_root_finds_shared_next_to_cwd(tmp_path, monkeypatch):
    (tmp_path / "shared" / "alfworld" / "json_2.1.1").mkdir(parents=True)
    (tmp_path / "work").mkdir()
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    monkeypatch.chdir(tmp_path / "work")
    assert resolve_data_root() == (tmp_path / "shared" / "alfworld").resolve()


def test_resolve_data_root_not_found_message(tmp_path):
    # The repository-relative fallback (../shared/alfworld next to the repo) exists here, so run with a copy of
    # the package whose "repository" has no data next to it.
    pkg = tmp_path / "repo" / "seedcli"
    # the whole package (a module the data resolver imports, now or later, is there), its envs/__init__ emptied so the
    # environment registry's imports stay out
    shutil.copytree(REPO / "seedcli", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "envs" / "__init__.py").write_text("")
    (tmp_path / "cwd").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "ALFWORLD_DATA"}
    env["PYTHONPATH"] = str(tmp_path / "repo")
    code = (
        "from seedcli.envs.alfworld.data import resolve_data_root\n"
        "from seedcli.errors import UserError\n"
        "try:\n    resolve_data_root()\nexcept UserError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path / "cwd", env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out.startswith("ALFWorld data not found: set ALFWORLD_DATA=")
    assert "alfworld-download" in out and "\n" not in out


def test_module_does_not_import_torch_or_alfworld():
    code = "import sys, seedcli.envs.alfworld.env; print('torch' in sys.modules, 'alfworld' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    ).stdout.split()
    assert out == ["False", "False"]
