"""Turn scores and GRPO group advantages against hand-computed values."""

import math

import pytest
import torch

from seedcli.rl.advantages import group_advantages, turn_scores

torch.set_num_threads(1)


def test_turn_scores():
    assert turn_scores(won=True, valid=True) == 10.0
    assert turn_scores(won=True, valid=False) == pytest.approx(9.9)
    assert turn_scores(won=False, valid=False) == pytest.approx(-0.1)
    assert turn_scores(won=False, valid=True) == 0.0
    assert turn_scores(won=True, valid=False, win_reward=1.0, invalid_penalty=0.5) == 0.5


def test_group_advantages_by_hand():
    scores = torch.tensor([1.0, 2.0, 3.0, 10.0, 0.0, 5.0])
    adv = group_advantages(scores, ["a", "a", "a", "b", "b", "c"], eps=1e-6)
    # a: mean 2, unbiased std sqrt((1 + 0 + 1) / 2) = 1; b: mean 5, std sqrt((25 + 25) / 1); c: singleton → 0
    sb = math.sqrt(50.0)
    expected = [-1 / (1 + 1e-6), 0.0, 1 / (1 + 1e-6), 5 / (sb + 1e-6), -5 / (sb + 1e-6), 0.0]
    assert adv.tolist() == pytest.approx(expected, rel=1e-6, abs=1e-7)
    assert adv.dtype == torch.float32


def test_groups_may_interleave_and_use_int_tensor_ids():
    scores = torch.tensor([10.0, 0.0, 9.9, -0.1])
    adv = group_advantages(scores, torch.tensor([7, 3, 7, 3]))
    # groups 7 = (10, 9.9) and 3 = (0, −0.1): two samples 0.1 apart, so ±0.05 / (0.1/√2 + eps)
    a = 0.05 / (0.1 / math.sqrt(2.0) + 1e-6)
    assert adv.tolist() == pytest.approx([a, a, -a, -a], rel=1e-5)


def test_group_of_equal_scores_and_singleton_get_zero():
    adv = group_advantages(torch.tensor([10.0, 10.0, 10.0, 4.0]), [0, 0, 0, 1])
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_group_advantages_match_torch_std_on_random_groups():
    torch.manual_seed(0)
    scores = torch.randn(40)
    ids = torch.randint(0, 5, (40,))
    adv = group_advantages(scores, ids)
    for g in ids.unique():
        sel = ids == g
        s = scores[sel]
        torch.testing.assert_close(adv[sel], (s - s.mean()) / (s.std() + 1e-6))


def test_group_advantages_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="group ids"):
        group_advantages(torch.zeros(3), [0, 0])
