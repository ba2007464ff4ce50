"""scripts/positive_control_report.py: which arm is read against which (its shuffled control, and GRPO at its own
learning rate), on the arms of configs/positive_control.yaml."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.helpers_cli import REPO, load_script

ARMS = list(yaml.safe_load(Path(REPO / "configs" / "positive_control.yaml").read_text())["positive_control"]["arms"])


def test_each_arm_meets_grpo_at_its_own_learning_rate():
    report = load_script("positive_control_report")
    assert report.grpo_of("signed_oracle_lr1e4", ARMS) == "grpo_lr1e4"
    assert report.grpo_of("signed_oracle_lr1e4_shuffled", ARMS) == "grpo_lr1e4"
    assert report.grpo_of("signed_oracle", ARMS) == "grpo"
    assert report.grpo_of("seed_self", ARMS) == "grpo"
    assert report.grpo_of("signed_oracle_t1", ARMS) is None  # no GRPO sampled at temperature 1
    assert report.grpo_of("grpo_lr1e4", ARMS) is None
    assert report.grpo_of("signed_oracle_lr1e4", [a for a in ARMS if a != "grpo_lr1e4"]) is None  # never lr 1e-5's


def test_the_contrasts_are_each_control_then_grpo_at_the_same_rate():
    pairs = load_script("positive_control_report").contrast_pairs(ARMS)
    assert pairs[:3] == [
        ("signed_oracle", "signed_oracle_shuffled"),
        ("signed_oracle_t1", "signed_oracle_t1_shuffled"),
        ("signed_oracle_lr1e4", "signed_oracle_lr1e4_shuffled"),
    ]
    against_grpo = dict(pairs[3:])
    assert against_grpo["signed_oracle_lr1e4"] == "grpo_lr1e4" and against_grpo["signed_oracle"] == "grpo"
    assert not any(a.endswith("_shuffled") or a.startswith("grpo") for a in against_grpo)  # controls, baselines
    assert "signed_oracle_t1" not in against_grpo and len(pairs) == len(set(pairs))
