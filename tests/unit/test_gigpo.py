"""GiGPO's advantages (seedcli.rl.advantages) against verl-agent's `compute_gigpo_outcome_advantage`.

The reference is a transcription of verl-agent's code (tests/reference/verl_agent_gigpo.py), driven as its trainer
drives it (`ray_trainer.py: fit`): `compute_step_discounted_returns` over the environment's step rewards, the episode
reward at each step-sample's last token, `apply_invalid_action_penalty` on both, then the advantage. seedcli gets the
same inputs as plain lists. `dtype=float32` must equal the original bit for bit on every case; the default float64
must agree wherever the original's float32 rounding is not amplified (see `test_float32_quirk_...`).
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from seedcli.rl.advantages import (
    GiGPOSettings,
    discounted_returns,
    gigpo_advantages,
    gigpo_parts,
    step_group_metrics,
    step_groups,
)
from seedcli.rl.samples import Reward, build_turn_samples
from tests.reference import verl_agent_gigpo as ref

RANDOM_CASES = 120
RESPONSE_LEN = 3


def original(case: dict) -> list[float]:
    """verl-agent's advantages of `case`, one per step-sample (every response token carries the same one)."""
    n = len(case["groups"])
    nt = {
        "rewards": np.array(case["step_rewards"], dtype=object),
        "traj_uid": np.array(case["episodes"], dtype=object),
        "active_masks": np.array([True] * n, dtype=object),
        "uid": np.array(case["groups"], dtype=object),
        "anchor_obs": np.array(case["anchors"], dtype=object),
        "is_action_valid": np.array(case["valid"], dtype=object),
    }
    prompts = torch.zeros(n, 2, dtype=torch.long)
    batch = ref.Batch(
        batch={
            "input_ids": torch.zeros(n, 2 + RESPONSE_LEN, dtype=torch.long),
            "prompts": prompts,
            "responses": torch.zeros(n, RESPONSE_LEN, dtype=torch.long),
            "attention_mask": torch.ones(n, 2 + RESPONSE_LEN, dtype=torch.long),
        },
        non_tensor_batch=nt,
    )
    batch.batch["step_rewards"] = ref.compute_step_discounted_returns(batch, case["gamma"])
    scores = torch.zeros(n, RESPONSE_LEN, dtype=torch.float32)
    scores[:, RESPONSE_LEN - 1] = torch.tensor(np.array(case["episode_rewards"], dtype=np.float32))
    batch.batch["token_level_scores"] = scores
    ref.apply_invalid_action_penalty(batch, invalid_action_penalty_coef=case["penalty"])
    adv, _ = ref.compute_gigpo_outcome_advantage(
        token_level_rewards=batch.batch["token_level_scores"],
        step_rewards=batch.batch["step_rewards"],
        response_mask=torch.ones(n, RESPONSE_LEN),
        anchor_obs=nt["anchor_obs"],
        index=nt["uid"],
        traj_index=nt["traj_uid"],
        step_advantage_w=case["w"],
        mode={"mean_std": "mean_std_norm", "mean": "mean_norm"}[case["norm"]],
        enable_similarity=case["similarity"],
        similarity_thresh=case["threshold"],
    )
    assert torch.equal(adv, adv[:, :1].expand_as(adv))  # broadcast to every response token
    return adv[:, 0].tolist()


def ours(case: dict, dtype: torch.dtype) -> list[float]:
    """seedcli's advantages of the same case; the turn's score is the episode's reward minus its own penalty."""
    pen = [case["penalty"] * (not v) for v in case["valid"]]
    if dtype == torch.float32:  # the trainer subtracts the penalty in float32 from the float32 reward
        score = [float(np.float32(r) - np.float32(p)) for r, p in zip(case["episode_rewards"], pen, strict=True)]
    else:
        score = [r - p for r, p in zip(case["episode_rewards"], pen, strict=True)]
    return gigpo_advantages(
        case["groups"], case["episodes"], case["anchors"], case["step_rewards"], score,
        gamma=case["gamma"], step_weight=case["w"], norm=case["norm"], epsilon=1e-6,
        similarity=case["similarity"], similarity_threshold=case["threshold"], step_penalties=pen, dtype=dtype,
    )  # fmt: skip


ROOMS = ["kitchen", "cabinet 1", "cabinet 2", "fridge 1", "drawer 3", "countertop 2"]


def _anchor(rng: random.Random, long: bool) -> str:
    place = rng.choice(ROOMS)
    state = rng.choice(["closed", "open", "empty", "holding a mug 1"])
    text = f"You arrive at {place}. The {place} is {state}."
    if long:  # over 200 characters: difflib's autojunk starts to matter
        text += " On it, you see " + ", ".join(f"a {rng.choice(['cup', 'fork', 'apple'])} {k}" for k in range(12)) + "."
    return text


def random_case(seed: int) -> dict:
    """A batch as verl-agent's rollout builds it: task groups of 1-6 episodes of 1-6 steps; the first observation
    shared by a group; later ones drawn from a small set (so steps of different episodes meet again); sparse
    terminal or dense step rewards; some invalid actions; episodes interleaved or one after another."""
    rng = random.Random(seed)
    episodes_steps: list[list[dict]] = []
    long = rng.random() < 0.3
    for g in range(rng.randint(1, 4)):
        first = f"-= Welcome =- You are in the middle of a room. Your task is to: put a mug in cabinet {g}."
        for e in range(rng.randint(1, 6)):
            length, won = rng.randint(1, 6), rng.random() < 0.4
            steps = []
            for t in range(length):
                dense = rng.choice([0.0, -0.1, 1.0, -1.0, 0.5])
                reward = (
                    (10.0 * won if t == length - 1 else 0.0) if seed % 3 else dense + (10.0 * won) * (t == length - 1)
                )
                steps.append({
                    "group": f"g{g}", "episode": f"g{g}e{e}", "reward": reward, "valid": rng.random() > 0.2,
                    "anchor": first if t == 0 else (rng.choice(["Nothing happens.", _anchor(rng, long)])),
                })  # fmt: skip
            episodes_steps.append(steps)
    order: list[dict] = []
    if rng.random() < 0.5:
        for steps in episodes_steps:
            order.extend(steps)
    else:  # interleaved (as the rollout's step-major lists), each episode's steps still in order
        queues = [list(s) for s in episodes_steps]
        while any(queues):
            q = rng.choice([q for q in queues if q])
            order.append(q.pop(0))
    ep_reward: dict[str, np.float32] = {}
    for s in order:  # the rollout sums the step rewards in float32 (episode_rewards)
        ep_reward[s["episode"]] = np.float32(ep_reward.get(s["episode"], np.float32(0.0)) + np.float32(s["reward"]))
    similarity = rng.random() < 0.35
    return {
        "groups": [s["group"] for s in order],
        "episodes": [s["episode"] for s in order],
        "anchors": [s["anchor"] for s in order],
        "step_rewards": [s["reward"] for s in order],
        "valid": [s["valid"] for s in order],
        "episode_rewards": [float(ep_reward[s["episode"]]) for s in order],
        "gamma": rng.choice([0.95, 0.9, 0.5, 1.0, round(rng.uniform(0.0, 1.0), 3)]),
        "w": rng.choice([1.0, 1.0, 0.5, 0.0, round(rng.uniform(0.0, 2.0), 3)]),
        "norm": rng.choice(["mean_std", "mean"]),
        "penalty": rng.choice([0.1, 0.1, 0.01]),
        "similarity": similarity,
        "threshold": rng.choice([0.95, 0.9, 0.8, 0.6]) if similarity else 0.95,
    }


def hand_case(groups, episodes, anchors, step_rewards, valid, episode_rewards, **kw) -> dict:
    base = {"gamma": 0.95, "w": 1.0, "norm": "mean_std", "penalty": 0.1, "similarity": False, "threshold": 0.95}
    return {
        "groups": groups, "episodes": episodes, "anchors": anchors, "step_rewards": step_rewards, "valid": valid,
        "episode_rewards": episode_rewards, **base, **kw,
    }  # fmt: skip


HAND_CASES = {
    # two episodes share their first observation; A wins on step 2
    "two_episodes": hand_case(["g"] * 4, ["A", "A", "B", "B"], ["s0", "s1", "s0", "s2"], [0, 10, 0, 0],
                              [True] * 4, [10, 10, 0, 0], gamma=0.5, norm="mean"),
    # every step group a singleton: the step term is 0, the advantage is the episode term
    "all_singletons": hand_case(["g"] * 3, ["A", "B", "C"], ["x", "y", "z"], [10, 0, 10], [True, False, True],
                                [10, 0, 10]),
    # a task group of one step-sample keeps its raw score (mean 0, std 1), both norms
    "lone_group_mean_std": hand_case(["g"], ["A"], ["x"], [10], [False], [10]),
    "lone_group_mean": hand_case(["g"], ["A"], ["x"], [10], [False], [10], norm="mean"),
    # all equal: every episode won in one step from the same observation
    "all_equal": hand_case(["g"] * 4, list("ABCD"), ["x"] * 4, [10] * 4, [True] * 4, [10] * 4),
    # all equal and not exactly representable in float32: 6 episodes from the same start, each won on step 3, so the
    # shared first step's returns are all 10·0.95² (the later steps' observations are each episode's own)
    "all_equal_inexact": hand_case(["g"] * 18, [e for e in "ABCDEF" for _ in range(3)],
                                   [a for e in "ABCDEF" for a in ("s0", f"{e}1", f"{e}2")], [0, 0, 10] * 6,
                                   [True] * 18, [10] * 18),
    # similarity: 'closed' and 'open' differ by a few characters; the threshold decides
    "similar_loose": hand_case(["g"] * 3, ["A", "B", "C"], ["The cabinet 1 is closed.", "The cabinet 1 is open.",
                               "You see nothing."], [10, 0, 0], [True] * 3, [10, 0, 0], similarity=True, threshold=0.8),
    "similar_strict": hand_case(["g"] * 3, ["A", "B", "C"], ["The cabinet 1 is closed.", "The cabinet 1 is open.",
                                "You see nothing."], [10, 0, 0], [True] * 3, [10, 0, 0], similarity=True,
                                threshold=0.95),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(HAND_CASES))
def test_hand_cases_equal_the_original(name):
    case = HAND_CASES[name]
    assert ours(case, torch.float32) == original(case)


def test_random_cases_equal_the_original_bit_for_bit():
    kinds = {"similarity": 0, "shared_anchor_groups": 0, "singleton_step_groups": 0, "mean": 0, "mean_std": 0}
    for seed in range(RANDOM_CASES):
        case = random_case(seed)
        expected = original(case)
        assert ours(case, torch.float32) == expected, f"case {seed}"
        got64 = ours(case, torch.float64)
        scale = max(1.0, max(abs(x) for x in expected))
        # float64 against float32: equal up to float32 rounding, unless a group's values are all equal (then
        # float64 gives 0 where float32 may give ±(an ulp / (std of an ulp + 1e-6)): test_float32_quirk_...)
        sg = step_groups(case["groups"], case["anchors"], similarity=case["similarity"], threshold=case["threshold"])
        flat = _flat_groups(case, sg)
        for i, (a, b) in enumerate(zip(got64, expected, strict=True)):
            if case["norm"] == "mean" or not flat[i]:
                assert a == pytest.approx(b, abs=2e-4 * scale), f"case {seed}, sample {i}"
        kinds["similarity"] += case["similarity"]
        kinds[case["norm"]] += 1
        sizes = np.bincount(sg)
        kinds["shared_anchor_groups"] += int((sizes > 1).any())
        kinds["singleton_step_groups"] += int((sizes == 1).any())
    # the generator covers what the comparison is about
    assert min(kinds.values()) >= 20, kinds


def _flat_groups(case: dict, sg: list[int]) -> list[bool]:
    """Per sample: whether its task group (its scores) or step group (its returns) has more than one member and all
    its float64 values (nearly) equal: there float32's rounding, divided by an std of a few ulps + 1e-6, is amplified."""
    pen = np.array([case["penalty"] * (not v) for v in case["valid"]])
    ret = np.array(discounted_returns(case["episodes"], case["step_rewards"], case["gamma"])) - pen
    score = np.array(case["episode_rewards"]) - pen
    flat = [False] * len(sg)
    for ids, values in ((sg, ret), (case["groups"], score)):
        members: dict = {}
        for j, g in enumerate(ids):
            members.setdefault(g, []).append(j)
        for idx in members.values():
            if len(idx) > 1 and float(np.ptp(values[idx])) < 1e-4:
                for j in idx:
                    flat[j] = True
    return flat


def test_hand_computed_two_episodes():
    # A: s0 -> s1 -> won (10); B: s0 -> s2 -> lost. γ = 0.5, mean norm, ω = 1.
    # episode term over the 4 step-samples: mean 5 -> A +5, +5; B -5, -5
    # step returns: A 0 + 0.5·10 = 5, 10; B 0, 0. Step groups {A1, B1} (s0): ±2.5; A2, B2 alone: 0
    case = HAND_CASES["two_episodes"]
    parts = gigpo_parts(case["groups"], case["episodes"], case["anchors"], case["step_rewards"],
                        case["episode_rewards"], GiGPOSettings(gamma=0.5, norm="mean"))  # fmt: skip
    assert parts.episode == [5.0, 5.0, -5.0, -5.0]
    assert parts.returns == [5.0, 10.0, 0.0, 0.0]
    assert parts.step == [2.5, 0.0, -2.5, 0.0]
    assert parts.advantages == [7.5, 5.0, -7.5, -5.0]
    assert parts.step_groups[0] == parts.step_groups[2] and len(set(parts.step_groups)) == 3


def test_penalty_is_subtracted_after_discounting():
    # verl-agent subtracts an invalid turn's penalty from its discounted return, not from its reward: the penalty of
    # step 1 does not reach step 0's return
    parts = gigpo_parts(["g"] * 2, ["A"] * 2, ["x", "y"], [0.0, 10.0], [10.0, 9.9], GiGPOSettings(gamma=0.5),
                        step_penalties=[0.0, 0.1])  # fmt: skip
    assert parts.returns == pytest.approx([5.0, 9.9])


def test_lone_samples_keep_their_score_and_step_term_zero():
    for norm, expected in (("mean_std", 10.0 / (1 + 1e-6)), ("mean", 10.0)):
        parts = gigpo_parts(["g"], ["A"], ["x"], [10.0], [10.0], GiGPOSettings(norm=norm))
        assert parts.episode == [pytest.approx(expected, abs=0)] and parts.step == [0.0]


def test_float32_quirk_all_equal_step_group_gets_a_uniform_advantage():
    # six equal step returns 10·0.95² in float32: their mean is off by an ulp and their std is an ulp, so verl-agent
    # gives every member of that step group the same non-zero step advantage (about -0.47); float64 gives exactly 0
    case = HAND_CASES["all_equal_inexact"]
    f32, f64 = np.array(ours(case, torch.float32)), np.array(ours(case, torch.float64))
    assert f32.tolist() == original(case)
    first = f32[0::3]  # the shared first steps; the episode term is 0 (every score is 10)
    assert np.all(first == first[0]) and abs(first[0]) > 0.1
    assert np.all(f64 == 0.0)


def test_similarity_clusters_against_the_first_member_in_order():
    # b is close to a, c is close to b but not to a: c opens its own cluster (verl-agent compares with the
    # cluster's first member only), and a later exact copy of c joins it
    a, b, c = "aaaaaaaaaa", "aaaaaaaaab", "aaaaaaaabb"
    groups = step_groups(["g"] * 4, [a, b, c, c], similarity=True, threshold=0.85)
    assert groups == [0, 0, 1, 1]  # ratio(b, a) = 0.9, ratio(c, a) = 0.8
    expected = ref.build_step_group(np.array([a, b, c, c], dtype=object), np.array(["g"] * 4), True, 0.85)
    assert _same_partition(groups, list(expected))
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        step_groups(["g"], [a], similarity=True, threshold=1.0)
    with pytest.raises(ValueError, match="not text"):
        step_groups(["g"], [b"png"], similarity=True)


def _same_partition(x: list, y: list) -> bool:
    return all((x[i] == x[j]) == (y[i] == y[j]) for i in range(len(x)) for j in range(len(x)))


def test_step_groups_never_cross_task_groups():
    groups = step_groups(["g1", "g1", "g2", "g2"], ["x", "x", "x", "y"])
    assert groups[0] == groups[1] and groups[2] != groups[0] and groups[3] not in groups[:3]


def test_step_group_metrics_by_hand():
    # groups of sizes 3, 1, 1, 2 -> mean 7/4, 2 of 4 groups and 2 of 7 samples singletons
    m = step_group_metrics([0, 0, 0, 1, 2, 3, 3])
    assert m["gigpo/state_group/num_groups"] == 4 and m["gigpo/state_group/num_samples"] == 7
    assert m["gigpo/state_group/mean"] == 1.75 and m["gigpo/state_group/max"] == 3 and m["gigpo/state_group/min"] == 1
    assert m["gigpo/state_group/size_1_group_prop"] == 0.5
    assert m["gigpo/state_group/size_1_sample_prop"] == pytest.approx(2 / 7)
    assert step_group_metrics([])["gigpo/state_group/mean"] == 0.0


def _episode(group: str, won: bool, steps: list[tuple[str, bool]]):
    turns = [
        SimpleNamespace(observation=o, valid=v, image=None, response_ids=[1, 2], prompt=f"p {o}") for o, v in steps
    ]
    return SimpleNamespace(group_id=group, won=won, turns=turns)


def test_turn_samples_get_gigpo_advantages_from_the_reward():
    reward = Reward(win=10.0, invalid_penalty=0.1)
    episodes = [
        _episode("g", True, [("start", True), ("hall", False), ("goal", True)]),
        _episode("g", False, [("start", True), ("hall", True)]),
    ]
    settings = GiGPOSettings(gamma=0.95, norm="mean_std")
    samples = build_turn_samples(episodes, [None, None], None, insert_skill=lambda p, s: p, reward=reward,
                                 gigpo=settings)  # fmt: skip
    expected = gigpo_advantages(
        ["g"] * 5, [0, 0, 0, 1, 1], ["start", "hall", "goal", "start", "hall"],
        [0.0, 0.0, 10.0, 0.0, 0.0],  # the win on the episode's last turn
        [10.0, 9.9, 10.0, 0.0, 0.0],  # each turn's score: the outcome minus its own penalty
        gamma=0.95, norm="mean_std", step_penalties=[0.0, 0.1, 0.0, 0.0, 0.0],
    )  # fmt: skip
    assert [s.advantage for s in samples] == pytest.approx(expected)
    assert samples[0].step_group == samples[3].step_group and samples[1].step_group == samples[4].step_group
    assert len({s.step_group for s in samples}) == 3
    plain = build_turn_samples(episodes, [None, None], None, insert_skill=lambda p, s: p, reward=reward)
    assert all(s.step_group == -1 for s in plain)  # no step credit without gigpo
    assert [s.advantage for s in plain] != pytest.approx(expected)


def test_float64_equal_groups_are_exactly_zero_in_both_terms():
    # issue 55 §3: an episode group of scores all −0.1 and a step group of returns all 10·0.95² are exactly 0 in
    # float64 under both norms (their means are an ulp off; an ulp over std 0 + eps was ±1e-11 before)
    for norm in ("mean_std", "mean"):
        parts = gigpo_parts(
            ["g"] * 6, [0, 0, 0, 1, 1, 1], ["a", "b", "c"] * 2, [0.0, 0.0, 10.0] * 2, [-0.1] * 6,
            GiGPOSettings(gamma=0.95, norm=norm),
        )  # fmt: skip
        assert parts.episode == [0.0] * 6
        assert parts.step == [0.0] * 6 and parts.advantages == [0.0] * 6
