"""`seed probe`'s pieces (seedcli/stages/probe.py, seedcli/report/probe.py) against direct computations: which tokens
spell the action, the null text's length, another task's skill, Δ's statistics, the correlation and the paired gap."""

from __future__ import annotations

import math
from types import SimpleNamespace as NS

import pytest
import torch

from seedcli.report.probe import TurnScores, contrasts, paired_gap, pearson, summarise
from seedcli.rl.analyse import other_skills
from seedcli.stages.probe import NULL_TEXT, action_mask, null_skill


class CharTokenizer:
    """One token per character (ids are code points): decode is exact, so the expected mask is plain to read."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def test_action_mask_marks_the_last_occurrence_of_the_action():
    tok = CharTokenizer()
    reply = '{"thoughts": "3 + 9 = 12, so 3", "action": "3"}'
    mask = action_mask(tok, tok.encode(reply), "3")
    assert sum(mask) == 1 and mask[reply.rindex("3")]  # the action field's 3, not the thoughts' ones
    tag = "<think>go</think>\n<action>go to desk 1</action>"
    mask = action_mask(tok, tok.encode(tag), "go to desk 1")
    assert "".join(c for c, m in zip(tag, mask, strict=True) if m) == "go to desk 1"
    assert action_mask(tok, tok.encode("no action here"), "look") == [False] * 14
    shop = "<action>search[Find me jeans]</action>"  # WebShop's parser lowercases what it sends
    assert sum(action_mask(tok, tok.encode(shop), "search[find me jeans]")) == len("search[find me jeans]")
    assert action_mask(tok, tok.encode("abc"), "") == [False] * 3


def test_action_mask_with_multi_character_tokens():
    class Pairs(CharTokenizer):  # each id stands for two characters
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(i // 1000) + chr(i % 1000) for i in ids)

    text = "xx<a>go</a>"  # the pairs "xx", "<a", ">g", "o<", "/a", ">" + pad
    ids = [ord(text[i]) * 1000 + ord(text[i + 1]) for i in range(0, 10, 2)]
    assert action_mask(Pairs(), ids, "go") == [False, False, True, True, False]  # ">g" and "o<" hold it


def test_null_skill_is_neutral_and_about_as_long_as_asked():
    for length in (40, 200, 700):
        text = null_skill(length)
        assert length <= len(text) < length + 20 or len(text) >= len(NULL_TEXT) // 2
        assert set(text.split()) <= set(NULL_TEXT.split())


def test_other_skills_never_give_an_episode_a_skill_of_its_own_task():
    eps = [NS(task_id=t) for t in ("a", "a", "b", "c")]
    skills = ["sa", "sa2", "sb", None]
    for seed in range(20):
        out = other_skills(eps, skills, seed, other_task=True)
        assert out[0] in ("sb",) and out[1] == "sb" and out[2] in ("sa", "sa2") and out[3] is None
    assert other_skills([NS(task_id="a")], ["s"], 0, other_task=True) == [None]  # no other task


def _turn(ep, won, adv, action, none, ctx):
    return TurnScores(ep, won, adv, action, {"none": torch.tensor(none), "oracle": torch.tensor(ctx)})


def test_summarise_against_direct_computation():
    turns = [
        _turn(0, True, 1.0, [False, True], [-1.0, -2.0], [-1.0, -0.5]),  # Δ = 0, +1.5 (action)
        _turn(0, True, 1.0, [True, False, False], [-3.0, -1.0, -1.0], [-1.0, -1.5, -1.0]),  # +2, −0.5, 0
        _turn(1, False, -1.0, [False, True], [-2.0, -1.0], [-2.5, -1.2]),  # −0.5, −0.2 (action)
    ]
    out = summarise(turns, ("oracle",))["oracle"]
    act = out["action"]
    assert act["won"]["delta_mean"] == pytest.approx((1.5 + 2.0) / 2)
    assert act["lost"]["delta_mean"] == pytest.approx(-0.2)
    assert act["all"]["tokens"] == 3 and act["all"]["share_over_1"] == pytest.approx(2 / 3)
    assert act["all"]["reply_absmax_mean"] == pytest.approx((1.5 + 2.0 + 0.2) / 3)
    assert act["all"]["logp_mean"] == pytest.approx((-0.5 - 1.0 - 1.2) / 3)
    assert out["other"]["all"]["delta_mean"] == pytest.approx((0.0 - 0.5 + 0.0 - 0.5) / 4)
    assert out["episodes"] == 2 and out["replies"] == 3
    assert out["corr_delta_advantage"] is None  # two episodes: too few for a correlation
    assert "null" not in summarise(turns)  # a context nothing was scored in is absent


def test_contrast_of_a_skill_with_its_control_by_hand():
    def turn(ep, action, own, shuffled):
        return TurnScores(ep, True, 0.0, action, {"none": torch.zeros(len(action)), "own": torch.tensor(own),
                                                  "shuffled": torch.tensor(shuffled)})  # fmt: skip

    turns = [
        turn(0, [True, False], [-1.0, -9.0], [-2.0, 0.0]),  # action: +1.0 (the other token is not counted)
        turn(0, [False, True], [0.0, -1.0], [0.0, -1.5]),  # +0.5 → episode 0: mean of +1.0, +0.5 = +0.75
        turn(1, [True, True], [-1.0, -1.0], [-0.75, -0.75]),  # episode 1: −0.25
        turn(2, [False, False], [-1.0, -1.0], [0.0, 0.0]),  # no action token: not an episode of the contrast
    ]
    out = contrasts(turns)
    assert set(out) == {"own-shuffled"}  # the oracle pair was not scored
    c = out["own-shuffled"]
    assert c["episodes"] == 2 and c["up"] == 1 and c["down"] == 1
    assert c["action_delta_mean"] == pytest.approx(0.25)
    # SE over the two episode means +0.75, −0.25: sd = √((0.5² + 0.5²)/1), / √2
    assert c["action_delta_se"] == pytest.approx(math.sqrt(0.5) / math.sqrt(2))


def test_pearson_and_paired_gap_by_hand():
    assert pearson([1, 2, 3, 4], [2, 4, 6, 8]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert pearson([1, 1, 1], [1, 2, 3]) is None
    gap = paired_gap({"a": False, "b": False, "c": True, "d": True}, {"a": True, "b": False, "c": True, "e": True})
    # over a, b, c: differences +1, 0, 0 → +33.3 points, SE = sd/√3 with sd = √(1/3)
    assert gap["tasks"] == 3 and gap["gained"] == 1 and gap["lost"] == 0
    assert gap["gap_points"] == pytest.approx(100 / 3)
    assert gap["gap_se_points"] == pytest.approx(100 * math.sqrt(1 / 3) / math.sqrt(3))
    assert paired_gap({}, {"a": True}) == {"tasks": 0}
