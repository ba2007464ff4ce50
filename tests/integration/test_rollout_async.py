"""`rollout: async` (the default) and `rollout: lockstep` give the same trajectories and the same first update on the
hf engine in fp32, through the CLI: each request carries its own seed, so the schedule only decides when it is
served (text Sokoban: no data files, steps cost microseconds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers_cli import seed_cli, summary

COMMON = ["--env", "sokoban", "--max-steps", "3", "--temperature", "1.0", "--json"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("m") / "tiny"
    seed_cli("model", "init", "--preset", "tiny", "--out", str(out))
    return out


def _trajectories(run: Path, name: str = "trajectories.jsonl") -> dict[str, dict]:
    return {t["episode_id"]: t for t in map(json.loads, (run / name).read_text().splitlines())}


def _same(a: dict[str, dict], b: dict[str, dict]) -> None:
    assert sorted(a) == sorted(b) and a
    for eid, ta in a.items():
        tb = b[eid]
        for key in ("response_ids", "action", "observation", "prompt", "reward", "image"):
            assert [t[key] for t in ta["turns"]] == [t[key] for t in tb["turns"]], (eid, key)
        for x, y in zip(ta["turns"], tb["turns"], strict=True):  # log-probs: equal up to batching float noise
            assert max((abs(p - q) for p, q in zip(x["logprobs"], y["logprobs"], strict=True)), default=0) < 1e-4


@pytest.mark.slow
def test_collect_lockstep_and_async_play_the_same_trajectories(tmp_path, tiny):
    runs = {}
    for mode in ("lockstep", "async"):
        out = summary(seed_cli("collect", *COMMON, "--model", str(tiny), "--tasks", "3", "--rollouts", "2",
                               "--max-new-tokens", "24", "--runs-dir", str(tmp_path / mode), f"rollout={mode}"))  # fmt: skip
        runs[mode] = tmp_path / mode / "collect" / out["run_id"]
    lock, asyn = _trajectories(runs["lockstep"]), _trajectories(runs["async"])
    assert len({tuple(tuple(t["response_ids"]) for t in ep["turns"]) for ep in lock.values()}) == 6  # not trivial
    _same(lock, asyn)


@pytest.mark.slow
def test_rl_lockstep_and_async_give_the_same_first_update(tmp_path, tiny):
    rows = {}
    for mode in ("lockstep", "async"):
        out = summary(seed_cli("rl", *COMMON, "--model", str(tiny), "--steps", "1", "--batch-tasks", "2", "--group",
                               "2", "--max-new-tokens", "12", "--runs-dir", str(tmp_path / mode), f"rollout={mode}"))  # fmt: skip
        run = tmp_path / mode / "rl" / out["run_id"]
        rows[mode] = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    lock, asyn = rows["lockstep"], rows["async"]
    for key in ("actor/pg_loss", "actor/kl", "actor/entropy", "actor/grad_norm", "opd/loss", "rollout/response_tokens"):
        assert key in lock and abs(lock[key] - asyn[key]) <= 1e-5 * max(1.0, abs(lock[key])), key
    # the self-analysis (π_old's skills) ran inside the async rollout and decided the same for every episode
    analysis = {k: v for k, v in lock.items() if k.startswith("analyzer/") or k == "opd/valid_skill_frac"}
    assert analysis and analysis == {k: v for k, v in asyn.items() if k in analysis}


@pytest.mark.slow
def test_async_a_dying_env_worker_is_one_error_and_loses_no_finished_episode(tiny):
    """The worker is killed once the first episode has ended: play_episodes raises the pool's one-line error (it
    names the games in play), the finished episode was handed over already, and nothing hangs."""
    import torch

    from seedcli.engines import load_engine
    from seedcli.envs import get_env
    from seedcli.envs.pool import EnvPool
    from seedcli.rollout import EpisodeSpec, ModelPolicy, RolloutSettings, play_episodes

    torch.set_num_threads(1)
    env = get_env("sokoban")
    engine = load_engine("hf", tiny, device="cpu", max_batch=2)
    settings = RolloutSettings(max_steps=2, history=2, temperature=1.0, max_new_tokens=4, seed=0, rollout="async")
    specs = [EpisodeSpec(f"e{i}", f"g{i}", task=t) for i, t in enumerate(env.list_tasks("test")[:6])]
    done: list = []
    with EnvPool(env, 1) as pool:

        def on_done(traj) -> None:
            done.append(traj.episode_id)
            if len(done) == 1:
                pool._procs[0].proc.kill()

        with pytest.raises(RuntimeError, match="env worker 0 failed while playing"):
            play_episodes(specs, ModelPolicy(engine, settings), pool, settings, {}, on_done, max_active=2)
    assert len(done) >= 1
