"""`seed collect` end to end through the CLI: real ALFWorld games, a tiny model built in code, kill + resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from seedcli.artifacts import verify_run
from seedcli.records import Trajectory, read_jsonl
from tests.helpers_cli import ENV, seed_cli

COLLECT = ["--tasks", "6", "--rollouts", "2", "--max-steps", "2", "--max-new-tokens", "12", "--workers", "1"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("model") / "tiny"
    seed_cli("model", "init", "--preset", "tiny", "--out", str(out))
    return out


def _episodes(run_dir: Path) -> list[Trajectory]:
    return read_jsonl(run_dir / "trajectories.jsonl", Trajectory)


def test_collect_writes_a_complete_verified_run_covering_all_task_types(tiny_model, tmp_path):
    runs = tmp_path / "runs"
    proc = seed_cli("collect", "--model", str(tiny_model), "--runs-dir", str(runs), "--json", *COLLECT)
    summary = orjson.loads(proc.stdout.strip().splitlines()[-1])
    run_dir = runs / "collect" / summary["run_id"]
    manifest = verify_run(run_dir, "collect")
    episodes = _episodes(run_dir)
    assert len(episodes) == 12 and manifest.metrics["episodes"] == 12
    assert {e.task_type for e in episodes} == {"pick", "look", "clean", "heat", "cool", "pick_two"}
    assert sorted({e.group_id for e in episodes}) == [f"g{i:04d}" for i in range(6)]
    for e in episodes:
        assert 1 <= e.length <= 2 and len(e.turns) == e.length
        for turn in e.turns:
            assert turn.prompt.startswith("You are an expert agent") and e.task in turn.prompt
            assert len(turn.response_ids) == len(turn.logprobs) <= 12 + 1
            assert turn.action == turn.action.lower()
            assert "help" not in turn.admissible
    assert os.readlink(runs / "collect" / "latest") == run_dir.name


@pytest.mark.slow
def test_sigkill_then_resume_ends_with_the_same_episode_ids_once_each(tiny_model, tmp_path):
    runs = tmp_path / "runs"
    # 4 episodes in play at a time: a kill after the first wave leaves a run that is part done
    args = ["collect", "--model", str(tiny_model), "--runs-dir", str(runs), "--gen-batch", "4", *COLLECT]
    proc = subprocess.Popen([sys.executable, "-m", "seedcli", *args], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = None
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        found = list((runs / "collect").glob("*/trajectories.jsonl")) if (runs / "collect").exists() else []
        if found and found[0].read_bytes().count(b"\n") >= 4:
            out = found[0]
            break
        time.sleep(0.2)
    assert out is not None and proc.poll() is None, "collect finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run_dir = out.parent
    killed_with = {e.episode_id for e in _episodes(run_dir)}
    assert 4 <= len(killed_with) < 12
    assert orjson.loads((run_dir / "manifest.json").read_bytes())["status"] == "running"

    seed_cli(*args, "--resume")
    manifest = verify_run(run_dir, "collect")
    ids = [e.episode_id for e in _episodes(run_dir)]
    assert len(ids) == len(set(ids)) == 12
    assert set(ids) == {f"g{g:04d}-r{r:02d}" for g in range(6) for r in range(2)}
    assert killed_with <= set(ids) and manifest.resumed == 1


def test_bad_input_is_one_line_with_exit_code_2(tiny_model, tmp_path):
    cases = [
        (["--model", str(tmp_path / "nope")], "no such directory"),
        (["--model", str(tiny_model), "--categories", "pick,fly"], "fly"),
        (["--model", str(tiny_model), "--split", "valid_nowhere"], "split"),
    ]
    for extra, needle in cases:
        proc = seed_cli("collect", "--runs-dir", str(tmp_path / "r"), *extra, check=False)
        assert proc.returncode == 2, proc.stderr
        assert needle in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "seedcli", "collect", "--model", str(tiny_model), "--runs-dir", str(tmp_path / "r")],
        env={**ENV, "ALFWORLD_DATA": str(empty)}, capture_output=True, text=True, cwd=tmp_path,
    )
    assert proc.returncode == 2 and "alfworld-download" in proc.stderr and "Traceback" not in proc.stderr
