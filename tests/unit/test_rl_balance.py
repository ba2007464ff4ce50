"""How an update's turn-samples are split: round(n / mini_batch) mini-batches of equal size (±1), each dealt to the
ranks by tokens (longest first to the least-loaded rank, as verl's balance_batch), so that the ranks' micro-batch
counts match and few padding forwards run. No model: the real planning functions on token counts."""

from __future__ import annotations

import math
import random

import pytest

from seedcli.config import build_config
from seedcli.rl.batching import (
    deal_by_tokens,
    minibatch_sizes,
    pack_by_length,
    plan_micro_batches,
    plan_minibatches,
    rank_indices,
)
from seedcli.rl.samples import TurnSample

# --------------------------------------------------------------------------------------------- mini-batch sizes


@pytest.mark.parametrize(
    ("n", "mini_batch", "sizes"),
    [
        (2600, 256, [260] * 10),  # not ten of 256 and a last one of 40 with a whole optimizer step
        (11, 4, [4, 4, 3]),  # 2.75 → 3
        (5, 2, [2, 2, 1]),  # 2.5 rounds half up
        (640, 256, [214, 213, 213]),  # 2.5 → 3
        (383, 256, [383]),  # 1.496 → 1: one mini-batch of 383
        (384, 256, [192, 192]),  # 1.5 → 2
        (100, 256, [100]),  # fewer samples than a mini-batch: one
        (1, 1, [1]),
        (0, 256, []),
    ],
)
def test_minibatch_sizes_by_hand(n, mini_batch, sizes):
    assert minibatch_sizes(n, mini_batch) == sizes


def test_minibatch_sizes_differ_by_at_most_one():
    for n in range(1, 300):
        for mini_batch in (1, 2, 7, 16, 64, 256):
            sizes = minibatch_sizes(n, mini_batch)
            assert sum(sizes) == n and max(sizes) - min(sizes) <= 1
            assert len(sizes) == max(1, math.floor(n / mini_batch + 0.5))


def test_the_plan_of_2600_samples_has_ten_minibatches_of_260():
    lengths = [random.Random(i).randint(100, 3000) for i in range(2600)]
    plan = plan_minibatches(2600, 256, 8, seed=3, lengths=lengths)
    assert [sum(len(share) for share in mb) for mb in plan] == [260] * 10
    assert sorted(i for mb in plan for share in mb for i in share) == list(range(2600))


# --------------------------------------------------------------------------------------------- dealing by tokens


def test_deal_by_tokens_by_hand():
    # longest first, each to the rank with the fewest tokens so far (ties: the lower rank):
    # 1 (50) → r0 = 50; 3 (40) → r1 = 40; 4 (30) → r1 = 70; 2 (20) → r0 = 70; 0 (10) → r0 = 80 (tie); 5 (5) → r1 = 75
    lengths = [10, 50, 20, 40, 30, 5]
    assert deal_by_tokens([0, 1, 2, 3, 4, 5], lengths, 2) == [[0, 1, 2], [3, 4, 5]]
    # each share keeps the (shuffled) order of its mini-batch
    assert deal_by_tokens([5, 4, 3, 2, 1, 0], lengths, 2) == [[2, 1, 0], [5, 4, 3]]
    assert deal_by_tokens([2, 0], lengths, 4) == [[2], [0], [], []]


def test_plans_are_deterministic_and_keep_the_seeded_shuffle():
    lengths = [random.Random(i).randint(1, 500) for i in range(50)]
    plan = plan_minibatches(50, 16, 4, seed=7, lengths=lengths)
    assert plan == plan_minibatches(50, 16, 4, seed=7, lengths=list(lengths))  # every rank computes the same
    assert plan != plan_minibatches(50, 16, 4, seed=8, lengths=lengths)
    # which samples share a mini-batch is the seeded shuffle's, whatever the dealing
    by_count = plan_minibatches(50, 16, 4, seed=7)
    assert [sorted(i for s in mb for i in s) for mb in plan] == [sorted(i for s in mb for i in s) for mb in by_count]
    # one process: its share is the shuffled mini-batch in order, as without lengths
    assert plan_minibatches(50, 16, 1, seed=7, lengths=lengths) == plan_minibatches(50, 16, 1, seed=7)


# --------------------------------------------------------------------------------------------- a paper-shaped batch

WORLD = 8
RESPONSE_MEAN, RESPONSE_CAP, SIGMA = 150, 512, 0.8  # a 3B agent's replies: lognormal, mean ~150 tokens, cap 512


def paper_batch(seed: int) -> list[TurnSample]:
    """2,560 turn-samples (128 episodes × 20 turns): prompts of 200 to 4,000 tokens (history grows and differs
    between tasks), responses lognormal with mean ~150 capped at 512; 70% of episodes with a skill (+120 tokens)."""
    g = random.Random(seed)
    mu = math.log(RESPONSE_MEAN) - SIGMA**2 / 2  # the lognormal's mean is exp(mu + σ²/2)
    out = []
    for i in range(2560):
        episode = i // 20
        response = min(RESPONSE_CAP, max(1, round(g.lognormvariate(mu, SIGMA))))
        prompt = g.randint(200, 4000)
        skill = episode % 10 < 7
        out.append(
            TurnSample(episode, i % 20, f"g{episode // 8}", None, [0] * response, None, 0.0, has_skill=skill,
                       prompt_len=prompt, skill_prompt_len=prompt + 120 if skill else -1)
        )  # fmt: skip
    return out


def update_pad_frac(samples, plan, micro_tokens: int) -> float:
    """Padding micro-batches / all micro-batches of one update over every rank, as train_update runs them."""
    pad = total = 0
    for shares in plan:
        own = [len(plan_micro_batches(samples, shares, r, micro_tokens).micro) for r in range(WORLD)]
        n_micro = plan_micro_batches(samples, shares, 0, micro_tokens).n_micro
        pad += n_micro * WORLD - sum(own)
        total += n_micro * WORLD
    return pad / total


def rescore_pad_frac(samples, plan, micro_tokens: int) -> float:
    """The same for re-scoring: each rank packs its whole share per pass (old, ref, teacher) as score_responses
    does, and runs as many forwards as the busiest rank."""
    pad = total = 0
    for teacher in (False, False, True):
        own = []
        for r in range(WORLD):
            share = [samples[i] for i in rank_indices(plan, r)]
            lengths = [s.skill_length for s in share if s.has_skill] if teacher else [s.length for s in share]
            own.append(len(pack_by_length(lengths, micro_tokens)))
        pad += max(own) * WORLD - sum(own)
        total += max(own) * WORLD
    return pad / total


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_paper_shaped_batch_pads_at_most_five_percent(seed):
    cfg = build_config("rl", "paper_qwen25_3b")
    assert (cfg.micro_batch_tokens, cfg.mini_batch, cfg.batch_tasks * cfg.group) == (16384, 256, 128)
    samples = paper_batch(seed)
    lengths = [s.length for s in samples]
    assert 130 < sum(s.response_tokens for s in samples) / len(samples) < 170
    by_tokens = plan_minibatches(len(samples), cfg.mini_batch, WORLD, seed, lengths)
    by_count = plan_minibatches(len(samples), cfg.mini_batch, WORLD, seed)
    assert update_pad_frac(samples, by_tokens, cfg.micro_batch_tokens) <= 0.05
    assert rescore_pad_frac(samples, by_tokens, cfg.micro_batch_tokens) <= 0.05
    # dealt by count, the same batch pads 7-12% of the update's micro-batches
    assert update_pad_frac(samples, by_count, cfg.micro_batch_tokens) > 0.05
    # the ranks' token loads differ by less than one longest sample per mini-batch
    for shares in by_tokens:
        loads = [sum(lengths[i] for i in share) for share in shares]
        assert max(loads) - min(loads) <= max(lengths[i] for share in shares for i in share)
