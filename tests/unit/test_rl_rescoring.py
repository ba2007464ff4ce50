"""Turn-samples, advantages, packed re-scoring, the static skill library and the weight-sync probe."""

import math
import statistics

import pytest
import torch
import torch.nn.functional as F

from seedcli.envs import get_env
from seedcli.envs.alfworld.prompt import render_agent_prompt
from seedcli.errors import NonFiniteValue
from seedcli.prompts import SKILL_HEADING
from seedcli.records import Trajectory, Turn
from seedcli.rl.logprobs import Scorer, score_responses
from seedcli.rl.rescore import rescore_samples
from seedcli.rl.samples import build_turn_samples
from seedcli.rl.weight_sync import WeightSyncError, check_probe
from tests.helpers_models import tiny_lm as helpers_tiny_lm

torch.set_num_threads(1)
transformers = pytest.importorskip("transformers")

VOCAB = 97
INSERT_SKILL = get_env("alfworld").insert_skill  # what the rl stage hands in for ALFWorld episodes


def tiny_lm(seed: int = 0):
    return helpers_tiny_lm(seed, vocab=VOCAB)


def turn(step: int, valid: bool, response_ids: list[int], task: str = "put a mug in fridge.") -> Turn:
    prompt = render_agent_prompt(task, f"obs {step}", ["look", "inventory"], step, [], 5)
    return Turn(
        step=step, observation=f"obs {step}", admissible=["look"], prompt=prompt, response="r", response_ids=response_ids,
        action="look", valid=valid,
    )  # fmt: skip


def episode(eid: str, gid: str, won: bool, turns: list[Turn], task_type: str = "pick_and_place_simple") -> Trajectory:
    return Trajectory(
        episode_id=eid, group_id=gid, game_file="g", split="train", task_type=task_type, task="put a mug in fridge.",
        turns=turns, won=won, reward=10.0 * won, length=len(turns), engine="hf", model_id="m", model_hash="h",
        sampling={}, prompt_version="v", seed=0,
    )  # fmt: skip


def fake_render(text: str) -> list[int]:
    """Deterministic ids from text (one per word, mod vocab), standing in for the chat template."""
    return [1] + [(sum(map(ord, w)) % (VOCAB - 2)) + 2 for w in text.split()][:40]


# --------------------------------------------------------------------------------------------- samples


def test_turn_samples_scores_and_group_advantages_by_hand():
    eps = [
        episode("a", "g1", True, [turn(1, True, [5, 6]), turn(2, False, [7])]),
        episode("b", "g1", False, [turn(1, True, [8, 9, 10])]),
        episode("c", "g2", False, [turn(1, True, [11]), turn(2, True, [])]),  # empty response: dropped
    ]
    samples = build_turn_samples(
        eps, ["Find it first then bring it over.", None, None], fake_render, insert_skill=INSERT_SKILL
    )
    assert [s.score for s in samples] == pytest.approx([10.0, 9.9, 0.0, 0.0])
    g1 = [10.0, 9.9, 0.0]
    mean, std = statistics.mean(g1), statistics.stdev(g1)  # unbiased, as verl
    expected = [(x - mean) / (std + 1e-6) for x in g1] + [0.0]  # g2 is a group of one sample: advantage 0
    assert [s.advantage for s in samples] == pytest.approx(expected, rel=1e-5)
    assert [s.group_id for s in samples] == ["g1", "g1", "g1", "g2"]
    # the skill context exists only for the episode with a skill, and it is the skill-augmented prompt
    assert samples[0].skill_prompt_ids == fake_render(
        _skill_prompt(eps[0].turns[0].prompt, "Find it first then bring it over.")
    )
    assert samples[2].skill_prompt_ids is None and samples[3].skill_prompt_ids is None
    assert samples[0].prompt_ids == fake_render(eps[0].turns[0].prompt)


def test_turn_samples_per_episode_advantage_level_by_hand():
    """advantage_level episode: g1's statistics over its two episodes, each scored by its first turn (10.0 and 0.0,
    not 10.0, 9.9 and 0.0); every turn is then normalised by them, its own score kept."""
    eps = [
        episode("a", "g1", True, [turn(1, True, [5, 6]), turn(2, False, [7])]),
        episode("b", "g1", False, [turn(1, True, [8, 9, 10])]),
        episode("c", "g2", False, [turn(1, True, [11]), turn(2, True, [12])]),  # one episode: advantage 0
    ]
    samples = build_turn_samples(eps, [None] * 3, None, insert_skill=INSERT_SKILL, advantage_level="episode")
    mean, std = 5.0, statistics.stdev([10.0, 0.0])
    expected = [(x - mean) / (std + 1e-6) for x in (10.0, 9.9, 0.0)] + [0.0, 0.0]
    assert [s.advantage for s in samples] == pytest.approx(expected, rel=1e-5)


def _skill_prompt(prompt: str, skill: str) -> str:
    out = INSERT_SKILL(prompt, skill)
    assert SKILL_HEADING in out
    return out


def test_no_skill_context_without_teacher():
    eps = [episode("a", "g", True, [turn(1, True, [5])])]
    samples = build_turn_samples(
        eps, ["Find it first then bring it over."], fake_render, insert_skill=INSERT_SKILL, with_skill_context=False
    )
    assert samples[0].skill_prompt_ids is None


def test_the_skill_prompt_is_what_the_handed_in_insert_skill_makes():
    """rescoring knows no environment: the skill-augmented prompt is whatever the stage's `insert_skill` returns."""
    eps = [episode("a", "g", True, [turn(1, True, [5])]), episode("b", "g", False, [turn(1, True, [6])])]
    skill = "Find it first then bring it over."
    samples = build_turn_samples(eps, [skill, None], None, insert_skill=lambda prompt, s: f"<{s}>\n{prompt}")
    assert samples[0].skill_prompt == f"<{skill}>\n{eps[0].turns[0].prompt}" and samples[0].has_skill
    assert samples[1].skill_prompt is None and not samples[1].has_skill
    assert samples[0].prompt_ids is None  # render=None: each rank tokenises its own share later


# --------------------------------------------------------------------------------------------- re-scoring


def naive_response_logp(lm, prompt, response):
    ids = torch.tensor([prompt + response])
    logits = lm(input_ids=ids).logits.float()[0]  # [T, V]
    logp = F.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)  # [T-1]
    return logp[len(prompt) - 1 :]


def test_packed_scores_equal_one_at_a_time_and_naive():
    lm = tiny_lm()
    scorer = Scorer(lm)
    g = torch.Generator().manual_seed(0)
    contexts = []
    for plen, rlen in [(5, 3), (12, 1), (3, 7), (9, 4), (20, 2)]:
        contexts.append(
            (
                torch.randint(2, VOCAB, (plen,), generator=g).tolist(),
                torch.randint(2, VOCAB, (rlen,), generator=g).tolist(),
            )
        )
    fn = lambda ids, attn, resp: scorer(ids, attn, resp)  # noqa: E731
    with torch.no_grad():
        packed = score_responses(fn, contexts, max_tokens=24, pad_id=0)  # forces several micro-batches
        single = [score_responses(fn, [c], max_tokens=10_000, pad_id=0)[0] for c in contexts]
        naive = [naive_response_logp(lm, p, r) for p, r in contexts]
    for a, b, c, (_, r) in zip(packed, single, naive, contexts, strict=False):
        assert a.shape == (len(r),)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-5)


def test_rescore_fills_old_ref_and_skill():
    lm, ref = tiny_lm(0), tiny_lm(1)
    eps = [
        episode("a", "g", True, [turn(1, True, [5, 6, 7])]),
        episode("b", "g", False, [turn(1, True, [8, 9])]),
    ]
    samples = build_turn_samples(
        eps, ["Find it first then bring it over.", None], fake_render, insert_skill=INSERT_SKILL
    )
    timings = {}
    rescore_samples(
        samples, old_fn=Scorer(lm), ref_fn=Scorer(ref), teacher=True, max_tokens=512, pad_id=0, timings=timings
    )
    for s in samples:
        assert s.old_logp.shape == s.ref_logp.shape == (len(s.response_ids),)
        assert not torch.allclose(s.old_logp, s.ref_logp)  # a different model scores differently
    a, b = samples
    assert a.skill_logp is not None and b.skill_logp is None
    assert not torch.allclose(a.skill_logp, a.old_logp)  # the skill context changes the scores
    expected = naive_response_logp(lm, a.skill_prompt_ids, a.response_ids)
    torch.testing.assert_close(a.skill_logp, expected, atol=1e-5, rtol=1e-5)
    assert set(timings) == {"old", "ref", "teacher"}


def test_rescore_without_teacher_or_ref():
    lm = tiny_lm()
    samples = build_turn_samples(
        [episode("a", "g", True, [turn(1, True, [5])])],
        ["Find it first then bring it over."],
        fake_render,
        insert_skill=INSERT_SKILL,
    )
    rescore_samples(samples, old_fn=Scorer(lm), ref_fn=None, teacher=False, max_tokens=512, pad_id=0)
    assert samples[0].old_logp is not None and samples[0].ref_logp is None and samples[0].skill_logp is None


# --------------------------------------------------------------------------------------------- skill library


# moved to tests/unit/test_skill_library.py (the library now lives in seedcli.rl.skill_library)


# --------------------------------------------------------------------------------------------- probe


def test_probe_check():
    m, warnings = check_probe([-1.0, -2.0], [-1.0005, -2.0], tol=1e-3, step=4)  # the first check calibrates
    assert m["sync/probe_mean_abs_diff"] == pytest.approx(0.00025)
    assert m["sync/probe_max_abs_diff"] == pytest.approx(0.0005)
    assert m["sync/probe_calibration"] == pytest.approx(0.00025) and m["sync/probe_drift"] == 0.0 and not warnings
    # a large difference at calibration is the baseline, not a failure (a bf16 engine on a trained model)
    m, warnings = check_probe([-1.0, -2.0], [-1.5, -2.0], tol=1e-3, step=0)
    assert m["sync/probe_calibration"] == pytest.approx(0.25) and not warnings
    # later: a drift beyond the calibration by more than the tolerance warns, it does not raise
    m, warnings = check_probe([-1.0, -2.0], [-1.5, -2.0], tol=1e-3, step=4, calibration=0.0)
    assert m["sync/probe_drift"] == pytest.approx(0.25)
    assert len(warnings) == 1 and warnings[0].startswith("update 4:") and "0.25 more than at calibration" in warnings[0]
    assert not check_probe([-1.0, -2.0], [-1.5, -2.0], tol=1e-3, step=4, calibration=0.2495)[1]
    with pytest.raises(WeightSyncError, match="3 tokens"):  # the two sides scored different tokens: a broken probe
        check_probe([-1.0, -2.0, -3.0], [-1.0, -2.0], tol=1e-3, step=1)
    m, warnings = check_probe([math.nan], [-1.0], tol=1e-3, step=1)
    assert m["sync/probe_drift"] == math.inf and warnings
    # the trainer's own log-probs non-finite (rl lr=1e30 --steps 1 ended "complete" with such weights): a failed run
    for bad in (math.inf, -math.inf, math.nan):
        with pytest.raises(NonFiniteValue, match=r"^update 1: the trainer's log-probs .* non-finite \(1 of 2 tokens\)"):
            check_probe([-1.0, -2.0], [-1.0, bad], tol=1e-3, step=1)
