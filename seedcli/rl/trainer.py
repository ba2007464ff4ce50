"""One policy update on re-scored turn-samples, and the checkpoints that let a run stop and continue
(docs/design.md §1, Stage 2 step 5).

L = L_ppo + kl_coef·KL − entropy_coef·H + opd_coef·L_opd, each a token mean over the whole mini-batch across
ranks: a micro-batch contributes the sum of its per-token terms divided by the mini-batch's response-token count
(OPD: its OPD-token count), so the result does not depend on the world size or the micro-batch size (verl's
"token-mean"). One epoch: the update's turn-samples are shuffled (seeded) into round(n / mini_batch) mini-batches
of equal size (±1); each mini-batch is dealt to the ranks by tokens (longest first to the rank with the fewest, as
verl's balance_batch) and, on each rank, packed into micro-batches by length; every rank runs the same number of
micro-batches (padding with zero-weight ones: each FSDP forward/backward is a set of collectives); gradients
accumulate and one AdamW step follows, after clipping the grad norm.
"""

from __future__ import annotations

import heapq
import json
import os
import random
import shutil
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seedcli.errors import UserError
from seedcli.rl.distributed import (
    DistInfo,
    all_gather_object,
    all_reduce_,
    barrier,
    full_state_dict,
    gradient_sync,
    reshard,
)
from seedcli.rl.logprobs import pack_by_length, sequence_logprobs
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
from seedcli.rl.rescoring import TurnSample, pad_right
from seedcli.rl.sampler import hash_seed


class TrainingStopped(UserError):
    """The run cannot go on (e.g. the loss was non-finite several updates in a row)."""


class Scorer(torch.nn.Module):
    """A causal LM as `(input_ids, attention_mask, response_mask) → per-token log-probs [B, T]` (and entropies).

    DDP and FSDP hook into a module's forward, and `sequence_logprobs` calls the decoder and lm_head separately;
    routing it through this module's forward keeps gradient sync (DDP) and parameter gathering (FSDP) correct."""

    def __init__(self, lm: torch.nn.Module, chunk_tokens: int = 1024, compute_dtype: torch.dtype | None = None):
        super().__init__()
        self.lm = lm
        self.chunk_tokens = chunk_tokens
        # bf16: the matmuls under autocast over the fp32 master weights (seedcli/precision.py); the log-softmax,
        # entropy and everything the loss computes from the log-probs stay fp32 (rl/logprobs.py upcasts the logits)
        self.compute_dtype = compute_dtype

    def forward(self, input_ids, attention_mask, response_mask, with_entropy: bool = False, **vision):
        from seedcli.precision import autocast

        with autocast(self.compute_dtype, input_ids.device):
            return sequence_logprobs(
                self.lm,
                input_ids,
                attention_mask,
                response_mask,
                with_entropy=with_entropy,
                chunk_tokens=self.chunk_tokens,
                vision=vision or None,
            )


@dataclass
class LossWeights:
    """The coefficients of docs/design.md §1 step 5 (the paper's values by default)."""

    clip_eps: float = 0.2
    dual_clip: float = 3.0
    kl_coef: float = 0.01
    entropy_coef: float = 0.001
    opd_coef: float = 0.01
    opd_beta: float = 5.0


@dataclass
class UpdateResult:
    metrics: dict[str, float]
    skipped: bool = False
    cause: str | None = None
    optimizer_steps: int = 0
    tokens: int = 0


# --------------------------------------------------------------------------------------------- batching


def minibatch_sizes(n: int, mini_batch: int) -> list[int]:
    """round(n / mini_batch) sizes (at least one when n > 0) that differ by at most one, larger first: 2,600 samples
    at 256 give ten of 260, not ten of 256 and a 40-sample remainder that would get a whole optimizer step."""
    if n <= 0:
        return []
    k = max(1, (2 * n + mini_batch) // (2 * mini_batch))  # n / mini_batch rounded half up
    return [n // k + (j < n % k) for j in range(k)]


def deal_by_tokens(chunk: Sequence[int], lengths: Sequence[int], world: int) -> list[list[int]]:
    """Split the sample indices `chunk` over `world` ranks by tokens (as verl's balance_batch): longest first, each
    to the rank with the fewest tokens so far (ties: the lower rank). Each share keeps `chunk`'s order."""
    pos = {i: p for p, i in enumerate(chunk)}
    loads = [(0, r) for r in range(world)]  # a heap of (tokens so far, rank)
    shares: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(chunk, key=lambda i: (-lengths[i], pos[i])):
        load, r = heapq.heappop(loads)
        shares[r].append(i)
        heapq.heappush(loads, (load + lengths[i], r))
    return [sorted(share, key=pos.__getitem__) for share in shares]


def plan_minibatches(
    n: int, mini_batch: int, world: int, seed: int, lengths: Sequence[int] | None = None
) -> list[list[list[int]]]:
    """Shuffle sample indices 0..n-1 (seeded) into `minibatch_sizes(n, mini_batch)` mini-batches, each split over
    the ranks: by tokens when `lengths` (every sample's token count) is given (`deal_by_tokens`), else round-robin.
    plan[j][r] = the indices rank r trains on in mini-batch j. Every index appears exactly once; the same inputs give
    the same plan on every rank."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    plan = []
    start = 0
    for size in minibatch_sizes(n, mini_batch):
        chunk = order[start : start + size]
        start += size
        if lengths is not None:
            plan.append(deal_by_tokens(chunk, lengths, world))
        else:
            plan.append([chunk[r::world] for r in range(world)])
    return plan


def rank_indices(plan: list[list[list[int]]], rank: int) -> list[int]:
    """All sample indices this rank trains on (so it re-scores only those)."""
    return sorted(i for mb in plan for i in mb[rank])


def collate(samples: Sequence[TurnSample], pad_id: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Right-padded [B, T] tensors of a micro-batch: ids, attention and response masks, the re-scored ℓ_old, ℓ_ref,
    ℓ_skill and the advantage placed at the response positions, the OPD mask (response × valid skill), and ℓ_other
    with its mask when a sample has one (opd_contrast: scored under another episode's skill)."""
    ids, attn = pad_right([s.prompt_ids + s.response_ids for s in samples], pad_id)
    shape = ids.shape
    resp, old, ref, skill, adv, opd, other, other_mask = (torch.zeros(shape, dtype=torch.float32) for _ in range(8))
    for b, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        sl = slice(p, p + r)
        resp[b, sl] = 1.0
        adv[b, sl] = s.advantage
        if s.old_logp is not None:
            old[b, sl] = s.old_logp
        if s.ref_logp is not None:
            ref[b, sl] = s.ref_logp
        if s.skill_logp is not None:
            skill[b, sl] = s.skill_logp
            opd[b, sl] = 1.0
            if s.contrast_logp is not None:
                other[b, sl] = s.contrast_logp
                other_mask[b, sl] = 1.0
    out = {
        "input_ids": ids,
        "attention_mask": attn,
        "response_mask": resp,
        "old_logp": old,
        "ref_logp": ref,
        "skill_logp": skill,
        "advantages": adv,
        "opd_mask": opd,
    }
    if any(s.contrast_logp is not None for s in samples):  # opd_contrast; absent, the gate reads the plain Δ
        out.update(contrast_logp=other, contrast_mask=other_mask)
    return {k: v.to(device) for k, v in out.items()}


def _dummy_sample(pad_id: int, padding_ids: Sequence[int] | None = None) -> TurnSample:
    """A three-token sample for padding micro-batches: it runs forward and backward through every parameter (so the
    collectives match the other ranks') and is given weight 0. `padding_ids` (a vision-language policy): a prompt
    holding one blank image's tokens, so the vision tower runs too."""
    zero = torch.zeros(1)
    if padding_ids is not None:
        from seedcli.rl.rescoring import BLANK_IMAGE

        sample = TurnSample(-1, -1, "", list(padding_ids), [pad_id], None, 0.0, 0.0, zero, zero, None)
        sample.images = [BLANK_IMAGE]
        return sample
    return TurnSample(-1, -1, "", [pad_id, pad_id], [pad_id], None, 0.0, 0.0, zero, zero, None)


@dataclass
class MicroBatchPlan:
    """What one rank runs for one mini-batch: its micro-batches (sample indices), how many every rank runs
    (padding included), and the mini-batch's token counts across all ranks (the loss denominators)."""

    micro: list[list[int]]
    n_micro: int
    tokens: int
    opd_tokens: int


def plan_micro_batches(
    samples: Sequence[TurnSample], shares: list[list[int]], rank: int, micro_tokens: int, opd: bool = True
) -> MicroBatchPlan:
    """Pack every rank's share of one mini-batch by length (every rank knows every sample's length, so all ranks
    compute the same plan without a collective) and count the mini-batch's response and OPD tokens."""
    packs = [pack_by_length([samples[i].length for i in share], micro_tokens) if share else [] for share in shares]
    n_micro = max(1, max(len(p) for p in packs))
    everything = [i for share in shares for i in share]
    tokens = sum(samples[i].response_tokens for i in everything)
    opd_tokens = sum(samples[i].response_tokens for i in everything if opd and samples[i].has_skill)
    mine = [[shares[rank][k] for k in mb] for mb in packs[rank]]
    return MicroBatchPlan(mine, n_micro, tokens, opd_tokens)


# --------------------------------------------------------------------------------------------- the loss


_STAT_KEYS = (
    "tokens",
    "pg",
    "kl",
    "entropy",
    "clip_frac",
    "clip_frac_lower",
    "ppo_kl",
    "opd_tokens",
    "opd",
    "gate",
    "delta",
    "neg_adv_push",
    "contrast_tokens",
    "padding",
    "forwards",
)


def micro_batch_loss(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    w: LossWeights,
    use_ref: bool,
    denoms: tuple[float, float] | None = None,
    token_stats: list[torch.Tensor] | None = None,
):
    """(loss, per-component losses, token-weighted sums for the metrics) of one micro-batch.

    `denoms` = (response tokens, OPD tokens) of the whole mini-batch across ranks: each term is then this
    micro-batch's share of the mini-batch token mean. Without it, each term is the micro-batch's own token mean.
    `token_stats` (a list) receives a [2, N] CPU tensor: the entropy and OPD weight g·opd_mask of each response token."""
    vision = {k: batch[k] for k in ("pixel_values", "image_grid_thw") if k in batch}
    logp, entropy = model(
        batch["input_ids"], batch["attention_mask"], batch["response_mask"], with_entropy=True, **vision
    )
    mask = batch["response_mask"]
    n_all, n_opd_all = denoms if denoms is not None else (None, None)
    pg = ppo_clip_loss(logp, batch["old_logp"], batch["advantages"], mask, w.clip_eps, w.dual_clip, denom=n_all)
    kl = token_mean(low_var_kl(logp, batch["ref_logp"]), mask, n_all) if use_ref else logp.new_zeros(())
    ent = token_mean(entropy, mask, n_all)
    opd_mask = batch["opd_mask"]
    n_opd = opd_mask.sum()
    contrast = batch.get("contrast_logp"), batch.get("contrast_mask")
    if n_opd > 0:
        opd, gate = opd_loss(logp, batch["skill_logp"], opd_mask, w.opd_beta, n_opd_all, *contrast)
    else:
        opd, gate = logp.new_zeros(()), torch.zeros_like(logp)
    loss = total_loss(pg, kl, ent, opd, kl_coef=w.kl_coef, entropy_coef=w.entropy_coef, opd_coef=w.opd_coef)

    with torch.no_grad():
        n = mask.sum()
        clip = ppo_clip_stats(logp, batch["old_logp"], batch["advantages"], mask, w.clip_eps, w.dual_clip)
        delta = (batch["skill_logp"] - logp.detach()) * opd_mask
        gap = opd_gap(logp, batch["skill_logp"], *contrast)  # what the gate read: Δ, or Δ_c under opd_contrast
        _, neg_push = opd_harm_sums(gate, gap, batch["advantages"], opd_mask)
        if token_stats is not None:
            on = mask != 0
            token_stats.append(torch.stack([entropy.detach()[on], (gate * opd_mask)[on]]).float().cpu())
        # token-weighted sums of this micro-batch (the metrics are token means over the whole update)
        per = float(n_all) if n_all is not None else n  # what pg, kl and ent were divided by
        per_opd = float(n_opd_all) if n_opd_all is not None else n_opd
        sums = torch.stack(
            [
                n,
                pg.detach() * per,
                kl.detach() * per,
                ent.detach() * per,
                clip["actor/clip_frac"] * n,
                clip["actor/clip_frac_lower"] * n,
                clip["actor/ppo_kl"] * n,
                n_opd,
                opd.detach() * per_opd if n_opd > 0 else opd.detach(),
                (gate * opd_mask).sum(),
                torch.where(opd_mask > 0, delta, torch.zeros_like(delta)).sum(),
                neg_push,
                (contrast[1] * opd_mask).sum() if contrast[1] is not None else torch.zeros((), device=n.device),
                torch.zeros((), device=n.device),  # padding: counted by train_update
                torch.zeros((), device=n.device),  # forwards: counted by train_update
            ]
        ).double()
    parts = {"actor/pg_loss": pg, "actor/kl": kl, "actor/entropy": ent, "opd/loss": opd}
    return loss, parts, sums


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
    vision: Callable[[list[list[str]]], dict] | None = None,
    padding_ids: Sequence[int] | None = None,
) -> UpdateResult:
    """One epoch over `plan` (see `plan_minibatches`): one optimizer step per mini-batch. This rank's samples must be
    re-scored. A non-finite loss or grad norm on any rank skips that step on every rank and ends the update early
    (the rest of its mini-batches come from the same data and would fail the same way)."""
    reshard(model)
    sums = torch.zeros(len(_STAT_KEYS), dtype=torch.float64)
    token_stats: list[torch.Tensor] = []  # [2, N] per micro-batch: entropy and OPD weight of each response token
    grad_norms: list[float] = []
    steps = 0
    skipped, cause = False, None
    model.train()
    optimizer.zero_grad(set_to_none=True)
    # FSDP: reduce-scatter every micro-batch (no-sync would hold the whole unsharded fp32 gradient until the last);
    # DDP: all-reduce once per mini-batch (its gradients are full-size either way)
    sync_every = info.fsdp
    opd_on = weights.opd_coef > 0
    for j, shares in enumerate(plan):
        mbp = plan_micro_batches(samples, shares, info.rank, micro_tokens, opd=opd_on)
        # DDP and FSDP average gradients over ranks, so each rank's loss carries a factor `world`
        denoms = (float(mbp.tokens), float(mbp.opd_tokens))
        micro: list[tuple[list[TurnSample], float]] = [
            ([samples[i] for i in mb], float(info.world)) for mb in mbp.micro
        ]
        sums[_STAT_KEYS.index("padding")] += mbp.n_micro - len(micro)
        sums[_STAT_KEYS.index("forwards")] += mbp.n_micro
        micro += [([_dummy_sample(pad_id, padding_ids if vision is not None else None)], 0.0)] * (
            mbp.n_micro - len(micro)
        )
        local_bad: list[str] = []
        for k, (mb, scale) in enumerate(micro):
            batch = collate(mb, pad_id, info.device)
            if vision is not None and any(s.images for s in mb):
                batch.update({k: v.to(info.device) for k, v in vision([s.images for s in mb]).items()})
            with gradient_sync(model, enabled=sync_every or k == len(micro) - 1):
                mb_tokens = [] if scale > 0 else None  # padding micro-batches count for nothing
                loss, parts, mb_sums = micro_batch_loss(model, batch, weights, use_ref, denoms, mb_tokens)
                (loss * scale).backward()
            if scale > 0:
                sums += mb_sums.cpu()
                token_stats += mb_tokens
                # each sample's entropies at θ (response tokens are contiguous per row): samples.jsonl shows them
                for s, ent in zip(mb, mb_tokens[0][0].split([len(s.response_ids) for s in mb]), strict=True):
                    s.entropy = ent.clone()
                if not torch.isfinite(loss):
                    bad = [name for name, v in parts.items() if not torch.isfinite(v)] or ["total loss"]
                    local_bad.append(f"non-finite {', '.join(bad)} on rank {info.rank} (mini-batch {j + 1})")
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

    sums = all_reduce_(sums.to(info.device), info)
    s = dict(zip(_STAT_KEYS, sums.cpu().tolist(), strict=False))
    n, n_opd = max(s["tokens"], 1.0), max(s["opd_tokens"], 1.0)
    metrics = {
        "actor/pg_loss": s["pg"] / n,
        "actor/kl": s["kl"] / n,
        "actor/entropy": s["entropy"] / n,
        "actor/clip_frac": s["clip_frac"] / n,
        "actor/clip_frac_lower": s["clip_frac_lower"] / n,
        "actor/ppo_kl": s["ppo_kl"] / n,
        "actor/grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
        "actor/optimizer_steps": float(steps),
        "actor/skipped": float(skipped),
        "opd/loss": s["opd"] / n_opd,
        "opd/gate_mean": s["gate"] / n_opd if s["opd_tokens"] else 0.0,
        "opd/delta_mean": s["delta"] / n_opd,
        "opd/token_frac": s["opd_tokens"] / n,
        # harm measures (issue 19 §3): shares of the OPD weight Σ g over OPD tokens, at θ
        "opd/neg_adv_push_frac": s["neg_adv_push"] / s["gate"] if s["gate"] > 0 else 0.0,
        **_high_entropy_push(token_stats, info),
        "opd/contrast_token_frac": s["contrast_tokens"] / n_opd if s["opd_tokens"] else 0.0,
        "dist/padding_micro_batches": s["padding"],  # zero-weight micro-batches run so every rank ran as many
        "actor/pad_forward_frac": s["padding"] / s["forwards"] if s["forwards"] else 0.0,
    }
    return UpdateResult(metrics, skipped, cause, steps, int(s["tokens"]))


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

    def observe(self, step: int, skipped: bool, cause: str | None) -> None:
        if not skipped:
            self.streak = 0
            return
        self.streak += 1
        warnings.warn(f"update {step} skipped: {cause}", RuntimeWarning, stacklevel=2)
        if self.streak >= self.limit:
            raise TrainingStopped(
                f"stopped at update {step}: the loss was non-finite in {self.streak} updates in a row "
                f"({step - self.streak + 1}..{step}); last cause: {cause}. Lower --lr, check the model's dtype, "
                "or inspect the last samples with `seed inspect`"
            )


# --------------------------------------------------------------------------------------------- checkpoints

CHECKPOINTS = "checkpoints"


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def rng_state() -> dict[str, Any]:
    import numpy as np

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: Path,
    step: int,
    *,
    lm: torch.nn.Module,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    train_module: torch.nn.Module,
    info: DistInfo,
    state: dict[str, Any],
    keep: int = 0,
    model_dtype: torch.dtype = torch.float32,
    processor: Any = None,
) -> Path:
    """`root/step_NNNNNN/` with model/ (HF format + tokenizer, in `model_dtype`: bf16 on GPU, what eval and vLLM
    load), the optimizer, the fp32 master weights when the model is saved in a lower precision (so a resume
    continues exactly), every rank's RNG state and state.json; written into a temporary directory and renamed, then
    `root/latest` moves to it. Every rank calls it. `keep` > 0 deletes all but the newest `keep` checkpoints."""
    reshard(train_module)  # state dicts must see the sharded parameters the optimizer holds
    root = Path(root)
    final = root / step_dir_name(step)
    tmp = root / f".tmp_{step_dir_name(step)}"
    if info.is_main:
        if tmp.exists():
            shutil.rmtree(tmp)
        (tmp / "model").mkdir(parents=True)
    barrier(info)

    lossy = model_dtype != torch.float32
    if info.fsdp:
        sd = full_state_dict(lm, keep=info.is_main, dtype=model_dtype)  # collective: every rank gathers, rank 0 keeps
        if info.is_main:
            _save_hf_state_dict(lm, sd, tmp / "model", model_dtype)
        del sd
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        blob = {"optimizer": get_optimizer_state_dict(train_module, optimizer)}
        if lossy:  # the sharded fp32 master weights, for an exact resume
            blob["model"] = get_model_state_dict(train_module)
        dcp.save(blob, checkpoint_id=str(tmp / "optimizer"))
    elif info.is_main:
        if lossy:
            lm.save_pretrained(
                tmp / "model",
                safe_serialization=True,
                state_dict={k: v.to(model_dtype) for k, v in lm.state_dict().items()},
            )
            _set_config_dtype(tmp / "model", model_dtype)
            torch.save({k: v.detach().cpu() for k, v in lm.state_dict().items()}, tmp / "master.pt")
        else:
            lm.save_pretrained(tmp / "model", safe_serialization=True)
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    rngs = all_gather_object(rng_state(), info)
    if info.is_main:
        tokenizer.save_pretrained(tmp / "model")
        if processor is not None:  # a vision-language policy's image processor travels with its weights
            processor.save_pretrained(tmp / "model")
        torch.save(rngs, tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2, default=float))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _point(root / "latest", final.name)
        if keep > 0:
            for old in sorted(root.glob("step_*"))[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    barrier(info)
    return final


def _save_hf_state_dict(
    lm: torch.nn.Module, sd: dict[str, torch.Tensor], out: Path, dtype: torch.dtype = torch.float32
) -> None:
    """A gathered state dict in Hugging Face format (safetensors + config), for the FSDP path."""
    from safetensors.torch import save_file

    cfg = lm.config
    if getattr(cfg, "tie_word_embeddings", False):
        sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}
    save_file({k: v.contiguous() for k, v in sd.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(out)
    _set_config_dtype(out, dtype)
    if getattr(lm, "generation_config", None) is not None:
        lm.generation_config.save_pretrained(out)


def _set_config_dtype(model_dir: Path, dtype: torch.dtype) -> None:
    """Record the saved weights' dtype in config.json (vLLM and transformers load in it)."""
    path = Path(model_dir) / "config.json"
    cfg = json.loads(path.read_text())
    name = str(dtype).removeprefix("torch.")
    cfg["dtype"] = name
    cfg.pop("torch_dtype", None)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _point(link: Path, target: str) -> None:
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint (state.json written) under `root`, or None."""
    root = Path(root)
    link = root / "latest"
    if link.is_symlink() and (link.resolve() / "state.json").exists():
        candidates = [link.resolve()]
    else:
        candidates = []
    candidates += [d for d in root.glob("step_*") if (d / "state.json").exists()]
    if not candidates:
        return None
    return max(candidates, key=lambda d: int(d.name.split("_")[-1]))


def read_checkpoint_state(ckpt: Path) -> dict[str, Any]:
    return json.loads((Path(ckpt) / "state.json").read_text())


def load_optimizer_and_rng(
    ckpt: Path, optimizer: torch.optim.Optimizer, train_module: torch.nn.Module, info: DistInfo
) -> None:
    """Restore the optimizer state and this rank's RNG state from a checkpoint (weights are loaded with the model)."""
    ckpt = Path(ckpt)
    reshard(train_module)
    if info.fsdp:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        sd = {"optimizer": get_optimizer_state_dict(train_module, optimizer)}
        metadata = dcp.FileSystemReader(str(ckpt / "optimizer")).read_metadata()
        has_master = any(key.startswith("model.") for key in metadata.state_dict_metadata)
        if has_master:  # the model/ weights are bf16: restore the fp32 master weights they were cast from
            sd["model"] = get_model_state_dict(train_module)
        dcp.load(sd, checkpoint_id=str(ckpt / "optimizer"))
        if has_master:
            set_model_state_dict(train_module, sd["model"])
        set_optimizer_state_dict(train_module, optimizer, sd["optimizer"])
    else:
        if (ckpt / "master.pt").exists():
            master = torch.load(ckpt / "master.pt", map_location=info.device, weights_only=True)
            getattr(train_module, "module", train_module).lm.load_state_dict(master)
        optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", map_location=info.device, weights_only=False))
    rngs = torch.load(ckpt / "rng.pt", weights_only=False)
    set_rng_state(rngs[info.rank] if info.rank < len(rngs) else rngs[0])


def update_seed(seed: int, step: int, *parts: object) -> int:
    """A per-update seed (rollouts, mini-batch order) that depends only on the run seed and the step, so a resumed
    run draws what an uninterrupted one would have drawn."""
    return hash_seed("rl", seed, step, *parts)


__all__ = [
    "LossWeights",
    "NonFiniteGuard",
    "Scorer",
    "TrainingStopped",
    "UpdateResult",
    "collate",
    "deal_by_tokens",
    "latest_checkpoint",
    "load_optimizer_and_rng",
    "micro_batch_loss",
    "minibatch_sizes",
    "plan_micro_batches",
    "plan_minibatches",
    "rank_indices",
    "read_checkpoint_state",
    "save_checkpoint",
    "train_update",
    "update_seed",
]
