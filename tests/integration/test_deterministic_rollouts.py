"""`deterministic=true` (issue 55 §8): the same bf16 collect, run twice, plays the same episodes to the last log-prob.

In bf16 a row's sums depend on the rows it is batched with, and async rollouts batch whatever requests are waiting,
which follows thread timing: this test's two collects without the option (async, the default) agreed on 1 of 16
episodes, the issue's probe (untouched timing, ALFWorld) on 0 of 96. `deterministic=true` plays lockstep, so every
batch is made of the same requests whatever the timing; here one run's environment steps are slowed by 40 ms to move
the timing. The model ends its turns early (a random one writes every reply to the token limit, and its async batches
then move in step by themselves)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from seedcli.config import CollectConfig
from seedcli.envs.pool import EnvPool
from seedcli.records import Trajectory, read_jsonl
from tests.helpers_models import build_stopping_model, build_test_model


@pytest.fixture(scope="module")
def stopping_model(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("model")
    return build_stopping_model(build_test_model(root / "tiny"), root / "stopping")


def _collect(model: Path, runs: Path, delay_s: float, monkeypatch) -> dict[str, Trajectory]:
    """A bf16 collect (text Sokoban, 4 games x 4) whose environment steps each take `delay_s` longer."""
    from seedcli.stages import collect

    step_many = EnvPool.step_many

    def slowed(self, items):
        time.sleep(delay_s)
        return step_many(self, items)

    monkeypatch.setattr(EnvPool, "step_many", slowed)
    cfg = CollectConfig(env="sokoban", model=str(model), runs_dir=str(runs), tasks=4, rollouts=4, max_steps=3,
                        max_new_tokens=24, temperature=1.0, device="cpu", dtype="bfloat16", workers=1,
                        deterministic=True)  # fmt: skip
    manifest = collect.run(cfg)
    return {t.episode_id: t for t in read_jsonl(runs / "collect" / manifest.run_id / "trajectories.jsonl", Trajectory)}


def test_bf16_collect_twice_with_deterministic_true_plays_identical_episodes(stopping_model, tmp_path, monkeypatch):
    fast = _collect(stopping_model, tmp_path / "fast", 0.0, monkeypatch)
    slow = _collect(stopping_model, tmp_path / "slow", 0.04, monkeypatch)
    assert sorted(fast) == sorted(slow) and len(fast) == 16
    differ = [eid for eid in fast if fast[eid].model_dump() != slow[eid].model_dump()]
    assert not differ, f"{len(differ)} of 16 episodes differ: {differ}"
    # not trivial: the episodes differ from each other, and replies end at many lengths (so an async schedule's
    # batches would have changed make-up with the timing)
    turns = [turn for ep in fast.values() for turn in ep.turns]
    assert len({tuple(tuple(t.response_ids) for t in ep.turns) for ep in fast.values()}) == 16
    assert len({len(t.response_ids) for t in turns}) >= 2 and any(t.finish_reason == "stop" for t in turns)
