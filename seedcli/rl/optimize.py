"""One policy update on re-scored turn-samples (docs/design.md §1, Stage 2 step 5): the loss of a micro-batch and the
optimiser loop over the update's mini-batches.

L = L_ppo + kl_coef·KL − entropy_coef·H + opd_coef·L_opd, each a token mean over the whole mini-batch across
ranks: a micro-batch contributes the sum of its per-token terms divided by the mini-batch's response-token count
(OPD: its OPD-token count), so the result does not depend on the world size or the micro-batch size (verl's
"token-mean"). One epoch over the mini-batch plan (`rl/batching.py`): every rank runs the same number of
micro-batches (padding with zero-weight ones: each FSDP forward/backward is a set of collectives); gradients
accumulate and one AdamW step follows, after clipping the grad norm.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from seedcli.errors import NonFiniteValue, UserError
from seedcli.rl.batching import VisionFn, collate, padding_sample, plan_micro_batches
from seedcli.rl.distributed import DistInfo, all_gather_object, all_reduce_, gradient_sync, reshard
from seedcli.rl.logprobs import shares_prefix
from seedcli.rl.losses import (
    high_entropy_push_frac,
    low_var_kl,
    opd_gap,
    opd_harm_sums,
    opd_loss,
    ppo_clip_loss,
    ppo_clip_stats,
    token_mean,
    top_entropy_threshold,
    total_loss,
)
from seedcli.rl.samples import TurnSample


class TrainingStopped(UserError):
    """The run cannot go on (e.g. the loss was non-finite several updates in a row)."""


@dataclass
class LossWeights:
    """The coefficients of docs/design.md §1 step 5 (the paper's values by default)."""

    clip_eps: float = 0.2
    dual_clip: float = 3.0
    kl_coef: float = 0.01
    entropy_coef: float = 0.001
    opd_coef: float = 0.01
    opd_beta: float = 5.0
    opd_form: str = "gated_nll"  # gated_nll (SEED's) | signed | reward_direction (rl/losses.py: opd_loss)
    opd_clip: float = 1.0  # c of the signed forms: |w| ≤ c


@dataclass
class UpdateResult:
    metrics: dict[str, float]
    skipped: bool = False
    cause: str | None = None
    optimizer_steps: int = 0
    tokens: int = 0


@dataclass
class LossStats:
    """Token-weighted sums for the metrics (the metrics are token means over the whole update): one micro-batch's,
    as 0-d tensors on its device (`micro_batch_loss`), or the update's so far, as floats (`cpu`, `add`)."""

    tokens: Any = 0.0  # response tokens
    pg: Any = 0.0  # the PPO loss × what it was divided by
    kl: Any = 0.0
    kl_max: Any = 0.0  # Σ over responses of the response's largest per-token KL (with a reference)
    kl_rows: Any = 0.0  # responses in kl_max
    entropy: Any = 0.0
    clip_frac: Any = 0.0  # × tokens
    clip_frac_lower: Any = 0.0
    ppo_kl: Any = 0.0
    opd_tokens: Any = 0.0  # response tokens with a skill
    opd: Any = 0.0  # the OPD loss × what it was divided by
    gate: Any = 0.0  # Σ w over OPD tokens (SEED's gate g; a signed form's signed weight)
    weight_abs: Any = 0.0  # Σ |w| over OPD tokens
    push_down: Any = 0.0  # Σ |w| over OPD tokens with w < 0 (the signed forms push them down)
    delta: Any = 0.0  # Σ (ℓ_skill − ℓ_θ) over OPD tokens
    delta_absmax: Any = 0.0  # Σ over responses with OPD tokens of the response's largest |ℓ_skill − ℓ_θ|
    delta_rows: Any = 0.0  # responses in delta_absmax
    neg_adv_push: Any = 0.0  # Σ g over OPD tokens with advantage < 0 and gate gap > 0
    contrast_tokens: Any = 0.0  # OPD tokens with another episode's skill (opd_contrast)
    grad_sq_opd: Any = 0.0  # ‖∂(opd_coef·L_opd)/∂ℓ_θ‖² (`_grad_sq_on_logp`)
    grad_sq_rest: Any = 0.0  # ‖∂(L_pg + kl_coef·L_kl)/∂ℓ_θ‖²
    padding: Any = 0.0  # zero-weight micro-batches (counted by train_update)
    forwards: Any = 0.0  # micro-batches run, padding included (counted by train_update)

    def cpu(self) -> LossStats:
        """The stats as floats, in one transfer (one GPU sync per micro-batch, not one per number)."""
        names = [f.name for f in dataclasses.fields(self) if isinstance(getattr(self, f.name), torch.Tensor)]
        values = torch.stack([getattr(self, name) for name in names]).double().cpu().tolist()
        return dataclasses.replace(self, **dict(zip(names, values, strict=True)))

    def add(self, other: LossStats) -> None:
        """Add `other`'s sums (floats) to these, in place."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def all_reduced(self, info: DistInfo) -> LossStats:
        """The sums over every rank (one all-reduce of a float64 tensor)."""
        names = [f.name for f in dataclasses.fields(self)]
        packed = torch.tensor([getattr(self, name) for name in names], dtype=torch.float64)
        total = all_reduce_(packed.to(info.device), info).cpu().tolist()
        return LossStats(**dict(zip(names, total, strict=True)))


# --------------------------------------------------------------------------------------------- the loss


def micro_batch_loss(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    w: LossWeights,
    use_ref: bool,
    denoms: tuple[float, float] | None = None,
    token_stats: list[torch.Tensor] | None = None,
    reused: list[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], LossStats]:
    """(loss, per-component losses, token-weighted sums for the metrics) of one micro-batch.

    Without `batch["old_logp"]` (old_logp reuse: the update is one optimizer step, so π_old = θ here) ℓ_old is this
    forward's log-probs, detached, and `reused` (a list) receives them [B, T] (TRL's GRPOTrainer, num_iterations 1).

    `denoms` = (response tokens, OPD tokens) of the whole mini-batch across ranks: each term is then this
    micro-batch's share of the mini-batch token mean. Without it, each term is the micro-batch's own token mean.
    `token_stats` (a list) receives a [2, N] CPU tensor: the entropy and OPD weight g·opd_mask of each response token."""
    vision = {k: batch[k] for k in ("pixel_values", "image_grid_thw") if k in batch}
    logp, entropy = model(
        batch["input_ids"], batch["attention_mask"], batch["response_mask"], with_entropy=True, **vision
    )
    mask = batch["response_mask"]
    n_all, n_opd_all = denoms if denoms is not None else (None, None)
    old_logp = batch.get("old_logp")
    if old_logp is None:
        old_logp = logp.detach()
        if reused is not None:
            reused.append(old_logp)
    ent = token_mean(entropy, mask, n_all)
    opd_mask = batch["opd_mask"]
    n_opd = opd_mask.sum()
    contrast = batch.get("contrast_logp"), batch.get("contrast_mask")

    def terms(lp: torch.Tensor):
        """(pg, kl, opd, gate) of the log-probs `lp` [B, T]: the loss's terms that reach the weights through ℓ_θ."""
        pg = ppo_clip_loss(lp, old_logp, batch["advantages"], mask, w.clip_eps, w.dual_clip, denom=n_all)
        kl = token_mean(low_var_kl(lp, batch["ref_logp"]), mask, n_all) if use_ref else lp.new_zeros(())
        if n_opd > 0:
            opd, gate = opd_loss(
                lp, batch["skill_logp"], opd_mask, w.opd_beta, n_opd_all, *contrast,
                form=w.opd_form, clip=w.opd_clip, advantages=batch["advantages"],
            )  # fmt: skip
        else:
            opd, gate = lp.new_zeros(()), torch.zeros_like(lp)
        return pg, kl, opd, gate

    pg, kl, opd, gate = terms(logp)
    loss = total_loss(pg, kl, ent, opd, kl_coef=w.kl_coef, entropy_coef=w.entropy_coef, opd_coef=w.opd_coef)

    def opd_and_rest(lp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pg_, kl_, opd_, _ = terms(lp)
        return w.opd_coef * opd_, pg_ + w.kl_coef * kl_

    grad_sq_opd, grad_sq_rest = _grad_sq_on_logp(logp, opd_and_rest)

    with torch.no_grad():
        n = mask.sum()
        clip = ppo_clip_stats(logp, old_logp, batch["advantages"], mask, w.clip_eps, w.dual_clip)
        delta = (batch["skill_logp"] - logp.detach()) * opd_mask
        gap = opd_gap(logp, batch["skill_logp"], *contrast)  # what the gate read: Δ, or Δ_c under opd_contrast
        _, neg_push = opd_harm_sums(gate, gap, batch["advantages"], opd_mask)
        zero = logp.new_zeros(())
        kl_max, kl_rows = _row_max_sums(low_var_kl(logp.detach(), batch["ref_logp"]), mask) if use_ref else (zero, zero)
        gap_max, gap_rows = _row_max_sums(delta.abs(), opd_mask)
        if token_stats is not None:
            on = mask != 0
            token_stats.append(torch.stack([entropy.detach()[on], (gate.abs() * opd_mask)[on]]).float().cpu())
        # token-weighted sums of this micro-batch (the metrics are token means over the whole update)
        per = float(n_all) if n_all is not None else n  # what pg, kl and ent were divided by
        per_opd = float(n_opd_all) if n_opd_all is not None else n_opd
        stats = LossStats(
            tokens=n,
            pg=pg.detach() * per,
            kl=kl.detach() * per,
            kl_max=kl_max,
            kl_rows=kl_rows,
            entropy=ent.detach() * per,
            clip_frac=clip["actor/clip_frac"] * n,
            clip_frac_lower=clip["actor/clip_frac_lower"] * n,
            ppo_kl=clip["actor/ppo_kl"] * n,
            opd_tokens=n_opd,
            opd=opd.detach() * per_opd if n_opd > 0 else opd.detach(),
            gate=(gate * opd_mask).sum(),
            weight_abs=(gate.abs() * opd_mask).sum(),
            push_down=(gate.clamp(max=0).abs() * opd_mask).sum(),
            delta=torch.where(opd_mask > 0, delta, torch.zeros_like(delta)).sum(),
            delta_absmax=gap_max,
            delta_rows=gap_rows,
            neg_adv_push=neg_push,
            contrast_tokens=(
                (contrast[1] * opd_mask).sum() if contrast[1] is not None else torch.zeros((), device=n.device)
            ),
            grad_sq_opd=grad_sq_opd,
            grad_sq_rest=grad_sq_rest,
        )
    parts = {"actor/pg_loss": pg, "actor/kl": kl, "actor/entropy": ent, "opd/loss": opd}
    return loss, parts, stats


def _grad_sq_on_logp(
    logp: torch.Tensor, opd_and_rest: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(‖∂ opd_term / ∂ℓ_θ‖², ‖∂ rest / ∂ℓ_θ‖²), with (opd_term, rest) = `opd_and_rest(ℓ_θ)`: each term's gradient on
    the response tokens' log-probs, the tensor every term of the loss reaches the weights through (entropy aside), so
    their norms compare what each term asks of the model's token probabilities; summed over micro-batches they are
    the mini-batch's. The OPD term's share of the gradient norm (`opd/grad_share`) is ‖g_opd‖ / (‖g_opd‖ + ‖g_rest‖).
    The terms are recomputed on a detached copy of ℓ_θ: autograd.grad on the model's own ℓ_θ would fire the hooks
    FSDP2 registers on its forward's output (an unshard, a prefetch and a reshard per call: a collective that ranks
    with and without OPD tokens run a different number of times). Zeros where ℓ_θ has no graph."""
    zero = logp.new_zeros((), dtype=torch.float32)
    if not logp.requires_grad:
        return zero, zero
    with torch.enable_grad():
        leaf = logp.detach().requires_grad_(True)
        out = []
        for term in opd_and_rest(leaf):
            if not term.requires_grad:
                out.append(zero)
                continue
            (g,) = torch.autograd.grad(term, leaf, retain_graph=True, allow_unused=True)
            out.append(zero if g is None else g.detach().float().pow(2).sum())
    return out[0], out[1]


def _row_max_sums(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ over rows with a token in `mask` of the row's largest value there, rows counted) of a micro-batch.

    A token mean over a reply of ~60 JSON tokens around a one-character action dilutes the one token that decides the
    move ~60-fold (docs/method-check-calibration.md, "A stronger KL holds `=`"); the mean of each reply's largest term
    shows it. `actor/kl_max` takes the per-token KL(θ‖ref) (k3), `opd/delta_absmax` the teacher gap |ℓ_skill − ℓ_θ|."""
    per_token = values.masked_fill(mask == 0, float("-inf"))
    rows = mask.sum(dim=1) > 0
    return per_token.amax(dim=1)[rows].sum(), rows.sum().to(values.dtype)


# --------------------------------------------------------------------------------------------- the optimiser loop


def train_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[TurnSample],
    plan: list[list[list[int]]],
    info: DistInfo,
    *,
    weights: LossWeights,
    micro_tokens: int,
    grad_clip: float,
    pad_id: int,
    use_ref: bool = True,
    vision: VisionFn | None = None,
    padding_ids: Sequence[int] | None = None,
    step: int | None = None,
) -> UpdateResult:
    """One epoch over `plan` (see `rl.batching.plan_minibatches`): one optimizer step per mini-batch. This rank's
    samples must be re-scored. A non-finite loss or grad norm on any rank skips that step on every rank and ends the
    update early (the rest of its mini-batches come from the same data and would fail the same way). A weight that
    is non-finite after an optimizer step (on any rank) stops the run: `NonFiniteValue`, naming update `step`."""
    reshard(model)
    by_prefix = shares_prefix(model)  # one game's samples in one micro-batch: the scorer runs their prefix once
    stats = LossStats()
    token_stats: list[torch.Tensor] = []  # [2, N] per micro-batch: entropy and OPD weight of each response token
    grad_norms: list[float] = []
    steps = 0
    skipped, cause = False, None
    model.train()
    optimizer.zero_grad(set_to_none=True)
    for j, shares in enumerate(plan):
        mbp = plan_micro_batches(
            samples, shares, info.rank, micro_tokens, opd=weights.opd_coef > 0, by_prefix=by_prefix
        )
        # DDP and FSDP average gradients over ranks, so each rank's loss carries a factor `world`
        micro: list[tuple[list[TurnSample], float]] = [
            ([samples[i] for i in mb], float(info.world)) for mb in mbp.micro
        ]
        stats.padding += mbp.n_micro - len(micro)
        stats.forwards += mbp.n_micro
        micro += [([padding_sample(pad_id, padding_ids if vision is not None else None)], 0.0)] * (
            mbp.n_micro - len(micro)
        )
        denoms = (float(mbp.tokens), float(mbp.opd_tokens))
        local_bad = _backward(model, micro, j, info, weights, use_ref, denoms, pad_id, vision, stats, token_stats)
        # the parameters as registered now: FSDP2 swaps sharded/unsharded tensors in and out of the modules
        params = [p for p in model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        flag = torch.tensor([float(bool(local_bad))], device=info.device)
        all_reduce_(flag, info, op="max")
        if flag.item() > 0 or not torch.isfinite(grad_norm):
            causes = [c for rank_causes in all_gather_object(local_bad, info) for c in rank_causes]
            cause = "; ".join(causes) or f"non-finite grad norm ({float(grad_norm)}) in mini-batch {j + 1}"
            optimizer.zero_grad(set_to_none=True)
            skipped = True
            break
        grad_norms.append(float(grad_norm))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps += 1
        if not weights_finite(params, info):
            lr = optimizer.param_groups[0]["lr"]
            raise NonFiniteValue(
                f"update {step if step is not None else '?'}: the weights are non-finite (nan or inf) after the "
                f"optimizer step of mini-batch {j + 1} (grad norm {float(grad_norm):.4g}, lr {lr:.3g}); the run "
                "stops and exports nothing: start it again with a lower lr (or check the model's dtype)"
            )

    stats = stats.all_reduced(info)
    metrics = _actor_metrics(stats, grad_norms, steps, skipped, token_stats, info)
    metrics["actor/lr"] = float(optimizer.param_groups[0]["lr"])
    return UpdateResult(metrics, skipped, cause, steps, int(stats.tokens))


def weights_finite(params: Sequence[torch.Tensor], info: DistInfo) -> bool:
    """Whether every rank's weights (their local shards under FSDP) are all finite: one flag all-reduced."""
    with torch.no_grad():
        local = [p.to_local() if hasattr(p, "to_local") else p for p in params]
        ok = torch.stack([torch.isfinite(p).all() for p in local]).all() if local else torch.tensor(True)
    bad = torch.tensor([0.0 if bool(ok) else 1.0], device=info.device)
    all_reduce_(bad, info, op="max")
    return bad.item() == 0


def _backward(
    model: torch.nn.Module,
    micro: list[tuple[list[TurnSample], float]],
    j: int,
    info: DistInfo,
    weights: LossWeights,
    use_ref: bool,
    denoms: tuple[float, float],
    pad_id: int,
    vision: VisionFn | None,
    stats: LossStats,
    token_stats: list[torch.Tensor],
) -> list[str]:
    """Forward and backward over the micro-batches of mini-batch `j` (each (samples, loss scale); scale 0: padding),
    gradients accumulating; their sums go into `stats` and `token_stats`. Returns this rank's non-finite causes."""
    # FSDP: reduce-scatter every micro-batch (no-sync would hold the whole unsharded fp32 gradient until the last);
    # DDP: all-reduce once per mini-batch (its gradients are full-size either way)
    sync_every = info.fsdp
    local_bad: list[str] = []
    for k, (mb, scale) in enumerate(micro):
        batch = collate(mb, pad_id, info.device)
        if vision is not None and any(s.images for s in mb):
            batch.update({k: v.to(info.device) for k, v in vision([s.images for s in mb]).items()})
        with gradient_sync(model, enabled=sync_every or k == len(micro) - 1):
            mb_tokens = [] if scale > 0 else None  # padding micro-batches count for nothing
            reused: list[torch.Tensor] = []
            loss, parts, mb_stats = micro_batch_loss(model, batch, weights, use_ref, denoms, mb_tokens, reused)
            (loss * scale).backward()
        if scale > 0:
            stats.add(mb_stats.cpu())
            token_stats += mb_tokens
            if reused:  # old_logp reuse: each sample's ℓ_old is its row of this forward (metrics, samples.jsonl)
                for b, s in enumerate(mb):
                    p = len(s.prompt_ids)
                    s.old_logp = reused[0][b, p : p + len(s.response_ids)].float().cpu().clone()
            # each sample's entropies at θ (response tokens are contiguous per row): samples.jsonl shows them
            for s, ent in zip(mb, mb_tokens[0][0].split([len(s.response_ids) for s in mb]), strict=True):
                s.entropy = ent.clone()
            if not torch.isfinite(loss):
                bad = [name for name, v in parts.items() if not torch.isfinite(v)] or ["total loss"]
                local_bad.append(f"non-finite {', '.join(bad)} on rank {info.rank} (mini-batch {j + 1})")
    return local_bad


def _actor_metrics(
    s: LossStats, grad_norms: list[float], steps: int, skipped: bool, token_stats: list[torch.Tensor], info: DistInfo
) -> dict[str, float]:
    """The update's actor/ and opd/ metrics from every rank's sums."""
    n, n_opd = max(s.tokens, 1.0), max(s.opd_tokens, 1.0)
    return {
        "actor/pg_loss": s.pg / n,
        "actor/kl": s.kl / n,
        "actor/kl_max": s.kl_max / s.kl_rows if s.kl_rows else 0.0,
        "actor/entropy": s.entropy / n,
        "actor/clip_frac": s.clip_frac / n,
        "actor/clip_frac_lower": s.clip_frac_lower / n,
        "actor/ppo_kl": s.ppo_kl / n,
        "actor/grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
        "actor/optimizer_steps": float(steps),
        "actor/skipped": float(skipped),
        "opd/loss": s.opd / n_opd,
        "opd/gate_mean": s.gate / n_opd if s.opd_tokens else 0.0,
        "opd/push_down_frac": s.push_down / s.weight_abs if s.weight_abs > 0 else 0.0,
        "opd/delta_mean": s.delta / n_opd,
        "opd/delta_absmax": s.delta_absmax / s.delta_rows if s.delta_rows else 0.0,
        "opd/token_frac": s.opd_tokens / n,
        "opd/grad_share": _share(s.grad_sq_opd, s.grad_sq_rest),
        # harm measures (issue 19 §3): shares of the OPD weight Σ g over OPD tokens, at θ
        "opd/neg_adv_push_frac": s.neg_adv_push / s.gate if s.gate > 0 else 0.0,
        **_high_entropy_push(token_stats, info),
        "opd/contrast_token_frac": s.contrast_tokens / n_opd if s.opd_tokens else 0.0,
        "dist/padding_micro_batches": s.padding,  # zero-weight micro-batches run so every rank ran as many
        "actor/pad_forward_frac": s.padding / s.forwards if s.forwards else 0.0,
    }


def _share(sq_opd: float, sq_rest: float) -> float:
    """‖g_opd‖ / (‖g_opd‖ + ‖g_rest‖) from the squared norms; 0 when both are 0."""
    a, b = math.sqrt(max(sq_opd, 0.0)), math.sqrt(max(sq_rest, 0.0))
    return a / (a + b) if a + b > 0 else 0.0


def _high_entropy_push(token_stats: list[torch.Tensor], info: DistInfo) -> dict[str, float]:
    """`opd/high_entropy_push_frac` over every rank's response tokens of the update (the top 20% is the update's),
    and the entropy at which that top 20% starts (`actor/entropy_top20_threshold`, when there are tokens)."""
    local = torch.cat(token_stats, dim=1) if token_stats else torch.zeros(2, 0)  # [2, N]
    both = torch.cat(all_gather_object(local, info), dim=1)
    out = {"opd/high_entropy_push_frac": high_entropy_push_frac(both[0], both[1])}
    threshold = top_entropy_threshold(both[0])
    if threshold is not None:
        out["actor/entropy_top20_threshold"] = threshold
    return out


class NonFiniteGuard:
    """Counts updates skipped for a non-finite loss; `limit` in a row stop the run with the step and the cause."""

    def __init__(self, limit: int = 3, streak: int = 0):
        self.limit = limit
        self.streak = streak
        self.cause: str | None = None

    def observe(self, step: int, skipped: bool, cause: str | None) -> None:
        """After each update (the stage prints the skipped update's line): `limit` skipped in a row stop the run."""
        if not skipped:
            self.streak = 0
            return
        self.streak += 1
        self.cause = cause
        if self.streak >= self.limit:
            raise TrainingStopped(
                f"stopped at update {step}: the loss was non-finite in {self.streak} updates in a row "
                f"({step - self.streak + 1}..{step}); last cause: {cause}. Lower --lr, check the model's dtype, "
                "or inspect the last samples with `seed inspect`"
            )

    def at_end(self, step: int) -> None:
        """After the last update: a run whose last update(s) were skipped ends failed, not complete (its weights are
        those that made the loss non-finite), with nothing exported."""
        if self.streak:
            first = step - self.streak + 1
            updates = f"update {step}" if self.streak == 1 else f"updates {first}..{step}"
            raise TrainingStopped(
                f"stopped at update {step}: the run ended with {updates} skipped for a non-finite loss (last cause: "
                f"{self.cause}), so its model is the one that made the loss non-finite and is not "
                "exported. Lower --lr, check the model's dtype, or inspect the last samples with `seed inspect`"
            )
