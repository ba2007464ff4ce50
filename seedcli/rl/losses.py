"""SEED's per-token losses: PPO with dual clip, low-variance KL, on-policy distillation (OPD).

Pure tensor math (docs/design.md §1, stage 2 step 5). Every per-token tensor is [B, T] and every mask is a
{0, 1} float tensor of the same shape; each loss is a token mean over the mask of its micro-batch, or, given
`denom`, a sum over the mask divided by `denom` — the token count of the whole mini-batch across ranks, so that
micro-batches of different sizes weigh each token the same and results do not depend on world or micro-batch size.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "OPD_FORMS",
    "low_var_kl",
    "masked_mean",
    "masked_sum",
    "high_entropy_push_frac",
    "opd_gate_stats",
    "opd_gap",
    "opd_harm_sums",
    "opd_loss",
    "ppo_clip_loss",
    "ppo_clip_stats",
    "token_mean",
    "top_entropy_threshold",
    "total_loss",
]


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `x` over the tokens where `mask` is 1; 0 when the mask is empty.

    Masked-out positions never reach the sum, so a NaN or inf there (e.g. padding) does no harm.
    """
    total = torch.where(mask != 0, x * mask, torch.zeros_like(x)).sum()
    count = mask.sum()
    return total / torch.where(count > 0, count, torch.ones_like(count))


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of `x` over the tokens where `mask` is 1 (NaN/inf at masked-out positions never reach it)."""
    return torch.where(mask != 0, x * mask, torch.zeros_like(x)).sum()


def token_mean(x: torch.Tensor, mask: torch.Tensor, denom: float | None) -> torch.Tensor:
    """Token mean over `mask`, or the masked sum over a given token count (the mini-batch's, across ranks)."""
    if denom is None:
        return masked_mean(x, mask)
    return masked_sum(x, mask) / max(float(denom), 1.0)


def low_var_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(θ‖ref), `exp(ref − logp) − (ref − logp) − 1`, as verl's "low_var_kl".

    The log-ratio is clamped to [−20, 20] before `exp` and the result to [−10, 10], so one token whose
    probability collapsed under θ cannot dominate the batch.
    """
    log_ratio = torch.clamp(ref_logp - logp, min=-20.0, max=20.0)  # [B, T]
    kl = torch.exp(log_ratio) - log_ratio - 1.0  # [B, T]
    return torch.clamp(kl, min=-10.0, max=10.0)


def _ppo_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float,
    dual_clip: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token pieces shared by the loss and its statistics, following verl's `compute_policy_loss`."""
    if dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (got {dual_clip}); the paper uses 3.0")
    log_ratio = torch.clamp(logp - old_logp, min=-20.0, max=20.0)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    pg1 = -advantages * ratio
    pg2 = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    clip1 = torch.maximum(pg1, pg2)  # the ordinary pessimistic PPO bound
    pg3 = -advantages * dual_clip
    clip2 = torch.minimum(pg3, clip1)  # dual clip: for A < 0, a huge ratio costs at most c·|A|
    per_token = torch.where(advantages < 0, clip2, clip1)  # [B, T]
    return per_token, log_ratio, pg1, pg2, clip1


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    dual_clip: float = 3.0,
    denom: float | None = None,
) -> torch.Tensor:
    """Dual-clip PPO policy loss, token mean over `mask` (verl's `compute_policy_loss`, "token-mean").

    ratio = exp(logp − old_logp); per token max(−A·r, −A·clip(r, 1±ε)), further capped at −A·c where A < 0.
    """
    per_token, *_ = _ppo_terms(logp, old_logp, advantages, clip_eps, dual_clip)
    return token_mean(per_token, mask, denom)


@torch.no_grad()
def ppo_clip_stats(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    dual_clip: float = 3.0,
) -> dict[str, torch.Tensor]:
    """Diagnostics for `ppo_clip_loss` on the same inputs, as detached 0-d tensors keyed by metric name.

    `actor/clip_frac`: share of masked tokens where the ε-clip is active (pg2 > pg1);
    `actor/clip_frac_lower`: share where the dual clip caps a negative-advantage token;
    `actor/ppo_kl`: mean of old_logp − logp, a cheap estimate of KL(old‖θ).
    """
    _, log_ratio, pg1, pg2, clip1 = _ppo_terms(logp, old_logp, advantages, clip_eps, dual_clip)
    pg3 = -advantages * dual_clip
    lower = (clip1 > pg3) & (advantages < 0)
    return {
        "actor/clip_frac": masked_mean((pg2 > pg1).float(), mask),
        "actor/clip_frac_lower": masked_mean(lower.float(), mask),
        "actor/ppo_kl": masked_mean(-log_ratio, mask),
    }


OPD_FORMS = ("gated_nll", "signed", "reward_direction")


def opd_loss(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 5.0,
    denom: float | None = None,
    contrast_logp: torch.Tensor | None = None,
    contrast_mask: torch.Tensor | None = None,
    *,
    form: str = "gated_nll",
    clip: float = 1.0,
    advantages: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The on-policy distillation loss and each token's weight on −∇ℓ_θ; returns (loss, weight [B, T], detached).

    Δ = ℓ_skill − sg(ℓ_θ) (or, where `contrast_mask` is 1, Δ_c = ℓ_skill − ℓ_other: see below). Every form's gradient
    is −w·∇ℓ_θ / n with a detached per-token weight w; only w differs (docs/parity.md derives each):

    gated_nll (SEED's): w = g = sg(σ(β·Δ)) ∈ (0, 1), L = mean over `mask` of g·(ℓ_skill − ℓ_θ): a gate-weighted NLL
      that raises every sampled token, more where the skill context endorses it. β = 0 gives g = 0.5 (OPSD).
    signed: w = sg(clip(Δ, −c, c)), L = mean of −w·ℓ_θ: tokens the skilled teacher likes less than the student are
      pushed down (the sign of on-policy distillation's per-token reverse KL, GKD / Thinking Machines).
    reward_direction (RLSD / SERL's split): w = sign(A)·sg(clip(sign(A)·Δ, 0, c)), L = mean of −w·ℓ_θ with A the
      token's advantage (`advantages`): the outcome gives the direction, the teacher gap only how much more a token
      gets of it (a won episode's tokens the skill endorses go up more, a lost one's it disowns go down more; tokens
      with A = 0 or a gap against the outcome get none).

    `opd_contrast: shuffled` (added; not in the SEED code): given ℓ_other (`contrast_logp`, the same tokens under
    another episode's skill) where `contrast_mask` is 1, every form reads Δ_c = Δ − (ℓ_other − sg ℓ_θ) = ℓ_skill −
    ℓ_other in place of Δ; gated_nll's factor g·(ℓ_skill − ℓ_θ), hence ∇L = −σ(β·Δ_c)·∇ℓ_θ / n, is unchanged.
    """
    teacher_logp = teacher_logp.detach()  # the skill-context score is a fixed target
    delta = opd_gap(student_logp.detach(), teacher_logp, contrast_logp, contrast_mask)  # [B, T]
    if form == "gated_nll":
        gate = torch.sigmoid(beta * delta)  # [B, T], no grad: all inputs are detached
        return token_mean(gate * (teacher_logp - student_logp), mask, denom), gate
    if form == "signed":
        weight = torch.clamp(delta, -clip, clip)  # [B, T]
    elif form == "reward_direction":
        if advantages is None:
            raise ValueError("opd_form reward_direction needs the tokens' advantages")
        sign = torch.sign(advantages.detach())  # [B, T]
        weight = sign * torch.clamp(sign * delta, 0.0, clip)
    else:
        raise ValueError(f"unknown opd_form {form!r}: use one of {', '.join(OPD_FORMS)}")
    return token_mean(-weight * student_logp, mask, denom), weight


def opd_gap(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    contrast_logp: torch.Tensor | None = None,
    contrast_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The gap the OPD gate reads, detached: Δ = ℓ_skill − ℓ_θ, or where `contrast_mask` is 1 the contrasted
    Δ_c = Δ − (ℓ_other − ℓ_θ) = ℓ_skill − ℓ_other."""
    delta = teacher_logp.detach() - student_logp.detach()  # [B, T]
    if contrast_logp is None:
        return delta
    other = contrast_logp.detach() - student_logp.detach()  # [B, T]
    m = contrast_mask if contrast_mask is not None else torch.ones_like(delta)
    return delta - torch.where(m != 0, other, torch.zeros_like(other))


@torch.no_grad()
def opd_harm_sums(
    gate: torch.Tensor, gap: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(OPD weight Σ |w|·mask, the part of it on tokens with advantage < 0 and gap > 0): their ratio is
    `opd/neg_adv_push_frac`, the share of OPD weight where the skill endorses what the outcome punished (`gate` is
    `opd_loss`'s weight w: SEED's gate g > 0, or a signed form's w)."""
    weight = torch.where(mask != 0, gate.abs() * mask, torch.zeros_like(gate))  # [B, T]
    harm = (advantages < 0) & (gap > 0)
    return weight.sum(), torch.where(harm, weight, torch.zeros_like(weight)).sum()


def top_entropy_threshold(entropy: torch.Tensor, top: float = 0.2) -> float | None:
    """The k-th largest of the n entropies given, k = ceil(top·n): tokens at or above it are the top share (None
    when there is none)."""
    entropy = entropy.reshape(-1)
    if entropy.numel() == 0:
        return None
    k = max(1, math.ceil(top * entropy.numel() - 1e-9))
    return float(torch.topk(entropy.double(), k).values.min())


@torch.no_grad()
def high_entropy_push_frac(entropy: torch.Tensor, weight: torch.Tensor, top: float = 0.2) -> float:
    """`opd/high_entropy_push_frac`: the share of OPD weight (`weight`, one per response token, 0 off OPD tokens) on
    the tokens whose entropy is among the k = ceil(top·n) largest of all n response tokens given (ties with the k-th
    largest count as in); 0.0 when there is no OPD weight."""
    entropy, weight = entropy.reshape(-1).double(), weight.reshape(-1).double()  # [N]
    total = float(weight.sum())
    if entropy.numel() == 0 or total <= 0:
        return 0.0
    return float(weight[entropy >= top_entropy_threshold(entropy, top)].sum()) / total


@torch.no_grad()
def opd_gate_stats(
    student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor, beta: float = 5.0
) -> dict[str, torch.Tensor]:
    """The SEED code's OPD diagnostics over the tokens where `mask` is 1, as 0-d tensors keyed by metric name:
    `opd/gate_mean` (mean g), `opd/gate_active_frac` (share with g > 0.5, i.e. Δ > 0 when β > 0; none at β = 0) and
    `opd/teacher_gap_mean` (mean Δ), with Δ = ℓ_skill − ℓ_student and g = σ(β·Δ) as in `opd_loss`."""
    gap = teacher_logp - student_logp  # [B, T]
    gate = torch.sigmoid(beta * gap)  # [B, T]
    return {
        "opd/gate_mean": masked_mean(gate, mask),
        "opd/gate_active_frac": masked_mean((gate > 0.5).float(), mask),
        "opd/teacher_gap_mean": masked_mean(gap, mask),
    }


def total_loss(
    ppo: torch.Tensor,
    kl: torch.Tensor,
    entropy: torch.Tensor,
    opd: torch.Tensor,
    *,
    kl_coef: float = 0.01,
    entropy_coef: float = 0.001,
    opd_coef: float = 0.01,
) -> torch.Tensor:
    """SEED's objective from its token-mean parts: L = L_ppo + kl_coef·KL − entropy_coef·H + opd_coef·L_opd.

    The defaults are the paper's; opd_coef = 0 is the GRPO baseline.
    """
    return ppo + kl_coef * kl - entropy_coef * entropy + opd_coef * opd
