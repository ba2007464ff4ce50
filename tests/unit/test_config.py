import pytest

from seedcli.config import build_config, parse_overrides
from seedcli.errors import UserError


def test_paper_preset_carries_the_design_numbers():
    rl = build_config("rl", "paper_qwen25_3b")
    assert (rl.steps, rl.batch_tasks, rl.group, rl.lr, rl.kl_coef, rl.opd_coef, rl.opd_beta) == (
        150, 16, 8, 1e-6, 0.01, 0.01, 5.0
    )
    assert (rl.entropy_coef, rl.clip_eps, rl.dual_clip, rl.mini_batch, rl.temperature) == (0.001, 0.2, 3.0, 256, 1.0)
    collect = build_config("collect", "paper_qwen25_3b")
    assert (collect.tasks, collect.rollouts, collect.temperature, collect.max_new_tokens) == (180, 8, 0.4, 512)
    sft = build_config("sft", "paper_qwen25_3b")
    assert (sft.epochs, sft.lr, sft.max_length, sft.val_fraction) == (3, 5e-6, 8192, 0.1)


def test_precedence_defaults_preset_cli_overrides():
    cfg = build_config("collect", "tiny", {"tasks": 12}, ["temperature=0.25", "task_types=pick,look"])
    assert cfg.tasks == 12 and cfg.rollouts == 2 and cfg.temperature == 0.25
    assert cfg.categories == ["pick", "look"]  # task_types: the old name of categories


def test_bad_keys_values_and_files_are_one_line_user_errors(tmp_path):
    with pytest.raises(UserError, match="field 'tmperature'.*valid keys"):
        build_config("collect", None, None, ["tmperature=1"])
    with pytest.raises(UserError, match="field 'tasks'"):
        build_config("collect", None, {"tasks": -1})
    bad = tmp_path / "bad.yaml"
    bad.write_text("collect: [1, 2\n")
    with pytest.raises(UserError, match="not valid YAML"):
        build_config("collect", str(bad))
    with pytest.raises(UserError, match="presets: "):
        build_config("collect", "no-such-preset")
    with pytest.raises(UserError, match="not key=value"):
        parse_overrides(["temperature"])


def test_group_of_one_is_refused_where_it_leaves_nothing_to_learn():
    # issue 55 §3: group=1 gives every episode a group of its own, so GRPO-style advantages are all 0
    for algo in ("grpo", "gigpo"):
        with pytest.raises(UserError, match="no baseline and every advantage is 0"):
            build_config("rl", "tiny", None, [f"algo={algo}", "group=1"])
    assert build_config("rl", "tiny", None, ["algo=seed", "group=1"]).group == 1  # the OPD term still teaches
