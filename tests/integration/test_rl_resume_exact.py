"""`seed rl --resume` is exact (issue 55 §5): a run killed (SIGKILL) the moment update 1's checkpoint is in place and
then resumed computes what an uninterrupted run computes: every metric but the wall-clock ones, the samples, and the
final checkpoint's files byte for byte (model, optimizer, every generator's state; state.json but its timings), in
fp32 and in bf16 (CLI in subprocesses, the tiny model built in code, real ALFWorld train games).

What parted them before: the fresh run's KL reference was a bf16 cast of the actor, whose rotary `inv_freq` buffer it
cast too, while a resumed run loaded it from disk with inv_freq in fp32 (bf16: actor/kl 0.000445 uninterrupted, 0.000183
resumed, at update 2 on this model); Python's and numpy's generators were never seeded, so every rng.pt held the OS's
entropy (fp32: rng.pt's sha256 differed); and the resumed run re-measured the weight-sync probe's calibration on the
checkpoint (fp32: sync/probe_calibration 2.55e-07 uninterrupted, 2.21e-07 resumed)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STATIC = f"static:{REPO / 'data' / 'static_skills.json'}"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
WALL_CLOCK = ("timing_s/", "perf/")

# `seed rl` that kills itself (SIGKILL: no handler runs) right after the checkpoint of update 1 is renamed into place
CRASH_SCRIPT = """
import os
import signal
import sys

import seedcli.stages.rl as stage

save = stage._TrainingLoop.checkpoint


def checkpoint(self, step, record):
    save(self, step, record)
    if step == 1:
        os.kill(os.getpid(), signal.SIGKILL)


stage._TrainingLoop.checkpoint = checkpoint

if __name__ == "__main__":
    from seedcli.cli import main

    sys.argv[0] = "seed"
    main()
"""


@pytest.fixture(scope="module")
def model(tiny_model) -> Path:
    """The tiny preset (its BPE on every environment's texts), built once per test run (tests/conftest.py)."""
    return tiny_model


def _rl(runs: Path, model: Path, dtype: str, *extra: str, script: Path | None = None) -> subprocess.CompletedProcess:
    args = ["rl", "-c", "tiny", "--model", str(model), "--runs-dir", str(runs), "--max-steps", "2", "--steps", "3",
            "--analyzer", STATIC, f"dtype={dtype}", *extra]  # fmt: skip
    if dtype == "bfloat16":  # async batches follow thread timing, and bf16 sums their make-up (§8)
        args.append("deterministic=true")
    head = [sys.executable, str(script)] if script else [sys.executable, "-m", "seedcli"]
    proc = subprocess.Popen([*head, *args], cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        try:  # the environment workers of a killed run
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _run_dir(runs: Path) -> Path:
    (run,) = [d for d in (runs / "rl").iterdir() if d.is_dir() and not d.is_symlink()]
    return run


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith(WALL_CLOCK)} for row in rows]


def _checkpoint(run: Path, step: int = 3) -> dict[str, object]:
    """Every file of the checkpoint by sha256; state.json read, less the update's wall-clock metrics."""
    root = run / "checkpoints" / f"step_{step:06d}"
    files: dict[str, object] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        name = str(path.relative_to(root))
        if name == "state.json":
            state = json.loads(path.read_text())
            state["metrics"] = {k: v for k, v in state["metrics"].items() if not k.startswith(WALL_CLOCK)}
            files[name] = state
        else:
            files[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kill_after_update_1_then_resume_equals_an_uninterrupted_run(dtype, model, tmp_path, alfworld_root):
    whole = _rl(tmp_path / "whole", model, dtype)
    assert whole.returncode == 0, whole.stderr[-3000:]

    script = tmp_path / "crash.py"
    script.write_text(CRASH_SCRIPT)
    killed = _rl(tmp_path / "killed", model, dtype, script=script)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    run = _run_dir(tmp_path / "killed")
    assert json.loads((run / "manifest.json").read_text())["status"] == "running"
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_000001"]

    resumed = _rl(tmp_path / "killed", model, dtype, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["metrics"]["resumed_from_step"] == 1

    reference = _run_dir(tmp_path / "whole")
    expected, got = _metrics(reference), _metrics(run)
    assert [r["step"] for r in got] == [r["step"] for r in expected] == [1, 2, 3]
    for want, have in zip(expected, got, strict=True):
        assert have.keys() == want.keys(), want["step"]
        differ = {k: (want[k], have[k]) for k in want if have[k] != want[k]}
        assert not differ, (want["step"], differ)
    # the model moved: equality above is not that of two untrained copies
    assert expected[2]["actor/kl"] > 0 and expected[2]["actor/grad_norm"] > 0
    assert (run / "samples.jsonl").read_bytes() == (reference / "samples.jsonl").read_bytes()
    want_files, have_files = _checkpoint(reference), _checkpoint(run)
    assert {"model/model.safetensors", "optimizer.pt", "rng.pt", "state.json"} <= want_files.keys()
    assert have_files == want_files
