"""SEED's per-token losses against hand-computed values and their gradients."""

import math

import pytest
import torch

from seedcli.rl.losses import low_var_kl, masked_mean, opd_loss, ppo_clip_loss, ppo_clip_stats, total_loss

torch.set_num_threads(1)


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# --- masked_mean ---------------------------------------------------------------------------------------


def test_masked_mean_averages_only_masked_tokens():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    assert masked_mean(x, mask).item() == pytest.approx((1 + 3 + 5) / 3)


def test_masked_mean_of_empty_mask_is_zero_with_zero_gradient():
    x = torch.tensor([[1.0, 2.0]], requires_grad=True)
    out = masked_mean(x, torch.zeros(1, 2))
    out.backward()
    assert out.item() == 0.0
    assert torch.equal(x.grad, torch.zeros(1, 2))


def test_masked_mean_ignores_nan_and_inf_under_the_mask():
    x = torch.tensor([[2.0, float("nan"), float("-inf")]])
    assert masked_mean(x, torch.tensor([[1.0, 0.0, 0.0]])).item() == 2.0


# --- low_var_kl ----------------------------------------------------------------------------------------


def test_kl_is_zero_when_policies_agree():
    logp = torch.log(torch.tensor([[0.1, 0.5, 0.9]]))
    assert torch.equal(low_var_kl(logp, logp.clone()), torch.zeros(1, 3))


def test_kl_matches_k3_by_hand_and_is_positive():
    logp = torch.log(torch.tensor([[0.5, 0.1]]))
    ref_logp = torch.log(torch.tensor([[0.25, 0.1 * math.exp(-2.0)]]))
    kl = low_var_kl(logp, ref_logp)
    # x = ref − logp: log 0.5 and −2
    expected = [0.5 - math.log(0.5) - 1.0, math.exp(-2.0) + 2.0 - 1.0]
    assert kl[0].tolist() == pytest.approx(expected, rel=1e-6)
    assert (kl > 0).all()


def test_kl_gradient_by_hand():
    logp = torch.tensor([[-1.0]], requires_grad=True)
    ref_logp = torch.tensor([[-1.5]])
    low_var_kl(logp, ref_logp).sum().backward()
    # d/dlogp [exp(r − l) − (r − l) − 1] = −exp(r − l) + 1
    assert logp.grad.item() == pytest.approx(1.0 - math.exp(-0.5), rel=1e-6)


def test_kl_is_clamped_to_ten_both_ways():
    logp = torch.tensor([[0.0, 0.0, 0.0]])
    ref_logp = torch.tensor([[30.0, -30.0, 3.0]])
    kl = low_var_kl(logp, ref_logp)
    # log-ratio ±30 → ±20 first (no overflow), then the k3 value is capped at 10; x = 3 gives e³ − 4 > 10 too
    assert kl.tolist() == [[10.0, 10.0, 10.0]]
    assert torch.isfinite(kl).all()


# --- PPO -----------------------------------------------------------------------------------------------


def test_ppo_loss_one_by_three_by_hand():
    old_logp = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1]]))  # ratios 1.5, 0.5, 1.1
    advantages = torch.tensor([[1.0, 1.0, -1.0]])
    mask = torch.ones(1, 3)
    # token 0: max(−1.5, −1.2) = −1.2 (clipped at 1 + ε); token 1: max(−0.5, −0.8) = −0.5;
    # token 2 (A < 0): max(1.1, 1.1) = 1.1, min(3·1, 1.1) = 1.1
    expected = (-1.2 - 0.5 + 1.1) / 3
    assert ppo_clip_loss(logp, old_logp, advantages, mask).item() == pytest.approx(expected, rel=1e-6)
    stats = ppo_clip_stats(logp, old_logp, advantages, mask)
    assert stats["actor/clip_frac"].item() == pytest.approx(1 / 3)
    assert stats["actor/clip_frac_lower"].item() == 0.0
    assert stats["actor/ppo_kl"].item() == pytest.approx(-(math.log(1.5) + math.log(0.5) + math.log(1.1)) / 3)


def test_ppo_dual_clip_caps_negative_advantage_at_c_times_abs_a():
    logp = torch.tensor([[math.log(10.0)]], requires_grad=True)
    old_logp = torch.zeros(1, 1)
    advantages = torch.tensor([[-2.0]])
    loss = ppo_clip_loss(logp, old_logp, advantages, torch.ones(1, 1), clip_eps=0.2, dual_clip=3.0)
    loss.backward()
    # unclipped −A·r = 20 would dominate; dual clip caps it at c·|A| = 6 and stops the gradient
    assert loss.item() == pytest.approx(6.0)
    assert logp.grad.item() == 0.0
    stats = ppo_clip_stats(logp, old_logp, advantages, torch.ones(1, 1))
    assert stats["actor/clip_frac_lower"].item() == 1.0


def test_ppo_dual_clip_does_not_touch_positive_advantage():
    logp = torch.tensor([[math.log(10.0)]], requires_grad=True)
    advantages = torch.tensor([[2.0]])
    loss = ppo_clip_loss(logp, torch.zeros(1, 1), advantages, torch.ones(1, 1))
    loss.backward()
    # clipped at −A·(1 + ε) = −2.4, not min(−A·c, ·) = −6
    assert loss.item() == pytest.approx(-2.4)
    assert logp.grad.item() == 0.0


def test_ppo_gradient_inside_the_trust_region_is_minus_a_times_ratio():
    logp = torch.log(torch.tensor([[1.1, 0.9]])).requires_grad_()
    advantages = torch.tensor([[2.0, -1.0]])
    ppo_clip_loss(logp, torch.zeros(1, 2), advantages, torch.ones(1, 2)).backward()
    # d(−A·exp(logp))/dlogp = −A·r, divided by the 2 masked tokens
    assert logp.grad[0].tolist() == pytest.approx([-2.0 * 1.1 / 2, 1.0 * 0.9 / 2], rel=1e-6)


def test_ppo_ignores_masked_tokens():
    logp = torch.tensor([[0.0, 50.0]])  # the masked token's ratio would overflow without the clamp
    advantages = torch.tensor([[1.0, -1.0]])
    loss = ppo_clip_loss(logp, torch.zeros(1, 2), advantages, torch.tensor([[1.0, 0.0]]))
    assert loss.item() == pytest.approx(-1.0)


def test_ppo_rejects_dual_clip_not_above_one():
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), dual_clip=1.0)


# --- OPD -----------------------------------------------------------------------------------------------


def test_opd_loss_and_gate_by_hand():
    student = torch.tensor([[-1.0, -2.0, -0.5]])
    teacher = torch.tensor([[-0.5, -3.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, gate = opd_loss(student, teacher, mask, beta=5.0)
    g = [sigmoid(5 * 0.5), sigmoid(5 * -1.0), 0.5]
    assert gate[0].tolist() == pytest.approx(g, rel=1e-6)
    assert loss.item() == pytest.approx((g[0] * 0.5 + g[1] * -1.0) / 2, rel=1e-6)


def test_opd_gradient_is_minus_gate_over_masked_count():
    torch.manual_seed(0)
    student = torch.randn(2, 5, requires_grad=True)
    teacher = torch.randn(2, 5, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0, 1.0]])
    loss, gate = opd_loss(student, teacher, mask, beta=5.0)
    loss.backward()
    assert not gate.requires_grad
    torch.testing.assert_close(student.grad, -gate * mask / mask.sum())
    assert teacher.grad is None or torch.equal(teacher.grad, torch.zeros_like(teacher))


def test_opd_gate_is_half_when_beta_is_zero():
    student = torch.tensor([[-4.0, -0.1]])
    teacher = torch.tensor([[-0.1, -4.0]])
    loss, gate = opd_loss(student, teacher, torch.ones(1, 2), beta=0.0)
    assert gate.tolist() == [[0.5, 0.5]]
    assert loss.item() == pytest.approx(0.5 * (3.9 - 3.9) / 2, abs=1e-7)


def test_opd_gate_favours_tokens_the_skill_endorses():
    student = torch.tensor([[-2.0, -2.0]])
    teacher = torch.tensor([[-1.0, -3.0]])  # endorsed, rejected
    _, gate = opd_loss(student, teacher, torch.ones(1, 2))
    assert gate[0, 0] > 0.99 and gate[0, 1] < 0.01


def _direct_weight(form: str, delta: float, adv: float, c: float) -> float:
    """The per-token weight on −∇ℓ_θ written out from docs/parity.md, one scalar at a time."""
    if form == "signed":
        return max(-c, min(c, delta))
    sign = (adv > 0) - (adv < 0)
    return sign * max(0.0, min(c, sign * delta))


@pytest.mark.parametrize("form", ["signed", "reward_direction"])
@pytest.mark.parametrize("denom", [None, 11.0])
def test_signed_forms_gradient_equals_a_direct_computation(form, denom):
    torch.manual_seed(1)
    student = (torch.randn(3, 6) * 2).requires_grad_(True)
    teacher = torch.randn(3, 6) * 2
    adv = torch.tensor([1.3, -0.7, 0.0]).unsqueeze(1).expand(3, 6).contiguous()  # one advantage per reply
    mask = (torch.rand(3, 6) > 0.3).float()
    c = 0.8
    loss, weight = opd_loss(student, teacher, mask, beta=5.0, denom=denom, form=form, clip=c, advantages=adv)
    loss.backward()
    n = denom if denom is not None else mask.sum().item()
    expected_w = torch.tensor(
        [[_direct_weight(form, float(teacher[i, j] - student[i, j]), float(adv[i, j]), c) for j in range(6)]
         for i in range(3)]
    )  # fmt: skip
    torch.testing.assert_close(weight, expected_w)
    torch.testing.assert_close(student.grad, -expected_w * mask / n)  # ∇L = −w·∇ℓ_θ / n
    assert not weight.requires_grad
    assert loss.item() == pytest.approx(float((-expected_w * student.detach() * mask).sum()) / n, rel=1e-5)


def test_signed_pushes_down_what_the_teacher_dislikes_and_gated_never_does():
    student = torch.tensor([[-2.0, -2.0]], requires_grad=True)
    teacher = torch.tensor([[-1.0, -3.0]])  # endorsed (Δ = +1), disliked (Δ = −1)
    ones = torch.ones(1, 2)
    _, gate = opd_loss(student, teacher, ones)
    assert bool((gate > 0).all())  # SEED's gate raises both tokens
    _, w = opd_loss(student, teacher, ones, form="signed", clip=0.5)
    assert w.tolist() == [[0.5, -0.5]]  # clipped at c, and the disliked token is pushed down
    win, lose = torch.full((1, 2), 2.0), torch.full((1, 2), -2.0)
    _, w_win = opd_loss(student, teacher, ones, form="reward_direction", advantages=win)
    _, w_lose = opd_loss(student, teacher, ones, form="reward_direction", advantages=lose)
    assert w_win.tolist() == [[1.0, 0.0]]  # a win: the endorsed token goes up more, the disliked gets nothing
    assert w_lose.tolist() == [[0.0, -1.0]]  # a loss: the disowned token goes down more, never up
    _, w_zero = opd_loss(student, teacher, ones, form="reward_direction", advantages=torch.zeros(1, 2))
    assert w_zero.abs().sum() == 0
    with pytest.raises(ValueError, match="advantages"):
        opd_loss(student, teacher, ones, form="reward_direction")
    with pytest.raises(ValueError, match="unknown opd_form"):
        opd_loss(student, teacher, ones, form="kl")


# --- total ---------------------------------------------------------------------------------------------


def test_total_loss_signs_and_paper_coefficients():
    ppo, kl, ent, opd = (torch.tensor(v) for v in (1.0, 2.0, 3.0, 4.0))
    assert total_loss(ppo, kl, ent, opd).item() == pytest.approx(1.0 + 0.01 * 2.0 - 0.001 * 3.0 + 0.01 * 4.0)
    assert total_loss(ppo, kl, ent, opd, opd_coef=0.0).item() == pytest.approx(1.0 + 0.02 - 0.003)
