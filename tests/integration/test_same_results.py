"""Sampling is seeded per episode and turn: `--gen-batch`, the number of env workers and a kill + `--resume` leave
every trajectory identical to an uninterrupted run with the same seed (collect and eval; real ALFWorld games, a tiny
random model sampled at temperature 1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seedcli.artifacts import verify_run
from seedcli.config import CollectConfig, EvalConfig
from seedcli.records import Trajectory, read_jsonl

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
SHORT = {"max_steps": 2, "max_new_tokens": 8, "temperature": 1.0}
OUTPUT = {"collect": "trajectories.jsonl", "eval": "episodes.jsonl"}


def _config(stage: str, model: Path, runs: Path, **kw):
    if stage == "collect":
        return CollectConfig(model=str(model), runs_dir=str(runs), tasks=3, rollouts=2, device="cpu", **SHORT, **kw)
    return EvalConfig(model=str(model), runs_dir=str(runs), split="seen", limit=6, device="cpu", **SHORT, **kw)


def _run(stage: str, cfg) -> Path:
    import importlib

    manifest = importlib.import_module(f"seedcli.stages.{stage}").run(cfg)
    return Path(cfg.runs_dir) / stage / manifest.run_id


def _episodes(stage: str, run_dir: Path) -> dict[str, Trajectory]:
    verify_run(run_dir, stage)
    return {t.episode_id: t for t in read_jsonl(run_dir / OUTPUT[stage], Trajectory)}


def _assert_same(a: dict[str, Trajectory], b: dict[str, Trajectory]) -> None:
    assert sorted(a) == sorted(b) and len(a) == 6
    for eid in a:
        ta, tb = a[eid], b[eid]
        assert [t.response_ids for t in ta.turns] == [t.response_ids for t in tb.turns], eid
        assert [t.action for t in ta.turns] == [t.action for t in tb.turns], eid
        assert [t.observation for t in ta.turns] == [t.observation for t in tb.turns], eid
        for x, y in zip(ta.turns, tb.turns, strict=True):  # same tokens; log-probs equal up to batching float noise
            assert max((abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)), default=0.0) < 1e-4


def _kill_then_resume(stage: str, cfg_args: list[str], runs: Path) -> Path:
    args = [sys.executable, "-m", "seedcli", stage, *cfg_args, "--runs-dir", str(runs), "--gen-batch", "2"]
    proc = subprocess.Popen(args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = None
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        found = list((runs / stage).glob(f"*/{OUTPUT[stage]}")) if (runs / stage).exists() else []
        if found and found[0].read_bytes().count(b"\n") >= 2:
            out = found[0]
            break
        time.sleep(0.05)
    assert out is not None and proc.poll() is None, f"{stage} finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 2 <= out.read_bytes().count(b"\n") < 6
    # the recovery command that errors print: the run's own saved config, nothing else
    done = subprocess.run([sys.executable, "-m", "seedcli", stage, "--resume", str(out.parent)], env=ENV,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return out.parent


@pytest.mark.slow  # three runs of each stage
@pytest.mark.parametrize("stage", ["collect", "eval"])
def test_batch_size_workers_and_resume_leave_every_trajectory_identical(stage, tiny_model, tmp_path, alfworld_root):
    runs = tmp_path / "runs"
    base = _episodes(stage, _run(stage, _config(stage, tiny_model, runs, gen_batch=64, workers=1)))
    # the model samples: different episodes of one game differ, so equality below is not trivial
    assert len({tuple(tuple(t.response_ids) for t in ep.turns) for ep in base.values()}) == 6
    _assert_same(base, _episodes(stage, _run(stage, _config(stage, tiny_model, runs / "b2", gen_batch=2, workers=1))))
    _assert_same(base, _episodes(stage, _run(stage, _config(stage, tiny_model, runs / "w2", gen_batch=64, workers=2))))
    cli = ["--model", str(tiny_model), "--device", "cpu", "--max-steps", "2", "--max-new-tokens", "8",
           "--temperature", "1.0", "--workers", "1"]  # fmt: skip
    cli += ["--tasks", "3", "--rollouts", "2"] if stage == "collect" else ["--split", "seen", "--limit", "6"]
    resumed = _kill_then_resume(stage, cli, runs / "killed")
    _assert_same(base, _episodes(stage, resumed))


def test_hf_engine_samples_each_row_from_its_own_seed(tiny_model):
    """A prompt's completion depends on its prompt and seed alone: not on its batch, sub-batch size or position."""
    from seedcli.engines.hf import HFEngine
    from tests.helpers_models import CHATS

    wide, narrow = HFEngine(tiny_model, device="cpu", max_batch=16), HFEngine(tiny_model, device="cpu", max_batch=1)
    prompts = [wide.render(chat) for chat in CHATS]
    kw = dict(temperature=1.0, max_new_tokens=10)
    together = wide.generate(prompts, seeds=[7, 8, 9], **kw)
    alone = narrow.generate([prompts[2], prompts[0]], seeds=[9, 7], **kw)
    assert together[2].token_ids == alone[0].token_ids and together[0].token_ids == alone[1].token_ids
    # the seed matters: another seed, another sample (a 2,496-token vocabulary at temperature 1)
    assert wide.generate([prompts[2]], seeds=[10], **kw)[0].token_ids != together[2].token_ids
    # top-p still samples per row: the same seed gives the same tokens inside and outside a batch
    nucleus = wide.generate(prompts, seeds=[1, 2, 3], temperature=1.0, top_p=0.5, max_new_tokens=10)
    assert (
        nucleus[1].token_ids
        == narrow.generate([prompts[1]], seeds=[2], temperature=1.0, top_p=0.5, max_new_tokens=10)[0].token_ids
    )
