"""How samples are grouped for a forward pass (docs/design.md §1, Stage 2 step 5): mini-batch plans, length packing and
collation.

One epoch: the update's turn-samples are shuffled (seeded) into round(n / mini_batch) mini-batches of equal size
(±1); each mini-batch is dealt to the ranks by tokens (longest first to the rank with the fewest, as verl's
balance_batch) and, on each rank, packed into micro-batches by length (`pack_by_length`); every rank runs the same
number of micro-batches (padding with zero-weight ones, `padding_sample`: each FSDP forward/backward is a set of
collectives). Micro-batches are right-padded only to their longest sample (`pad_right`, `collate`).

The packer and the padding are plain functions of lengths and id lists, so the warm start
(`seedcli/stages/warmstart.py`) packs and pads its examples with them too (`pack_in_order`, `pad_right`).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from seedcli.rl.samples import BLANK_IMAGE, TurnSample

# The vision inputs of a micro-batch: the image sha256s of each row, in order → pixel_values and image_grid_thw.
VisionFn = Callable[[list[list[str]]], dict]


# --------------------------------------------------------------------------------------------- length packing


def pack_in_order(order: Iterable[int], lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices taken in `order` into consecutive batches with count × longest ≤ `max_tokens`: each index joins the
    current batch while that holds (the batch's longest includes it), else starts the next one. A sample longer than
    `max_tokens` gets a batch of its own."""
    batches: list[list[int]] = []
    width = 0
    for i in order:
        w = max(width, lengths[i])
        if batches and w * (len(batches[-1]) + 1) <= max_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
            w = lengths[i]
        width = w
    return batches


def pack_by_length(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group sample indices into micro-batches of similar length with count × longest ≤ `max_tokens`.

    Longest first, greedily; a sample longer than `max_tokens` gets a batch of its own. Every index appears once.
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    return pack_in_order(sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)), lengths, max_tokens)


def pack_by_prefix(keys: Sequence[Any], lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Like `pack_by_length`, but taken in the order of `keys`, under which rows that begin alike are adjacent (their
    token lists; or (task group, turn, episode), which every rank knows without the other ranks' tokens): one game's
    turn-samples land in one micro-batch, whose common prefix a scorer with `share_prefix` runs once. Ties by index;
    every index appears once."""
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    return pack_in_order(sorted(range(len(keys)), key=lambda i: (keys[i], i)), lengths, max_tokens)


def pad_right(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B, T], attention_mask [B, T]) with each row right-padded to the longest."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


# --------------------------------------------------------------------------------------------- mini-batch plans


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


@dataclass
class MicroBatchPlan:
    """What one rank runs for one mini-batch: its micro-batches (sample indices), how many every rank runs
    (padding included), and the mini-batch's token counts across all ranks (the loss denominators)."""

    micro: list[list[int]]
    n_micro: int
    tokens: int
    opd_tokens: int


def plan_micro_batches(
    samples: Sequence[TurnSample],
    shares: list[list[int]],
    rank: int,
    micro_tokens: int,
    opd: bool = True,
    by_prefix: bool = False,
) -> MicroBatchPlan:
    """Pack every rank's share of one mini-batch by length, or with `by_prefix` in token order (`pack_by_prefix`)
    (every rank knows every sample, so all ranks compute the same plan without a collective) and count the
    mini-batch's response and OPD tokens."""

    def pack(share: list[int]) -> list[list[int]]:
        lengths = [samples[i].length for i in share]
        if by_prefix:
            # one game's samples side by side, turn by turn (the other ranks' samples are not tokenised here)
            keys = [(samples[i].group_id, samples[i].turn_index, samples[i].episode_index) for i in share]
            return pack_by_prefix(keys, lengths, micro_tokens)
        return pack_by_length(lengths, micro_tokens)

    packs = [pack(share) if share else [] for share in shares]
    n_micro = max(1, max(len(p) for p in packs))
    everything = [i for share in shares for i in share]
    tokens = sum(samples[i].response_tokens for i in everything)
    opd_tokens = sum(samples[i].response_tokens for i in everything if opd and samples[i].has_skill)
    mine = [[shares[rank][k] for k in mb] for mb in packs[rank]]
    return MicroBatchPlan(mine, n_micro, tokens, opd_tokens)


# --------------------------------------------------------------------------------------------- collation


def collate(samples: Sequence[TurnSample], pad_id: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Right-padded [B, T] tensors of a micro-batch: ids, attention and response masks, the re-scored ℓ_old (absent
    when no sample has one: old_logp reuse), ℓ_ref, ℓ_skill and the advantage placed at the response positions, the OPD mask (response × valid skill), and ℓ_other
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
    if all(s.old_logp is None for s in samples):  # old_logp reuse: the loss takes ℓ_old from its own forward
        del out["old_logp"]
    elif any(s.old_logp is None for s in samples):
        raise ValueError("a micro-batch mixes re-scored samples with samples whose ℓ_old is to come from the update")
    return {k: v.to(device) for k, v in out.items()}


def padding_sample(pad_id: int, padding_ids: Sequence[int] | None = None) -> TurnSample:
    """A three-token sample for padding micro-batches: it runs forward and backward through every parameter (so the
    collectives match the other ranks') and is given weight 0. `padding_ids` (a vision-language policy): a prompt
    holding one blank image's tokens, so the vision tower runs too."""
    zero = torch.zeros(1)
    if padding_ids is not None:
        sample = TurnSample(-1, -1, "", list(padding_ids), [pad_id], None, 0.0, 0.0, zero, zero, None)
        sample.images = [BLANK_IMAGE]
        return sample
    return TurnSample(-1, -1, "", [pad_id, pad_id], [pad_id], None, 0.0, 0.0, zero, zero, None)
