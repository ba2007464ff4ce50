"""`seed rl --analyzer oracle` and the signed OPD forms (issue 54 §2, §3) end to end on the tiny model (CLI in
subprocesses, CPU), on every environment with an expert: one update each, with the oracle's privileged skill on every
episode (the leak audit flags all of it), the teacher pass scoring every response token, and the share of OPD weight
that pushes tokens down logged (0 for SEED's gated form, which only raises tokens)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--steps", "1", "--batch-tasks", "2", "--group", "2", "--max-steps", "3", "--max-new-tokens", "12"]


@pytest.fixture(scope="module")
def model(tiny_model) -> Path:
    return tiny_model  # the tiny preset, built once per test run (tests/conftest.py)


def rl_record(runs: Path, model: Path, env: str, *args: str) -> tuple[dict, dict]:
    cmd = [sys.executable, "-m", "seedcli", "rl", "--env", env, "--model", str(model), "--runs-dir", str(runs), *SMALL,
           "--analyzer", "oracle", *args]  # fmt: skip
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, cwd=REPO, env=environ, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = runs / "rl" / "latest"
    (line,) = (run / "metrics.jsonl").read_text().splitlines()
    return json.loads(line), json.loads((run / "manifest.json").read_text())["metrics"]


# make test trains EZPoints; the four other environments run in make test-all (slow)
@pytest.mark.parametrize(
    "env",
    ["ezpoints", *(pytest.param(e, marks=pytest.mark.slow) for e in ("sokoban", "webshop", "search", "alfworld"))],
)
def test_oracle_with_the_signed_form_on_every_environment(model, tmp_path, env):
    rec, summary = rl_record(tmp_path, model, env, "opd_form=signed", "opd_clip=0.5")
    assert rec["opd/valid_skill_frac"] == 1.0  # the expert knows every task
    assert rec["skills/leak_frac"] == 1.0  # privileged by design, and reported so
    assert rec["opd/token_frac"] == 1.0  # every response token had a teacher score under the oracle's text
    # a random tiny model: the oracle's text moves its tokens both ways, so the signed weight pushes some down
    assert 0.0 < rec["opd/push_down_frac"] < 1.0
    assert -0.5 <= rec["opd/gate_mean"] <= 0.5  # the mean signed weight, within ±opd_clip
    assert summary["analyzer"].startswith("oracle (privileged")


@pytest.mark.slow  # two rl runs
def test_gated_form_never_pushes_down_and_reward_direction_follows_the_advantage(model, tmp_path):
    gated, _ = rl_record(tmp_path / "gated", model, "ezpoints")
    assert gated["opd/push_down_frac"] == 0.0 and 0.0 < gated["opd/gate_mean"] < 1.0
    # every tiny-model episode loses: advantages are all 0, so reward_direction has no direction to give
    rd, _ = rl_record(tmp_path / "rd", model, "ezpoints", "opd_form=reward_direction")
    assert rd["adv/zero_frac"] == 1.0 and rd["opd/gate_mean"] == 0.0 and rd["opd/loss"] == 0.0


@pytest.mark.slow
def test_oracle_signed_on_gigpo_step_credit(model, tmp_path):
    rec, _ = rl_record(tmp_path, model, "sokoban", "step_advantage=gigpo", "opd_form=signed")
    assert rec["skills/leak_frac"] == 1.0 and rec["gigpo/state_group/num_groups"] >= 1
    assert rec["opd/token_frac"] == 1.0 and 0.0 < rec["opd/push_down_frac"] < 1.0


def test_oracle_refuses_the_leak_guard(model, tmp_path):
    cmd = [sys.executable, "-m", "seedcli", "rl", "--env", "ezpoints", "--model", str(model), "--runs-dir",
           str(tmp_path), *SMALL, "--analyzer", "oracle", "leak_guard=mask"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "leak_guard=off" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_skill_control_gives_each_episode_another_games_oracle(model, tmp_path):
    rec, _ = rl_record(tmp_path, model, "ezpoints", "skill_control=shuffled", "opd_form=signed", "dump_analyses=true")
    assert rec["opd/token_frac"] == 1.0  # two games an update: each episode reads the other game's oracle
    run = tmp_path / "rl" / "latest"
    games = {
        json.loads(x)["episode_id"]: json.loads(x)
        for x in (run / "analyses" / "step_000001.jsonl").read_text().splitlines()
    }
    prompts = [json.loads(x) for x in (run / "teacher_prompts" / "step_000001.jsonl").read_text().splitlines()]
    assert prompts
    for p in prompts:
        own = games[p["episode_id"]]["skill"]  # the episode's own oracle (what the leak audit sees)
        others = {g["skill"] for g in games.values() if g["group_id"] != games[p["episode_id"]]["group_id"]}
        assert own not in p["teacher_prompt"] and any(o in p["teacher_prompt"] for o in others)
