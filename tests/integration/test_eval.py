"""`seed eval` through the CLI on real valid_seen / valid_unseen games."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from seedcli.artifacts import verify_run
from seedcli.records import Trajectory, read_jsonl
from tests.helpers_cli import ENV, seed_cli

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("model") / "tiny"
    seed_cli("model", "init", "--preset", "tiny", "--out", str(out))
    return out


def _run(runs: Path, *args: str) -> tuple[Path, dict]:
    proc = seed_cli("eval", "--runs-dir", str(runs), "--json", "--workers", "1", *args)
    summary = orjson.loads(proc.stdout.strip().splitlines()[-1])
    run_dir = runs / "eval" / summary["run_id"]
    verify_run(run_dir, "eval")
    return run_dir, json.loads((run_dir / "results.json").read_text())


def test_expert_wins_every_game_of_a_type_balanced_sample(tmp_path):
    run_dir, results = _run(tmp_path, "--split", "unseen", "--policy", "expert", "--limit", "6")
    assert results["partial"] is True and results["expected_games"] == 134 and results["episodes"] == 6
    per_type = {t: v["games"] for t, v in results["categories"].items() if v["games"]}
    assert per_type == {"pick": 1, "look": 1, "clean": 1, "heat": 1, "cool": 1, "pick_two": 1}
    assert results["wins"] == 6 and results["macro_success"] == 1.0 and results["invalid_action_rate"] == 0.0
    episodes = read_jsonl(run_dir / "episodes.jsonl", Trajectory)
    assert all(e.won and e.split == "valid_unseen" and e.length == len(e.turns) for e in episodes)


@pytest.mark.slow
def test_tiny_model_partial_run_writes_results_report_and_png(tiny_model, tmp_path):
    run_dir, results = _run(
        tmp_path, "--split", "seen", "--model", str(tiny_model), "--limit", "12",
        "--max-steps", "2", "--max-new-tokens", "8",
    )
    assert results["partial"] is True and results["episodes"] == 12 and results["expected_games"] == 140
    assert sum(v["games"] for v in results["categories"].values()) == 12
    assert results["tokens_generated"] > 0 and results["mean_episode_length"] <= 2
    report = (run_dir / "report.md").read_text()
    assert "Partial result: 12 of 140 games" in report and "Pick Two" in report
    assert (run_dir / "success_by_type.png").read_bytes().startswith(PNG)
    # the prompt is the ordinary agent prompt: never a skill at evaluation
    assert all("Episode-Level Skill" not in t.prompt for e in read_jsonl(run_dir / "episodes.jsonl", Trajectory) for t in e.turns)


@pytest.mark.slow
def test_random_policy_gives_the_floor_and_report_compares_runs(tmp_path):
    expert_dir, _ = _run(tmp_path, "--split", "seen", "--policy", "expert", "--limit", "6", "--max-steps", "10")
    random_dir, results = _run(tmp_path, "--split", "seen", "--policy", "random", "--limit", "6", "--max-steps", "10")
    assert results["macro_success"] <= 1.0 and results["invalid_action_rate"] == 0.0
    out = tmp_path / "cmp"
    seed_cli("report", str(expert_dir), str(random_dir), "--out", str(out))
    table = (out / "compare.md").read_text()
    # runs are named by their policy (or model), not by their directory
    assert "| | expert policy (partial) | random policy (partial) |" in table
    assert (out / "compare.png").read_bytes().startswith(PNG)


def test_bad_input_is_one_line_with_exit_code_2(tiny_model, tmp_path):
    ckpt = tmp_path / "runs" / "rl" / "x" / "checkpoints" / "step_000001"
    ckpt.mkdir(parents=True)
    empty = tmp_path / "empty_split" / "json_2.1.1" / "valid_seen"
    empty.mkdir(parents=True)
    cases = [
        (["--split", "nowhere", "--policy", "expert"], {}, "split"),
        (["--from", str(ckpt)], {}, "neither a run directory nor a checkpoint"),
        (["--split", "seen", "--policy", "expert"], {"ALFWORLD_DATA": str(tmp_path / "empty_split")}, "no alfworld games"),
    ]
    for args, env, needle in cases:
        proc = subprocess.run(
            [sys.executable, "-m", "seedcli", "eval", "--runs-dir", str(tmp_path / "r"), *args],
            env={**ENV, **env}, capture_output=True, text=True,
        )
        assert proc.returncode == 2, proc.stderr
        assert needle in proc.stderr.lower() and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
