"""The cheaper update settings end to end on a tiny model (CLI in subprocesses, CPU, text Sokoban; seconds a run):
`old_logp=reuse` (ℓ_old from the update's own forward when the update is one optimizer step), `zero_adv=drop` (only
turn-samples with a nonzero advantage or an OPD term are scored and trained) and `lr_warmup_steps` (a linear ramp)."""

from __future__ import annotations

import math

import pytest

from tests.integration.test_rl_gigpo import model, seed_rl  # noqa: F401  (the module's tiny model fixture)


def test_grpo_with_reuse_drop_and_warmup(model, tmp_path):  # noqa: F811
    records = seed_rl(
        tmp_path, model, "--algo", "grpo", "--analyzer", "none", "steps=3", "lr=3e-4", "lr_warmup_steps=2",
        "old_logp=reuse", "zero_adv=drop", "mini_batch=100000",
    )  # fmt: skip
    assert [r["actor/lr"] for r in records] == pytest.approx([1.5e-4, 3e-4, 3e-4])
    for r in records:
        n = r["rollout/turn_samples"]
        # dropped: exactly the samples with advantage 0 (GRPO has no OPD term)
        assert r["rollout/turn_samples_trained"] == round(n * (1 - r["adv/zero_frac"]))
        assert r["actor/ppo_kl"] == 0.0 and r["actor/clip_frac"] == 0.0  # ℓ_old is θ's own forward: ratio 1
        if r["rollout/turn_samples_trained"]:
            assert r["actor/optimizer_steps"] == 1.0 and r["actor/grad_norm"] > 0
        else:  # every group uniform: nothing to train on, no step
            assert r["actor/optimizer_steps"] == 0.0


@pytest.mark.slow
def test_seed_with_reuse_keeps_every_opd_sample(model, tmp_path):  # noqa: F811
    records = seed_rl(
        tmp_path, model, "--algo", "seed", "--analyzer", "rules", "old_logp=reuse", "zero_adv=drop",
        "mini_batch=100000",
    )  # fmt: skip
    for r in records:
        # the rules analyzer gives every episode a skill: every sample has an OPD term, none is dropped
        assert r["opd/valid_skill_frac"] == 1.0
        assert r["rollout/turn_samples_trained"] == r["rollout/turn_samples"]
        assert r["opd/loss"] != 0.0 and math.isfinite(r["opd/shift_mean"]) and r["opd/shift_mean"] != 0.0
        assert r["actor/ppo_kl"] == 0.0
