"""GiGPO's step credit (Feng et al. 2025, arXiv 2505.10978), as verl-agent computes it (`gigpo/core_gigpo.py`:
`compute_gigpo_outcome_advantage`, commit d0b9724), in seedcli's own code.

A turn-sample's advantage is `episode + step_weight·step`:
  episode  its score normalised over every turn-sample of its task group (verl-agent's `episode_norm_reward` with
           `compute_mean_std_cross_steps=True`: per turn-sample, not per trajectory); a group of one keeps its raw
           score (mean 0, std 1)
  step     the discounted return of its episode's step rewards from that step on (`compute_step_discounted_returns`),
           minus its own turn's invalid penalty (verl-agent subtracts the penalty after discounting:
           `apply_invalid_action_penalty`), normalised within its step group: the turn-samples of the same task group
           whose anchor observation is identical (`build_step_group`), or, with `similarity`, greedily clustered by
           difflib's ratio against each cluster's first member; a step group of one gets 0 (its own mean, std 1)
Both normalisations are "mean_std" (minus the mean, over the unbiased std + epsilon; verl-agent's mean_std_norm) or
"mean" (minus the mean; mean_norm).

verl-agent computes in float32; seedcli in float64 by default, where a group (episode or step) whose values are all
equal gets exactly 0, whatever its mean's rounding (in float32 a mean that is off by one ulp, divided by an std of one
ulp + 1e-6, gives every member the same ±0.2-0.5 under mean_std; in float64 it was ±1e-11). `dtype=torch.float32`
reproduces verl-agent's numbers bit for bit (tests/unit/test_gigpo.py).

Pure functions of plain lists: `rl/samples.py: build_turn_samples` hands in what a turn-sample holds (its `Reward`
scores, penalties and step rewards; the anchor is the observation the turn acted on).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Literal

import numpy as np
import torch

Norm = Literal["mean_std", "mean"]

STEP_GROUP_METRICS = "gigpo/state_group"  # the SEED code's prefix for GiGPO's step-group sizes (core_gigpo.py)


@dataclass(frozen=True)
class GiGPOSettings:
    """GiGPO's switches (verl-agent's algorithm.gamma and algorithm.gigpo.*)."""

    gamma: float = 0.95
    step_weight: float = 1.0  # step_advantage_w
    norm: Norm = "mean_std"  # mode: mean_std_norm | mean_norm
    similarity: bool = False  # enable_similarity
    similarity_threshold: float = 0.95  # similarity_thresh, in (0, 1)
    epsilon: float = 1e-6


@dataclass(frozen=True)
class GiGPOParts:
    """The two terms of each turn-sample's advantage and what they were made of."""

    advantages: list[float]  # episode + step_weight·step
    episode: list[float]  # the episode-relative advantage
    step: list[float]  # the step-relative advantage
    returns: list[float]  # the discounted step return, penalty included
    step_groups: list[int]  # each turn-sample's step group (numbered from 0 in order of first appearance)


def step_groups(
    groups: Sequence[Hashable], anchors: Sequence, *, similarity: bool = False, threshold: float = 0.95
) -> list[int]:
    """Each turn-sample's step group: same task group and the same anchor (verl-agent's `build_step_group`). With
    `similarity`, a turn-sample joins the first cluster of its task group whose first member's text it matches with
    `SequenceMatcher(None, anchor, first).ratio() >= threshold` (difflib's autojunk on, as there), else opens one."""
    if similarity and not 0.0 < threshold < 1.0:
        raise ValueError(f"the similarity threshold must be in (0, 1), got {threshold}")
    if len(groups) != len(anchors):
        raise ValueError(f"got {len(groups)} group ids but {len(anchors)} anchors")
    out = [-1] * len(groups)
    exact: dict[tuple, int] = {}
    clusters: dict[Hashable, list[tuple[str, int]]] = {}  # task group -> [(first member's anchor, step group)]
    n = 0
    for i, (g, anchor) in enumerate(zip(groups, anchors, strict=True)):
        if not similarity:
            key = (g, anchor)
            if key not in exact:
                exact[key], n = n, n + 1
            out[i] = exact[key]
            continue
        if not isinstance(anchor, str):
            raise ValueError("similarity grouping compares observation text; this anchor is not text")
        own = clusters.setdefault(g, [])
        match = next((sg for first, sg in own if SequenceMatcher(None, anchor, first).ratio() >= threshold), None)
        if match is None:
            own.append((anchor, n))
            match, n = n, n + 1
        out[i] = match
    return out


def discounted_returns(
    episodes: Sequence[Hashable], step_rewards: Sequence[float], gamma: float, *, dtype: torch.dtype = torch.float64
) -> list[float]:
    """G_t = r_t + γ·G_{t+1} over each episode's turn-samples in the order given (its steps in order), from the last
    back (verl-agent's `compute_step_discounted_returns`; float32 there, each operation rounded to float32)."""
    if len(episodes) != len(step_rewards):
        raise ValueError(f"got {len(episodes)} episode ids but {len(step_rewards)} step rewards")
    members: dict[Hashable, list[int]] = {}
    for i, e in enumerate(episodes):
        members.setdefault(e, []).append(i)
    out = [0.0] * len(episodes)
    f32 = dtype == torch.float32
    for idx in members.values():
        running = np.float32(0.0) if f32 else 0.0
        for i in reversed(idx):
            if f32:  # numpy's float32 scalar arithmetic, as verl-agent's float32 arrays
                running = np.float32(step_rewards[i]) + np.float32(gamma) * running
            else:
                running = float(step_rewards[i]) + gamma * running
            out[i] = float(running)
    return out


def normalise_in_groups(
    values: torch.Tensor,
    ids: Sequence[Hashable],
    norm: Norm,
    epsilon: float,
    *,
    single: Literal["raw", "zero"],
    exact_zero: bool = True,
) -> torch.Tensor:
    """(v − group mean) [/ (unbiased group std + epsilon)] per entry, the groups' members in the order given. A group of
    one: "raw" keeps its value (mean 0, std 1: `episode_norm_reward`), "zero" gets 0 (its own mean, std 1:
    `step_norm_reward`). Each group's mean and std are taken over its members as one tensor, as verl-agent does.
    `exact_zero`: a group of several equal values gets exactly 0 (its mean may be an ulp off, and an ulp over
    std 0 + epsilon is not 0); False keeps verl-agent's arithmetic as it is."""
    if norm not in ("mean_std", "mean"):
        raise ValueError(f"unknown norm {norm!r}: use mean_std or mean")
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(ids):
        members.setdefault(g, []).append(i)
    out = values.clone()
    for idx in members.values():
        group = values[idx]  # [n]
        if len(idx) == 1:
            mean = torch.zeros((), dtype=values.dtype) if single == "raw" else torch.mean(group)
            std = torch.ones((), dtype=values.dtype)
        else:
            mean, std = torch.mean(group), torch.std(group.unsqueeze(0))
        centred = group - mean
        if exact_zero and len(idx) > 1 and bool((group == group[0]).all()):
            centred = torch.zeros_like(centred)
        out[idx] = centred if norm == "mean" else centred / (std + epsilon)
    return out


def gigpo_parts(
    groups: Sequence[Hashable],
    episodes: Sequence[Hashable],
    anchors: Sequence,
    step_rewards: Sequence[float],
    episode_scores: Sequence[float],
    settings: GiGPOSettings = GiGPOSettings(),
    *,
    step_penalties: Sequence[float] | None = None,
    dtype: torch.dtype = torch.float64,
) -> GiGPOParts:
    """GiGPO's advantage of every turn-sample and its parts (see the module docstring). `step_penalties[i]` is
    subtracted from turn-sample i's discounted return (its own invalid penalty, not discounted, as verl-agent)."""
    n = len(groups)
    if not (len(episodes) == len(anchors) == len(step_rewards) == len(episode_scores) == n):
        raise ValueError("groups, episodes, anchors, step_rewards and episode_scores need one entry per turn-sample")
    penalties = list(step_penalties) if step_penalties is not None else [0.0] * n
    if len(penalties) != n:
        raise ValueError(f"got {len(penalties)} step penalties for {n} turn-samples")
    if n == 0:
        return GiGPOParts([], [], [], [], [])
    s = settings
    returns = torch.tensor(discounted_returns(episodes, step_rewards, s.gamma, dtype=dtype), dtype=dtype)
    returns = returns - torch.tensor(penalties, dtype=dtype)
    sg = step_groups(groups, anchors, similarity=s.similarity, threshold=s.similarity_threshold)
    scores = torch.tensor([float(x) for x in episode_scores], dtype=dtype)
    exact = dtype == torch.float64  # float32: verl-agent's numbers, rounding included (tests/unit/test_gigpo.py)
    episode = normalise_in_groups(scores, list(groups), s.norm, s.epsilon, single="raw", exact_zero=exact)
    step = normalise_in_groups(returns, sg, s.norm, s.epsilon, single="zero", exact_zero=exact)
    joint = episode + s.step_weight * step
    return GiGPOParts(joint.tolist(), episode.tolist(), step.tolist(), returns.tolist(), sg)


def gigpo_advantages(
    groups: Sequence[Hashable],
    episodes: Sequence[Hashable],
    anchors: Sequence,
    step_rewards: Sequence[float],
    episode_scores: Sequence[float],
    gamma: float = 0.95,
    step_weight: float = 1.0,
    norm: Norm = "mean_std",
    epsilon: float = 1e-6,
    *,
    similarity: bool = False,
    similarity_threshold: float = 0.95,
    step_penalties: Sequence[float] | None = None,
    dtype: torch.dtype = torch.float64,
) -> list[float]:
    """One GiGPO advantage per turn-sample, verl-agent's `compute_gigpo_outcome_advantage` on the same inputs: `groups`
    its task group, `episodes` its episode (an episode's turn-samples in step order), `anchors` the observation its
    turn acted on, `step_rewards` the reward its step received, `episode_scores` its episode's score (verl-agent: the
    episode's reward minus this turn's invalid penalty)."""
    settings = GiGPOSettings(gamma, step_weight, norm, similarity, similarity_threshold, epsilon)
    parts = gigpo_parts(
        groups, episodes, anchors, step_rewards, episode_scores, settings, step_penalties=step_penalties, dtype=dtype
    )
    return parts.advantages


def step_group_metrics(step_group_ids: Sequence[int], prefix: str = STEP_GROUP_METRICS) -> dict[str, float]:
    """Sizes of the step groups, over groups as verl-agent's "Avg size of step-level group" and the SEED code's
    `compute_group_size_distribution_metrics`: count, samples, mean, std (population), min, max, and the share of
    groups (`size_1_group_prop`) and of turn-samples (`size_1_sample_prop`) in groups of one."""
    sizes = np.bincount(np.asarray(step_group_ids, dtype=np.int64)) if len(step_group_ids) else np.zeros(0, np.int64)
    sizes = sizes[sizes > 0]
    if sizes.size == 0:
        names = ("num_groups", "num_samples", "mean", "std", "min", "max", "size_1_group_prop", "size_1_sample_prop")
        return {f"{prefix}/{k}": 0.0 for k in names}
    singles = float((sizes == 1).sum())
    return {
        f"{prefix}/num_groups": float(sizes.size),
        f"{prefix}/num_samples": float(sizes.sum()),
        f"{prefix}/mean": float(sizes.mean()),
        f"{prefix}/std": float(sizes.std()),
        f"{prefix}/min": float(sizes.min()),
        f"{prefix}/max": float(sizes.max()),
        f"{prefix}/size_1_group_prop": singles / sizes.size,
        f"{prefix}/size_1_sample_prop": singles / float(sizes.sum()),
    }
