"""`seed rl --algo gigpo` and `--algo seed step_advantage=gigpo` end to end on a tiny model (CLI in subprocesses, CPU,
Sokoban with text observations: rooms come from seeds, no data files; about ten seconds a run).

- GiGPO: no analyzer and no teacher pass; the step-group sizes are logged every update and add up: every turn-sample is
  in one step group, groups never span two games, and the first turns of a game's episodes (the same room) share one.
- SEED on GiGPO: the same step groups and SEED's OPD term on top (the rules analyzer gives every episode a skill);
  with `opd_retire=adaptive` the retirement metrics are logged at each validation and, once retired, λ_opd stays 0.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STEP_GROUP = "gigpo/state_group"


@pytest.fixture(scope="module")
def model(tiny_model) -> Path:
    return tiny_model  # the tiny preset, built once per test run (tests/conftest.py)


def seed_rl(runs: Path, model: Path, *args: str) -> list[dict]:
    cmd = [sys.executable, "-m", "seedcli", "rl", "-c", "sokoban/tiny", "--model", str(model), "--runs-dir", str(runs),
           *args]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run,) = [d for d in (runs / "rl").iterdir() if d.is_dir() and not d.is_symlink()]
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def check_step_groups(r: dict) -> None:
    """The step-group sizes of one update add up (batch_tasks 2 games × group 2 episodes in sokoban/tiny)."""
    games, group = r["rollout/games"], r["rollout/episodes"] // r["rollout/games"]
    n, k = r[f"{STEP_GROUP}/num_samples"], r[f"{STEP_GROUP}/num_groups"]
    assert n == r["rollout/turn_samples"] > 0
    assert r[f"{STEP_GROUP}/mean"] == pytest.approx(n / k)
    assert 1 <= r[f"{STEP_GROUP}/min"] <= r[f"{STEP_GROUP}/mean"] <= r[f"{STEP_GROUP}/max"] <= n
    # at least one group per game; a game's episodes start in the same room, so its first turns share one group
    assert games <= k <= n - games * (group - 1)
    assert 0.0 <= r[f"{STEP_GROUP}/size_1_sample_prop"] <= r[f"{STEP_GROUP}/size_1_group_prop"] <= 1.0


def test_gigpo_logs_step_groups_and_trains_without_a_teacher(model, tmp_path):
    records = seed_rl(tmp_path, model, "--algo", "gigpo")
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        check_step_groups(r)
        assert r["opd/coef"] == 0.0 and r["opd/loss"] == 0.0 and r["timing_s/rescore_teacher"] == 0.0
        assert r["actor/skipped"] == 0.0 and r["actor/optimizer_steps"] >= 1


@pytest.mark.slow
def test_seed_on_gigpo_adds_opd_and_the_teacher_can_retire(model, tmp_path):
    records = seed_rl(
        tmp_path, model, "--algo", "seed", "--analyzer", "rules", "step_advantage=gigpo", "steps=3",
        "val_every=1", "val_games=2", "opd_retire=adaptive", "retire_teacher_success=0.0",
    )  # fmt: skip
    assert [r["step"] for r in records] == [1, 2, 3]
    retired_after = None
    for r in records:
        check_step_groups(r)
        assert r["opd/retire_target"] == 0.0 and "val/success_rate" in r
        if retired_after is None:
            assert r["opd/coef"] == 0.01 and r["opd/loss"] != 0.0 and r["opd/valid_skill_frac"] == 1.0
            assert math.isfinite(r["opd/retire_gap"])  # ℓ_old − ℓ_skill averaged over the update's skill tokens
        else:  # retired at an earlier validation: RL alone, no teacher pass
            assert r["opd/coef"] == 0.0 and r["opd/loss"] == 0.0 and r["timing_s/rescore_teacher"] == 0.0
        if r["opd/retired"] == 1.0 and retired_after is None:
            retired_after = r["step"]
    # the first validation only records the discrepancy; with a target of 0 the second retires the teacher exactly
    # when its discrepancy did not shrink (retire_patience 1)
    assert records[0]["opd/retired"] == 0.0
    assert (records[1]["opd/retired"] == 1.0) == (records[1]["opd/retire_gap"] >= records[0]["opd/retire_gap"])
