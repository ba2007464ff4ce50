"""Search-QA's loose ends around eval: the data root, `--datasets` and the per-source `--limit`, the report (no empty
rows, exact match, search calls per episode), and annotate's per-environment rules version in cache keys."""

from __future__ import annotations

import os

import pytest

from seedcli.config import AnnotateConfig, EvalConfig
from seedcli.envs import get_env
from seedcli.envs.base import Task
from seedcli.envs.search.env import SearchEnv
from seedcli.errors import UserError
from seedcli.records import Trajectory, Turn
from seedcli.report.markdown import render_report
from seedcli.report.plots import plot_success_by_type
from seedcli.report.results import summarize_episodes
from seedcli.stages.annotate import _key_model
from seedcli.stages.eval import limit_tasks, only_categories

os.environ.setdefault("OMP_NUM_THREADS", "1")


def test_data_root_explicit_env_var_missing_and_empty(tmp_path, monkeypatch) -> None:
    good = tmp_path / "good"
    (good / "closed").mkdir(parents=True)
    assert SearchEnv(data_root=str(good)).resolve_data_root() == good.resolve()
    monkeypatch.setenv("SEARCH_DATA", str(good))
    assert SearchEnv().resolve_data_root() == good.resolve()
    with pytest.raises(UserError, match=r"does not exist") as missing:
        SearchEnv(data_root=str(tmp_path / "nowhere")).resolve_data_root()
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"holds neither closed/ nor test/") as empty:
        SearchEnv(data_root=str(tmp_path / "empty")).resolve_data_root()
    assert "\n" not in str(missing.value) and "\n" not in str(empty.value)
    assert (SearchEnv.card.category_label, SearchEnv.card.task_noun) == ("data source", "question")
    assert "10k passages" in SearchEnv.card.offline_note and "cannot be compared" in SearchEnv.card.offline_note


def _tasks() -> list[Task]:
    # 5 NQ, 2 Bamboogle, 3 HotpotQA questions
    counts = {"nq": 5, "bamboogle": 2, "hotpotqa": 3}
    return [Task(f"{c}-{i}", c, "test") for c, n in counts.items() for i in range(n)]


def test_limit_applies_per_data_source_and_marks_partial() -> None:
    env = SearchEnv()
    kept, partial = limit_tasks(env, _tasks(), 3, seed=0)
    by_cat = {c: sum(t.category == c for t in kept) for c in ("nq", "bamboogle", "hotpotqa")}
    assert by_cat == {"nq": 3, "bamboogle": 2, "hotpotqa": 3} and partial  # min(3, 5) + min(3, 2) + min(3, 3)
    assert limit_tasks(env, _tasks(), 5, seed=0)[1] is False  # every source fits: the whole split, not partial
    assert limit_tasks(env, _tasks(), 3, seed=0)[0] == kept  # seeded: a rerun plays the same questions
    # ALFWorld keeps `--limit N` as N in all, balanced over categories
    alf_tasks = [Task(f"{c}-{i}", c, "valid_seen") for c in ("pick", "look") for i in range(4)]
    kept, partial = limit_tasks(get_env("alfworld"), alf_tasks, 3, seed=0)
    assert sorted(t.category for t in kept) == ["look", "pick", "pick"] and partial


def test_datasets_choose_data_sources() -> None:
    env = SearchEnv()
    chosen = only_categories(env, _tasks(), ["nq", "bamboogle"])
    assert [t.category for t in chosen] == ["nq"] * 5 + ["bamboogle"] * 2
    assert {t.category for t in only_categories(env, _tasks(), ["hotpot"])} == {"hotpotqa"}  # an alias
    with pytest.raises(UserError, match=r"--categories musique: the split has no such data source; it has nq, bam"):
        only_categories(env, _tasks(), ["musique"])
    cfg = EvalConfig(env="search", categories="nq, bamboogle", limit=20, policy="expert")
    assert cfg.categories == ["nq", "bamboogle"] and cfg.split == "test"
    assert EvalConfig(env="search", datasets="nq, bamboogle").categories == ["nq", "bamboogle"]  # the old name


def _search_episode(i: int, source: str, won: bool, searches: int) -> Trajectory:
    turns = [
        Turn(step=s + 1, observation="o", admissible=[], prompt="p", response="r", action=f"<search>q{s}</search>",
             valid=True)
        for s in range(searches)
    ]  # fmt: skip
    turns.append(Turn(step=searches + 1, observation="o", admissible=[], prompt="p", response="r",
                      action="<answer>x</answer>", valid=True))  # fmt: skip
    return Trajectory(
        episode_id=f"e{i}", group_id=f"e{i}", env="search", task_id=f"{source}-{i}", split="test", category=source,
        task="q?", turns=turns, won=won, score=float(won), reward=float(won), length=len(turns), engine="none",
        model_id="expert", model_hash="", sampling={}, prompt_version="v", seed=0, policy="expert",
    )  # fmt: skip


def test_search_report_has_exact_match_no_empty_rows_and_search_calls(tmp_path) -> None:
    eps = [
        _search_episode(0, "nq", True, 1),
        _search_episode(1, "nq", False, 2),
        _search_episode(2, "bamboogle", True, 0),
    ]
    res = summarize_episodes(eps, split="test", partial=False, expected_games=3, wall_time_s=1.0, env="search")
    # search calls: (1 + 2 + 0) / 3 episodes; average EM over sources: (50% + 100%) / 2
    assert res["per_episode"] == {"search calls": 1.0}
    assert res["macro_score"] == pytest.approx(0.75)
    md = render_report(res, title="Search-QA test", model_desc="expert", run_id="r")
    assert "## Exact match by data source" in md
    assert "| NQ | 2 | 1 | 50.0 |" in md and "| Bamboogle | 1 | 1 | 100.0 |" in md
    assert "| **Macro average** | | | **75.0** |" in md
    for empty in ("TriviaQA", "PopQA", "MuSiQue", "(closed)"):  # zero-question sources are not listed
        assert f"| {empty}" not in md
    assert "| SEED (paper) | 45.7 |" in md and "Mean search calls per episode: 1.00" in md
    assert plot_success_by_type(res, tmp_path / "p.png").read_bytes().startswith(b"\x89PNG")
    # ALFWorld results hold no per-episode counts and keep their columns
    assert "per_episode" not in summarize_episodes([], split="unseen", partial=False, expected_games=1, wall_time_s=0.0)


def test_annotate_cache_key_uses_each_envs_rules_version() -> None:
    cfg = AnnotateConfig(analyzer="rules")
    assert _key_model(cfg, "alfworld") == ("rules-v1", "rules-v1")  # unchanged: earlier caches stay valid
    assert _key_model(cfg, "search") == ("search-rules-v1", "search-rules-v1")
    assert _key_model(cfg, "webshop") == ("webshop-rules-v1", "webshop-rules-v1")
