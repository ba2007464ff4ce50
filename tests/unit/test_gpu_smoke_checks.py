"""Each check of the GPU smoke (seedcli/rl/smoke.py) passes on a healthy result and fails when the thing it checks
is broken — so the smoke cannot pass by construction."""

import copy

import pytest

from seedcli.rl.smoke import PHASES, evaluate, failed


def record(step: int) -> dict:
    r = {
        "step": step, "reward/mean": 0.0, "rollout/success_rate": 0.0, "actor/pg_loss": 0.01, "actor/kl": 0.0,
        "actor/entropy": 3.2, "actor/grad_norm": 0.4, "opd/loss": 0.02, "opd/gate_mean": 0.5, "timing_s/rollout": 30.0,
        "timing_s/rescore": 4.0, "timing_s/update": 9.0, "timing_s/sync": 2.0, "timing_s/analyze": 6.0,
        "sync/probe_mean_abs_diff": 0.06, "sync/probe_drift": 0.004, "sync/probe_warn": 0.0,
        "sync/checksum_tensors": 7.0, "actor/lr": 1e-6, "opd/token_frac": 0.4,
        "dist/padding_forwards_rescore": 2.0, "dist/padding_micro_batches": 1.0,
    }  # fmt: skip
    for p in PHASES:
        r[f"mem/{p}/peak_allocated_gib"] = 10.0
        r[f"mem/{p}/peak_reserved_gib"] = 12.0
        r[f"mem/{p}/device_used_gib"] = 40.0
    r["mem/sleep/device_used_gib"] = 14.0  # the engine's share handed back
    return r


def healthy() -> dict:
    run = {"rc": 0, "steps": 2, "world": 2, "lr": 1e-6, "expect_checksums": 7, "metrics": [record(1), record(2)],
           "checkpoint_dtype": "bfloat16", "expect_checkpoint_dtype": "bfloat16", "self_analyzer": True,
           "expect_opd": True}  # fmt: skip
    return {"card_gib": 80.0, "total_wall_s": 420.0, "time_limit_s": 600, "runs": {"multi": run}}


def test_healthy_results_pass_every_check():
    checks = evaluate(healthy())
    assert not failed(checks) and len(checks) >= 13
    assert all(c.ok for c in checks)


def _break(fn):
    res = healthy()
    fn(res, res["runs"]["multi"], res["runs"]["multi"]["metrics"])
    return res


BREAKS = {
    "exited 0": lambda res, run, recs: run.update(rc=1),
    "one metrics record per update": lambda res, run, recs: recs.pop(),
    "present and finite": lambda res, run, recs: recs[0].update({"actor/kl": float("nan")}),
    "exact weight checksum": lambda res, run, recs: recs[1].update({"sync/checksum_tensors": 0.0}),
    "within its calibration": lambda res, run, recs: recs[1].update({"sync/probe_drift": 0.4}),
    "OPD trained on static skills": lambda res, run, recs: recs[1].update({"opd/token_frac": 0.0}),
    "trained at lr": lambda res, run, recs: recs[0].update({"actor/lr": 1e-4}),
    "unequal shares": lambda res, run, recs: [r.update({"dist/padding_forwards_rescore": 0.0,
                                                        "dist/padding_micro_batches": 0.0}) for r in recs],
    "self-analyzer ran": lambda res, run, recs: recs[0].update({"timing_s/analyze": 0.0}),
    "memory reported for every phase": lambda res, run, recs: recs[0].pop("mem/refresh/peak_allocated_gib"),
    "sleep hands its memory back": lambda res, run, recs: recs[1].update({"mem/sleep/device_used_gib": 40.0}),
    "peak fits the card": lambda res, run, recs: recs[0].update({"mem/update/peak_reserved_gib": 79.5}),
    "checkpoint model saved": lambda res, run, recs: run.update(checkpoint_dtype="float32"),
    "under 10 minutes": lambda res, run, recs: res.update(total_wall_s=700.0),
}  # fmt: skip


@pytest.mark.parametrize("key", sorted(BREAKS))
def test_each_check_fails_when_its_thing_is_broken(key):
    bad = failed(evaluate(_break(BREAKS[key])))
    assert bad, f"breaking '{key}' failed no check"
    assert any(key in c.name for c in bad), [c.name for c in bad]


def test_one_rank_skips_the_uneven_check_instead_of_passing_it():
    res = healthy()
    res["runs"]["multi"]["world"] = 1
    (check,) = [c for c in evaluate(res) if "unequal shares" in c.name]
    assert check.ok is None
    assert copy.deepcopy(res) == res


def test_the_probe_check_fails_on_a_warning_and_passes_a_large_calibrated_difference():
    res = healthy()
    recs = res["runs"]["multi"]["metrics"]
    for r in recs:  # a bf16 engine on a trained model: far from the trainer, but steady since calibration
        r["sync/probe_mean_abs_diff"] = 0.3
    assert not failed(evaluate(res))
    recs[0]["sync/probe_warn"] = 1.0  # the run warned (its own tolerance)
    assert [c.name for c in failed(evaluate(res))] == ["multi: probe stays within its calibration (secondary check; "
                                                       "the run only warns)"]  # fmt: skip


def test_only_a_run_on_static_skills_must_train_opd_tokens():
    res = healthy()
    run = res["runs"]["multi"]
    for r in run["metrics"]:
        r["opd/token_frac"] = 0.0  # the self-analyzer on random weights writes no valid skill
    assert failed(evaluate(res))
    del run["expect_opd"]
    checks = evaluate(res)
    assert not failed(checks) and not any("OPD" in c.name for c in checks)
