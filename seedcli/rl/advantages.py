"""Outcome scores and GRPO group-normalised advantages for turn-samples (docs/design.md §1, stage 2 step 4)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

__all__ = ["group_advantages", "turn_scores"]


def turn_scores(won: bool, valid: bool, *, win_reward: float = 10.0, invalid_penalty: float = 0.1) -> float:
    """Score of a turn-sample: `win_reward` if its episode was won, minus `invalid_penalty` if the turn was invalid."""
    return win_reward * float(won) - invalid_penalty * float(not valid)


@torch.no_grad()
def group_advantages(
    scores: torch.Tensor,
    group_ids: torch.Tensor | Sequence[Hashable],
    eps: float = 1e-6,
    normalize_std: bool = True,
) -> torch.Tensor:
    """(score − group mean) / (group std + eps) per sample, with the unbiased std as in verl's GRPO;
    `normalize_std=False` gives score − group mean (the SEED code's WebShop setting).

    `scores` is [N]; `group_ids` [N] (an int tensor or any hashables) names each sample's group.
    A group of one sample has no baseline to compare against and gets advantage 0.
    """
    scores = torch.as_tensor(scores)
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [N], got shape {tuple(scores.shape)}")
    ids = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    if len(ids) != scores.shape[0]:
        raise ValueError(f"got {scores.shape[0]} scores but {len(ids)} group ids")
    if not ids:
        return torch.zeros_like(scores, dtype=torch.get_default_dtype())

    index_of: dict[Hashable, int] = {}
    group = torch.tensor([index_of.setdefault(g, len(index_of)) for g in ids], device=scores.device)  # [N]
    n_groups = len(index_of)
    # float64 so a group of large equal scores normalises to exactly 0, not to rounding noise / eps
    s = scores.to(torch.float64)  # [N]
    count = torch.zeros(n_groups, dtype=torch.float64, device=s.device).index_add_(0, group, torch.ones_like(s))
    mean = torch.zeros_like(count).index_add_(0, group, s) / count  # [G]
    centred = s - mean[group]  # [N]
    sq = torch.zeros_like(count).index_add_(0, group, centred * centred)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))  # [G], unbiased like torch.std
    adv = centred / (std[group] + eps) if normalize_std else centred
    adv = torch.where(count[group] > 1, adv, torch.zeros_like(adv))
    out_dtype = scores.dtype if scores.is_floating_point() else torch.get_default_dtype()
    return adv.to(out_dtype)
