"""`bash scripts/gpu_check.sh --cpu`: the GPU check's steps (model init, collect, annotate, one `seed rl` update with
one-rank FSDP, gradient checkpointing and static skills) on a tiny model, so the script a GPU machine runs cannot rot.
No wheels here: the venv already holds every dependency."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys

import pytest

from tests.helpers_cli import ENV, REPO


@pytest.mark.slow  # the GPU check on CPU
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_check_runs_on_cpu(tmp_path):
    # this interpreter; the work directory lands under tmp_path
    env = {**ENV, "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--cpu"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-4000:]}\n{proc.stderr[-4000:]}"
    # the free space it found, before any step: here the tiny model's few MiB in $TMPDIR
    space = next(line for line in out.splitlines() if line.startswith("gpu_check: free space: "))
    assert f"{tmp_path} " in space and "GiB" in space and f"using {tmp_path}" in space
    assert out.index(space) < out.index("seedcli model init")
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


def _gpu_check_module():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_space_is_planned_before_the_gpu_and_the_checkpoint_dropped_when_it_does_not_fit(monkeypatch):
    """The 3B shape writes ~54 GB (model + rl checkpoint) or ~7 GB without the checkpoint: where there is room for
    the model only, the GPU check runs without the checkpoint (when `seed rl` can) instead of failing late."""
    gc = _gpu_check_module()
    full, light = gc.space_needed("qwen2.5-3b-shape", True), gc.space_needed("qwen2.5-3b-shape", False)
    params = full / 16 / 1.1
    assert 3.0e9 < params < 3.2e9 and light == pytest.approx(full / 8)
    gib = gc.GIB
    monkeypatch.setattr(gc, "work_roots", lambda out: ["/big", "/small"])
    monkeypatch.setattr(gc, "free_space", lambda roots: {"/big": 60 * gib, "/small": 10 * gib})
    root, checkpoint, line = gc.plan_space(None, "qwen2.5-3b-shape", True, auto=True)
    assert (root, checkpoint) == ("/big", True) and "/big 60.0 GiB, /small 10.0 GiB" in line
    monkeypatch.setattr(gc, "free_space", lambda roots: {"/big": 30 * gib, "/small": 10 * gib})
    monkeypatch.setattr(gc, "no_checkpoint_supported", lambda: True)
    root, checkpoint, line = gc.plan_space(None, "qwen2.5-3b-shape", True, auto=True)
    assert (root, checkpoint) == ("/big", False) and "running without it (--no-checkpoint" in line
    monkeypatch.setattr(gc, "no_checkpoint_supported", lambda: False)  # a seed rl that always checkpoints
    root, _, line = gc.plan_space(None, "qwen2.5-3b-shape", True, auto=True)
    assert root is None and "no folder has it" in line and "--out DIR" in line
    monkeypatch.setattr(gc, "free_space", lambda roots: {"/big": 5 * gib})
    root, _, line = gc.plan_space(None, "qwen2.5-3b-shape", False, auto=True)
    assert root is None and f"needs {light / gib:.1f} GiB" in line
