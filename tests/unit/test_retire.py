"""RetireOPD's Adaptive Retirement (seedcli.rl.retire): the teacher retires once the student's validation success
reached the target fraction of the teacher's and the discrepancy stopped shrinking; λ_opd is 0 after that."""

from __future__ import annotations

import json

import pytest

from seedcli.config import RLConfig, build_config
from seedcli.errors import UserError
from seedcli.rl.context import Plan, loss_weights, opd_coef_at
from seedcli.rl.retire import Retirement, retirement_for


def _update(rule: Retirement, shift_mean: float, coef: float = 0.01) -> None:
    rule.observe_update({"opd/coef": coef, "opd/shift_mean": shift_mean})


def test_retires_when_the_gap_stops_shrinking_and_success_is_near_the_teacher():
    rule = Retirement(teacher_success=0.8, fraction=0.9, patience=1)  # target 0.72
    # validation 1 (after updates 1-2): discrepancy mean(0.5, 0.3) = 0.4, the first: a new smallest
    _update(rule, -0.5), _update(rule, -0.3)
    m = rule.observe_validation(2, success=0.9)
    assert m["opd/retire_gap"] == pytest.approx(0.4) and m["opd/retired"] == 0.0 and rule.best_gap == pytest.approx(0.4)
    # validation 2: 0.2 < 0.4 still shrinking, so no retirement although the success is high
    _update(rule, -0.2), _update(rule, -0.2)
    assert rule.observe_validation(4, success=0.9)["opd/retired"] == 0.0 and rule.stale == 0
    # validation 3: 0.25 ≥ 0.2, stopped shrinking, but success 0.7 < 0.72: not yet
    _update(rule, -0.25), _update(rule, -0.25)
    assert rule.observe_validation(6, success=0.7)["opd/retired"] == 0.0 and rule.stale == 1
    # validation 4: still no new smallest gap and success 0.75 ≥ 0.72: retired after update 8
    _update(rule, -0.3), _update(rule, -0.2)
    m = rule.observe_validation(8, success=0.75)
    assert m["opd/retired"] == 1.0 and rule.retired_at == 8 and m["opd/retire_target"] == pytest.approx(0.72)
    # afterwards nothing changes it, and no discrepancy is collected
    _update(rule, -1.0)
    assert rule.window == [] and rule.observe_validation(10, success=0.0)["opd/retired"] == 1.0


def test_patience_counts_validations_in_a_row():
    rule = Retirement(teacher_success=0.5, fraction=1.0, patience=2)
    for step, gap in ((1, 0.3), (2, 0.35), (3, 0.1), (4, 0.2), (5, 0.2)):
        _update(rule, -gap)
        rule.observe_validation(step, success=1.0)
        if step < 5:
            assert rule.retired_at is None, step
    assert rule.retired_at == 5  # 0.2 and 0.2 after the best 0.1: two in a row (0.35 after 0.3 was reset by 0.1)


def test_updates_without_a_teacher_pass_do_not_count():
    rule = Retirement(teacher_success=0.5, patience=1)
    _update(rule, -0.4, coef=0.0)  # opd_start_after_steps: no teacher scored this update
    m = rule.observe_validation(1, success=1.0)
    assert "opd/retire_gap" not in m and rule.best_gap is None and rule.retired_at is None


def test_opd_coef_is_zero_after_the_retirement():
    cfg = RLConfig()
    assert opd_coef_at(cfg, 0.01, 8, retired_at=8) == 0.01  # the update of the deciding validation keeps its weight
    assert opd_coef_at(cfg, 0.01, 9, retired_at=8) == 0.0
    assert opd_coef_at(cfg, 0.01, 9, retired_at=None) == 0.01
    plan = Plan("self", None, 0.01, 5.0)
    assert loss_weights(cfg, plan, 9, retired_at=8).opd_coef == 0.0 and loss_weights(cfg, plan, 9).opd_coef == 0.01


def test_state_survives_a_checkpoint():
    cfg = build_config("rl", overrides=["opd_retire=adaptive", "retire_teacher_success=0.6", "retire_patience=2"])
    rule = retirement_for(cfg)
    assert rule is not None and rule.teacher_success == 0.6 and rule.patience == 2 and rule.fraction == 0.9
    _update(rule, -0.3)
    rule.observe_validation(5, success=0.1)
    _update(rule, -0.4)
    restored = retirement_for(cfg, json.loads(json.dumps(rule.state_dict())))  # state.json round trip
    assert restored.state_dict() == rule.state_dict()
    assert retirement_for(RLConfig()) is None


def test_config_errors_and_hash():
    with pytest.raises(UserError, match="retire_teacher_success"):
        build_config("rl", overrides=["opd_retire=adaptive"])
    with pytest.raises(UserError, match="val_every"):
        build_config("rl", overrides=["opd_retire=adaptive", "retire_teacher_success=0.9", "val_every=0"])
    with pytest.raises(UserError, match="--algo gigpo has none"):
        build_config("rl", overrides=["algo=gigpo", "opd_retire=adaptive", "retire_teacher_success=0.9"])
    base = build_config("rl")
    assert build_config("rl", overrides=["retire_fraction=0.5"]).config_hash() == base.config_hash()  # off: unused
    on = build_config("rl", overrides=["opd_retire=adaptive", "retire_teacher_success=0.9"])
    assert on.config_hash() != base.config_hash()
