"""The whole pipeline on search-QA through the CLI (subprocesses, CPU, tiny model built in code, BM25 in process):
collect → annotate (rules) → sft → rl (SDAR: the search skill library) → eval, then `seed runs`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seedcli.artifacts import verify_run
from seedcli.envs import get_env
from seedcli.records import SkillRecord, Trajectory, read_jsonl
from tests.helpers_cli import run_pipeline, seed_cli

pytestmark = pytest.mark.slow  # every stage on search-QA as CLI subprocesses (make test-all; tests/unit covers the environment)

SEARCH = get_env("search")


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> dict[str, Path]:
    return run_pipeline(tmp_path_factory.mktemp("search"), "search/tiny", eval_limit=2)


def test_collect_and_annotate_on_search(pipeline):
    verify_run(pipeline["collect"], "collect")
    episodes = read_jsonl(pipeline["collect"] / "trajectories.jsonl", Trajectory)
    assert episodes and all(e.env == "search" and e.category in SEARCH.categories for e in episodes)
    for e in episodes:
        assert 1 <= e.length <= 3 and e.score in (0.0, 1.0) and e.won == (e.score == 1.0)
        for turn in e.turns:
            assert SEARCH.task_line_prefix in turn.prompt and turn.valid == SEARCH.parse_action(turn.response)[1]
    verify_run(pipeline["annotate"], "annotate")
    skills = read_jsonl(pipeline["annotate"] / "skills.jsonl", SkillRecord)
    assert len(skills) == len(episodes) and all(r.prompt.startswith(SEARCH.analysis_description) for r in skills)


def test_rl_uses_the_search_reward_convention(pipeline):
    rl = verify_run(pipeline["rl"], "rl")
    rows = [json.loads(line) for line in (pipeline["rl"] / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # 1·exact match − 0.01 per invalid turn: a random model's episodes score in [−0.03, 1]
        assert -0.01 * 3 - 1e-9 <= r["reward/mean"] <= 1.0 and "reward/score_mean" in r
        assert r["opd/valid_skill_frac"] == 1.0  # the search skill library covers every data source
    assert rl.config["env"] == "search" and rl.config["advantage_norm"] == "mean_std"


def test_eval_reports_exact_match_per_data_source(pipeline):
    verify_run(pipeline["eval"], "eval")
    results = json.loads((pipeline["eval"] / "results.json").read_text())
    assert results["env"] == "search" and results["split"] == "dev" and results["partial"] is True
    report = (pipeline["eval"] / "report.md").read_text()
    assert "xact match" in report and "ALFWorld" not in report and "21M" in report  # the offline note
    out = seed_cli("runs", "--runs-dir", str(pipeline["runs"])).stdout
    assert "env=search" in out
