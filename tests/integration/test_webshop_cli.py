"""The whole pipeline on WebShop through the CLI (subprocesses, CPU, tiny model built in code):
collect → annotate (rules) → sft → rl (SDAR: WebShop's static skill library) → eval, then `seed runs` and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seedcli.artifacts import verify_run
from seedcli.envs import get_env
from seedcli.records import SkillRecord, Trajectory, read_jsonl
from tests.helpers_cli import run_pipeline, seed_cli

pytestmark = pytest.mark.slow  # every stage on WebShop as CLI subprocesses (make test-all; tests/unit covers the environment)

WEBSHOP = get_env("webshop")


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> dict[str, Path]:
    return run_pipeline(tmp_path_factory.mktemp("webshop"), "webshop/tiny")


def test_collect_plays_webshop_goals(pipeline):
    manifest = verify_run(pipeline["collect"], "collect")
    episodes = read_jsonl(pipeline["collect"] / "trajectories.jsonl", Trajectory)
    assert len(episodes) == 10 and manifest.metrics["env"] == "webshop"
    assert {e.category for e in episodes} == set(WEBSHOP.categories)  # 5 goals, one per category
    for e in episodes:
        assert e.env == "webshop" and e.prompt_version == WEBSHOP.prompt_version and 0.0 <= e.score <= 1.0
        assert 1 <= e.length <= 4 and e.sampling["history"] == 2
        for turn in e.turns:
            assert WEBSHOP.task_line_prefix in turn.prompt and e.task in turn.prompt
            assert turn.valid == WEBSHOP.parse_action(turn.response)[1]


def test_annotate_describes_webshop_and_keeps_rules_skills(pipeline):
    verify_run(pipeline["annotate"], "annotate")
    records = read_jsonl(pipeline["annotate"] / "skills.jsonl", SkillRecord)
    assert len(records) == 10 and all(r.env == "webshop" for r in records)
    assert all(r.prompt.startswith(WEBSHOP.analysis_description) for r in records)
    # the prompt's own text never mentions ALFWorld (a random model's responses inside the episode may say anything)
    assert all("ALFRED" not in r.prompt.split("Episode:")[0] + r.prompt.rsplit("Write the skill", 1)[-1] for r in records)
    assert sum(r.reason is None for r in records) >= 8  # the rules analyzer writes a usable rule for nearly all


def test_sft_and_rl_train_on_webshop(pipeline):
    sft = verify_run(pipeline["sft"], "sft")
    assert (pipeline["sft"] / "model" / "config.json").exists() and sft.metrics
    rl = verify_run(pipeline["rl"], "rl")
    rows = [json.loads(line) for line in (pipeline["rl"] / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # WebShop's reward convention: 10·won − 0.1·invalid; the static library has a skill for every category
        assert r["reward/mean"] <= 10.0 and "reward/score_mean" in r
        assert r["opd/valid_skill_frac"] == 1.0
    assert rl.config["env"] == "webshop" and rl.config["advantage_norm"] == "mean"


def test_eval_reports_score_and_success(pipeline):
    verify_run(pipeline["eval"], "eval")
    results = json.loads((pipeline["eval"] / "results.json").read_text())
    assert results["env"] == "webshop" and results["split"] == "test" and results["partial"] is True
    assert results["episodes"] == 5 and results["expected_games"] == 500
    assert set(results["categories"]) >= set(WEBSHOP.categories)
    assert 0.0 <= results["mean_score"] <= 1.0 and 0.0 <= results["micro_success"] <= 1.0
    report = (pipeline["eval"] / "report.md").read_text()
    assert "WebShop" in report and "Score and success by product category" in report and "| SEED (paper) |" in report
    assert "ALFWorld" not in report
    assert (pipeline["eval"] / "success_by_type.png").read_bytes()[:4] == b"\x89PNG"


def test_runs_lists_the_webshop_runs(pipeline):
    out = seed_cli("runs", "--runs-dir", str(pipeline["runs"])).stdout
    for stage in ("collect", "annotate", "sft", "rl", "eval"):
        assert pipeline[stage].name[:16] in out
    assert "env=webshop" in out


@pytest.mark.parametrize(
    "args, needle",
    [
        (["eval", "--env", "nowhere", "--policy", "expert"], "unknown environment 'nowhere'"),
        (["eval", "--env", "webshop", "--split", "seen", "--policy", "expert"], "unknown webshop split"),
        (["collect", "--env", "webshop", "--split", "train", "--model", "/nonexistent"], "/nonexistent"),
    ],
)
def test_bad_input_is_one_line(args, needle, tmp_path):
    proc = seed_cli(*args, "--runs-dir", str(tmp_path / "runs"), check=False)
    assert proc.returncode == 2, proc.stderr
    assert needle.lower() in proc.stderr.lower() and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
