"""Turn scores, episode rewards and GRPO group advantages against hand-computed values."""

import math
from types import SimpleNamespace

import numpy as np
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


def _verl_agent(scores, groups, trajs, cross_steps, std=True):
    from tests.reference.verl_agent_grpo import compute_grpo_outcome_advantage

    rewards = torch.zeros(len(scores), 3)
    rewards[:, -1] = torch.tensor(scores)  # the outcome on the last response token, as verl puts it
    adv, _ = compute_grpo_outcome_advantage(
        rewards,
        torch.ones(len(scores), 3),
        np.array(groups, dtype=object),
        np.array(trajs, dtype=object),
        norm_adv_by_std_in_grpo=std,
        compute_mean_std_cross_steps=cross_steps,
    )
    return adv[:, 0]


@pytest.mark.parametrize("std", [True, False])
def test_group_advantages_equal_verl_agent_per_turn_and_per_episode(std):
    # two groups of three episodes with 1-4 turns each; a turn's score is the episode's outcome minus its own
    # invalid penalty, so the turns of one episode differ (which one stands for the episode matters)
    rng = np.random.default_rng(0)
    scores, groups, trajs = [], [], []
    for g in ("u0", "u1"):
        for t in range(3):
            won = rng.random() < 0.5
            for _ in range(int(rng.integers(1, 5))):
                scores.append(10.0 * won - 0.1 * (rng.random() < 0.3))
                groups.append(g)
                trajs.append(f"{g}-t{t}")
    order = rng.permutation(len(scores))  # verl-agent's batch need not hold an episode's turns together
    scores = [scores[i] for i in order]
    groups = [groups[i] for i in order]
    trajs = [trajs[i] for i in order]
    s64 = torch.tensor(scores, dtype=torch.float64)
    turn = group_advantages(s64, groups, normalize_std=std)
    episode = group_advantages(s64, groups, normalize_std=std, traj_ids=trajs)
    torch.testing.assert_close(turn, _verl_agent(scores, groups, trajs, True, std).double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(episode, _verl_agent(scores, groups, trajs, False, std).double(), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(turn, episode)


def test_turn_level_pushes_down_the_closing_action_when_losses_are_shorter():
    # one group: a win in 4 turns ("5 + 7 ="), three losses that close after one card in 2 turns ("5 =");
    # every episode ends with "=", so the closing action's net advantage is the sum over episodes of the last turn's
    lengths, won = [4, 2, 2, 2], [True, False, False, False]
    scores = [10.0 * w for n, w in zip(lengths, won, strict=True) for _ in range(n)]
    trajs = [e for e, n in enumerate(lengths) for _ in range(n)]
    last = [i for i in range(len(trajs)) if i + 1 == len(trajs) or trajs[i + 1] != trajs[i]]
    groups = [0] * len(scores)
    turn = group_advantages(torch.tensor(scores), groups)
    episode = group_advantages(torch.tensor(scores), groups, traj_ids=trajs)
    # per turn: mean 4 over 10 turns, so the win's "=" gets +6/σ and each loss's −4/σ: net −6/σ
    sigma = torch.tensor(scores).std().item()
    assert sum(turn[i].item() for i in last) == pytest.approx(-6 / (sigma + 1e-6), rel=1e-6)
    # per episode: mean 2.5 over the 4 episodes, so +7.5/σ' and 3 × −2.5/σ': net 0
    assert sum(episode[i].item() for i in last) == pytest.approx(0.0, abs=1e-6)
    assert turn.sum().item() == pytest.approx(0.0, abs=1e-5)  # per turn, the advantages sum to 0 over turns instead


def test_group_advantages_rejects_mismatched_traj_ids():
    with pytest.raises(ValueError, match="trajectory ids"):
        group_advantages(torch.zeros(3), [0, 0, 0], traj_ids=[0, 1])


def test_a_group_of_equal_inexact_scores_gets_exactly_zero():
    # issue 55 §3: twelve turn-samples all scoring −0.1 (lost episodes, every turn invalid): their float64 mean is an
    # ulp off −0.1, and that ulp over std 0 + 1e-6 gave 1.39e-11 to every sample, so `zero_adv: drop` kept them all
    scores = torch.full((12,), -0.1, dtype=torch.float64)  # as build_turn_samples hands them in
    for level in (None, [i // 3 for i in range(12)]):  # per turn-sample, and per episode (4 episodes of 3 turns)
        for std in (True, False):
            adv = group_advantages(scores, [0] * 12, normalize_std=std, traj_ids=level)
            assert adv.tolist() == [0.0] * 12
    # one equal group beside a mixed one: only the equal group is zeroed
    adv = group_advantages(torch.tensor([-0.1, -0.1, -0.1, 10.0, 0.0], dtype=torch.float64), [0, 0, 0, 1, 1])
    assert adv[:3].tolist() == [0.0] * 3 and adv[3] > 0.7 and adv[4] < -0.7


def _lost_invalid_episode(group: str, turns: int):
    t = SimpleNamespace(valid=False, image=None, response_ids=[1, 2], prompt="p", observation="o")
    return SimpleNamespace(group_id=group, won=False, turns=[t] * turns)


def test_zero_adv_drop_drops_a_uniform_group_of_inexact_scores():
    from seedcli.rl.rescore import teaching_samples
    from seedcli.rl.samples import build_turn_samples

    episodes = [_lost_invalid_episode("g", 3) for _ in range(4)]  # 12 turn-samples scoring −0.1 each
    samples = build_turn_samples(episodes, [None] * 4, None, insert_skill=lambda p, s: p, reward=Reward(10.0, 0.1))
    assert [s.score for s in samples] == pytest.approx([-0.1] * 12)
    assert [s.advantage for s in samples] == [0.0] * 12
    assert teaching_samples(samples, "drop") == []  # was all 12
