"""The rl stage's switches and bookkeeping: algorithm → analyzer/coefficients, resume truncation, sample choice."""

import json
from types import SimpleNamespace

import pytest

from seedcli.config import RLConfig, build_config
from seedcli.errors import UserError
from seedcli.rl.run_log import choose_sample_episode, read_records_upto, rewrite_records
from seedcli.stages.rl import node_rank, resolve_plan, world_size


def test_algorithms_are_switches_of_one_loop():
    seed = resolve_plan(RLConfig())
    assert (seed.analyzer, seed.opd_coef, seed.opd_beta, seed.teacher) == ("self", 0.01, 5.0, True)
    grpo = resolve_plan(RLConfig(algo="grpo", analyzer="self"))
    assert (grpo.analyzer, grpo.opd_coef, grpo.teacher) == ("none", 0.0, False)  # no analyzer, no teacher pass
    opsd = resolve_plan(RLConfig(algo="opsd"))
    assert (opsd.analyzer, opsd.opd_beta) == ("self", 0.0)  # constant gate 0.5
    sdar = resolve_plan(RLConfig(algo="sdar"))
    assert sdar.analyzer == "static" and sdar.library.path.endswith("static_skills.json") and sdar.opd_beta == 5.0
    none = resolve_plan(RLConfig(analyzer="none"))
    assert none.analyzer == "none" and not none.teacher


def test_static_analyzer_and_errors(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"pick": "Take the object and put it in the target."}))
    plan = resolve_plan(RLConfig(analyzer=f"static:{p}"))
    # keyed by the env's categories (ALFWorld: the short task type)
    assert plan.analyzer == "static" and plan.library.skills == {"pick": ["Take the object and put it in the target."]}
    with pytest.raises(UserError, match="use self | static:FILE | none"):
        resolve_plan(RLConfig(analyzer="glm"))
    with pytest.raises(UserError, match="sdar needs skills"):
        resolve_plan(RLConfig(algo="sdar", analyzer="none"))
    with pytest.raises(UserError, match="not found"):
        resolve_plan(RLConfig(analyzer=f"static:{tmp_path / 'missing.json'}"))


def test_oracle_without_an_expert_is_refused_before_the_run(tmp_path):
    """Issue 62 §1: it ended `complete` as plain GRPO (`opd/valid_skill_frac 0`)."""
    from seedcli.stages import rl

    no_expert = RLConfig(env="tests.unit.test_text_env:NoExpert", analyzer="oracle", runs_dir=str(tmp_path),
                         model=str(tmp_path / "no_model"))  # fmt: skip
    with pytest.raises(UserError, match=r"^--analyzer oracle: NoExpert has no expert, so there is no plan to give"):
        rl.run(no_expert)  # before the model is looked at or a run directory is made
    assert not (tmp_path / "rl").exists()
    assert resolve_plan(RLConfig(env="tests.unit.test_text_env:Countdown", analyzer="oracle")).analyzer == "oracle"


def test_teacher_settings_under_grpo_are_refused():
    """Issue 62 §1: opd_form, skill_control and opd_contrast change nothing without an OPD teacher."""
    for setting in ("opd_form=signed", "skill_control=shuffled", "opd_contrast=shuffled"):
        for algo in ("grpo", "gigpo"):
            with pytest.raises(
                UserError, match=rf"--algo {algo} has no OPD teacher, so {setting} would change nothing"
            ):
                build_config("rl", overrides=[f"algo={algo}", setting])
        build_config("rl", overrides=["algo=seed", setting])  # where it does something


def test_world_size_and_conflicts():
    assert world_size(RLConfig(nproc=3)) == 3
    with pytest.raises(UserError, match="not both"):
        world_size(RLConfig(nproc=2, gpus=2))


def test_paper_preset_values():
    cfg = build_config("rl", "paper_qwen25_3b")
    assert (cfg.steps, cfg.batch_tasks, cfg.group, cfg.lr, cfg.kl_coef, cfg.entropy_coef) == (
        150,
        16,
        8,
        1e-6,
        0.01,
        0.001,
    )
    assert (cfg.opd_coef, cfg.opd_beta, cfg.clip_eps, cfg.dual_clip, cfg.mini_batch, cfg.max_steps) == (
        0.01,
        5.0,
        0.2,
        3.0,
        256,
        30,
    )
    # fields that do not change the computation stay out of the config hash, so --resume accepts them changed
    assert RLConfig(nproc=2, keep_checkpoints=3, sync_tol=0.1).config_hash() == RLConfig().config_hash()
    assert RLConfig(opd_beta=0.0).config_hash() != RLConfig().config_hash()


def test_resume_truncates_logs_to_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 4, "half')  # killed mid-line
    rewrite_records(path, read_records_upto(path, 2))
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]
    rewrite_records(path, [{"step": 3, "x": float("nan")}])
    assert json.loads(path.read_text()) == {"step": 3, "x": "nan"}  # a non-finite value is spelled out, not null
    assert read_records_upto(tmp_path / "none.jsonl", 5) == []


def test_sample_episode_prefers_a_won_one_with_a_skill():
    eps = [SimpleNamespace(won=False), SimpleNamespace(won=True), SimpleNamespace(won=True)]
    assert choose_sample_episode(eps, [None, None, "skill"]) == 2
    assert choose_sample_episode(eps, ["skill", None, None]) == 0
    assert choose_sample_episode(eps, [None, None, None]) == 0


def test_node_rank_from_torchrun_args():
    assert node_rank(None) == 0
    assert node_rank("--nnodes 2 --node-rank 1 --rdzv-endpoint h:29500") == 1
    assert node_rank("--nnodes=2 --node_rank=3") == 3


def test_nothing_under_rl_imports_an_environment_or_a_stage():
    """Imports run downward (docs/design.md §4): the stage hands rl/ what it needs of the environment."""
    import ast
    from pathlib import Path

    import seedcli.rl

    offenders = []
    for path in sorted(Path(seedcli.rl.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
            for name in names:
                if name.startswith(("seedcli.envs", "seedcli.stages", "seedcli.cli", "..envs", "..stages", "..cli")):
                    offenders.append(f"{path.name}: {name}")
    assert not offenders, offenders
