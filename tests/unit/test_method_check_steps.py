"""scripts/method_check_steps.py: the rl and eval lines of a method check's pool, and RESUME=1 continuing an rl run
that stopped after a checkpoint (on a machine that kept runs/), or an eval from the episodes it finished, instead of
starting them again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers_cli import load_script


@pytest.fixture(scope="module")
def mc_steps():
    return load_script("method_check_steps")


@pytest.fixture()
def check(tmp_path):
    config = tmp_path / "mc.yaml"
    config.write_text("method_check:\n  seeds: [0, 1]\n  arms:\n    grpo: --algo grpo\n    seed_self: --algo seed\n")
    runs = tmp_path / "runs"
    (runs / "rl").mkdir(parents=True)
    (runs / "index.json").write_text("{}")
    return config, runs


def _rl_run(runs: Path, run_id: str, argv: list[str], status: str, checkpoint: bool) -> Path:
    run = runs / "rl" / run_id
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"stage": "rl", "status": status, "argv": argv}))
    if checkpoint:
        (run / "checkpoints" / "step_000004").mkdir(parents=True)
        (run / "checkpoints" / "step_000004" / "state.json").write_text("{}")
    return run


def test_rl_lines_every_seed_and_arm_with_the_engine(mc_steps, check):
    config, runs = check
    env = {"RUNS": str(runs), "START": "sft/model", "ENGINE": "hf", "ARMS": "grpo"}
    assert mc_steps.steps(str(config), "rl", env) == [
        f"rl_grpo_s{s}\tseed rl -c {config} --runs-dir {runs} --model sft/model seed={s} --algo grpo engine=hf --json"
        for s in (0, 1)
    ]


def test_resume_continues_only_the_same_command_stopped_after_a_checkpoint(mc_steps, check):
    config, runs = check
    env = {"RUNS": str(runs), "START": "sft/model", "RESUME": "1"}
    lines = dict(line.split("\t") for line in mc_steps.steps(str(config), "rl", env))
    words = lines["rl_grpo_s0"].split()
    argv = ["/venv/bin/seed", *words[1:]]
    _rl_run(runs, "20261204T100000Z-aaaa", argv, "failed", checkpoint=True)  # older
    newest = _rl_run(runs, "20261204T110000Z-aaaa", argv, "interrupted", checkpoint=True)
    _rl_run(runs, "20261204T120000Z-aaaa", argv, "failed", checkpoint=False)  # nothing to continue from
    _rl_run(runs, "20261204T130000Z-aaaa", argv, "complete", checkpoint=True)  # finished: not continued
    other = ["/venv/bin/seed", *lines["rl_grpo_s1"].split()[1:]]
    _rl_run(runs, "20261204T140000Z-bbbb", other[:-1] + ["--resume", "x", "--json"], "failed", checkpoint=True)
    lines = dict(line.split("\t") for line in mc_steps.steps(str(config), "rl", env))
    assert lines["rl_grpo_s0"] == " ".join(words) + f" --resume {newest}"
    # an earlier resume of seed 1's command is still seed 1's command
    assert lines["rl_grpo_s1"].endswith(f"--resume {runs / 'rl' / '20261204T140000Z-bbbb'}")
    assert "--resume" not in lines["rl_seed_self_s0"] + lines["rl_seed_self_s1"]
    # without RESUME=1 every run starts afresh
    fresh = mc_steps.steps(str(config), "rl", {**env, "RESUME": "0"})
    assert not any("--resume" in line for line in fresh)


def test_eval_lines_only_for_rl_runs_that_finished(mc_steps, check):
    config, runs = check
    (runs / "index.json").write_text(json.dumps({"rl_seed_self_s1": "runs/rl/r1"}))
    assert mc_steps.steps(str(config), "eval", {"RUNS": str(runs)}) == [
        f"eval_seed_self_s1\tseed eval -c {config} --runs-dir {runs} --from runs/rl/r1 --json"
    ]


def test_resume_continues_an_eval_from_the_episodes_it_finished(mc_steps, check):
    _, runs = check
    env = {"RUNS": str(runs), "RESUME": "1"}
    cmd = f"seed eval -c mc.yaml --runs-dir {runs} --model models/agent engine=hf --json"
    argv = ["/venv/bin/seed", *cmd.split()[1:]]
    for run_id, status, episodes in (
        ("20261204T100000Z-e", "running", "{}\n"),  # killed with the sitting: continued
        ("20261204T110000Z-e", "running", ""),  # nothing finished yet: nothing to continue
        ("20261204T120000Z-e", "complete", "{}\n"),
    ):
        run = runs / "eval" / run_id
        run.mkdir(parents=True)
        (run / "manifest.json").write_text(json.dumps({"stage": "eval", "status": status, "argv": argv}))
        (run / "episodes.jsonl").write_text(episodes)
    assert mc_steps.line("eval_warm", cmd, env) == f"eval_warm\t{cmd} --resume {runs / 'eval' / '20261204T100000Z-e'}"
    other = cmd.replace("models/agent", "sft/model")  # another model: another command
    assert mc_steps.line("eval_start", other, env) == f"eval_start\t{other}"
    assert mc_steps.line("eval_warm", cmd, {**env, "RESUME": "0"}) == f"eval_warm\t{cmd}"


def test_eval_lines_skip_runs_evaluated_right_after_they_finished(mc_steps, check):
    # method_check.sh's pool evaluates each rl run as soon as it finishes; the closing pass only picks up the rest
    config, runs = check
    (runs / "index.json").write_text(
        json.dumps({"rl_grpo_s0": "runs/rl/r0", "eval_grpo_s0": "runs/eval/e0", "rl_grpo_s1": "runs/rl/r1"})
    )
    assert mc_steps.steps(str(config), "eval", {"RUNS": str(runs)}) == [
        f"eval_grpo_s1\tseed eval -c {config} --runs-dir {runs} --from runs/rl/r1 --json"
    ]
