"""`bash scripts/gpu_check.sh --cpu`: the GPU check's steps (model init, collect, annotate, one `seed rl` update with
one-rank FSDP, gradient checkpointing and static skills) on a tiny model, so the script a GPU machine runs cannot rot.
No wheels here: the venv already holds every dependency."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.helpers_cli import ENV, REPO


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_check_runs_on_cpu(tmp_path):
    # this interpreter; the work directory lands under tmp_path
    env = {**ENV, "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--cpu"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-4000:]}\n{proc.stderr[-4000:]}"
    # the steps, as a user runs them
    for step in (
        "seedcli model init --preset tiny",
        "seedcli collect --env sokoban",
        "seedcli annotate --analyzer rules",
    ):
        assert step in out
    rl_line = next(line for line in out.splitlines() if "seedcli rl " in line)
    for flag in ("--engine hf", "parallel=fsdp", "--gradient-checkpointing", "--analyzer static:", "--steps 1"):
        assert flag in rl_line
    # the memory table: every phase beside the plan, then time and tokens
    assert "memory per phase, GiB" in out and "peak alloc" in out and "plan" in out
    table = out.split("memory per phase, GiB", 1)[1]
    for phase in ("rollout", "analyze", "sleep", "rescore", "update", "refresh"):
        assert f"\n  {phase} " in table
    assert "time, s" in out and "tokens/s" in out
    # the checks that matter passed
    for check in (
        "[  ok] seed rl exited 0",
        "[  ok] OPD teacher pass on skill tokens (opd/token_frac > 0)",
        "[  ok] losses, KL, entropy, grad norm and reward finite",
        "[  ok] weight refresh proved by exact checksums",
        "[  ok] hf engine, gradient checkpointing, one-rank FSDP",
    ):
        assert check in out
    assert "FAIL" not in out
    assert out.rstrip().splitlines()[-1].startswith("gpu_check: all ")
    assert not list(tmp_path.glob("seed-gpu-check-*"))  # a passing run removes its work directory
