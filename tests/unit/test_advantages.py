"""Turn scores, episode rewards and GRPO group advantages against hand-computed values."""

import math
from types import SimpleNamespace

import pytest
import torch

from seedcli.rl.samples import Reward, group_advantages

torch.set_num_threads(1)


def test_turn_scores():
    reward = Reward()  # ALFWorld's convention: 10 for a win, 0.1 off per invalid turn
    assert reward.turn(won=True, valid=True) == 10.0
    assert reward.turn(won=True, valid=False) == pytest.approx(9.9)
    assert reward.turn(won=False, valid=False) == pytest.approx(-0.1)
    assert reward.turn(won=False, valid=True) == 0.0
    assert Reward(win=1.0, invalid_penalty=0.5).turn(won=True, valid=False) == 0.5


def test_episode_reward_counts_every_invalid_turn():
    # the same rule as a turn's score: the episode's outcome minus the penalty per invalid turn
    assert Reward().episode(SimpleNamespace(won=True, invalid_turns=3)) == pytest.approx(9.7)
    assert Reward(win=1.0, invalid_penalty=0.01).episode(SimpleNamespace(won=False, invalid_turns=2)) == -0.02


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
