"""`seed probe`'s pieces (seedcli/stages/probe.py, seedcli/report/probe.py) against direct computations: which tokens
spell the action, the null text's length, another task's skill, Δ's statistics, the correlation and the paired gap."""

from __future__ import annotations

import math
from types import SimpleNamespace as NS

import pytest
import torch

from seedcli.report.probe import (
    TurnScores,
    absorption_paired,
    absorption_rows,
    absorption_summary,
    contrasts,
    paired_gap,
    pearson,
    summarise,
)
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


def test_absorption_on_a_two_token_example_by_hand():
    """Absorption (issue 61 §2) on one panel episode whose expert reply and own sample are two tokens each, the first
    the action: ℓ of the expert's action tokens is the first token's ℓ_none alone; the own gap is the mean of
    ℓ_oracle − ℓ_none over both sample tokens, and over the action token alone for own_gap_action. A second model
    on the same panel pairs with the first episode by episode."""
    ln = math.log
    expert = [TurnScores(0, True, 0.0, [True, False], {"none": torch.tensor([ln(0.5), ln(0.9)])})]
    own = [TurnScores(0, True, 0.0, [True, False],
                      {"none": torch.tensor([ln(0.2), ln(0.8)]), "oracle": torch.tensor([ln(0.6), ln(0.4)])})]  # fmt: skip
    (row,) = absorption_rows(["e0"], expert, own)
    assert row["expert_action_logp"] == pytest.approx(ln(0.5))  # the action token only: ln 0.5 = −0.693
    assert row["expert_action_tokens"] == 1
    assert row["expert_final_action_logp"] == pytest.approx(ln(0.5)) and row["expert_turns"] == [pytest.approx(ln(0.5))]
    # (ln(0.6/0.2) + ln(0.4/0.8)) / 2 = (1.0986 − 0.6931) / 2 = +0.2027
    assert row["own_gap"] == pytest.approx((ln(3.0) + ln(0.5)) / 2)
    assert row["own_tokens"] == 2
    assert row["own_gap_action"] == pytest.approx(ln(3.0))
    # the trained model: the expert's action at p 0.8, and its own sample already at the teacher's 0.6 (gap 0 there)
    expert2 = [TurnScores(0, True, 0.0, [True, False], {"none": torch.tensor([ln(0.8), ln(0.9)])})]
    own2 = [TurnScores(0, True, 0.0, [True, False],
                       {"none": torch.tensor([ln(0.6), ln(0.4)]), "oracle": torch.tensor([ln(0.6), ln(0.4)])})]  # fmt: skip
    rows2 = absorption_rows(["e0"], expert2, own2)
    paired = absorption_paired([row], rows2)
    assert paired["expert_action_logp"]["mean"] == pytest.approx(ln(0.8) - ln(0.5))  # +0.470: absorbed
    assert paired["own_gap"]["mean"] == pytest.approx(0.0 - (ln(3.0) + ln(0.5)) / 2)  # the gap closed
    assert paired["expert_action_logp"]["up"] == 1 and paired["own_gap"]["down"] == 1
    assert math.isnan(paired["own_gap"]["se"])  # one episode: no standard error


def test_absorption_summary_and_pairing_over_episodes_by_hand():
    """Two panel episodes: the summary's mean and SE, and the pairing only over the episodes both models have (an
    episode the other model lacks, or one without action tokens, is left out)."""
    rows_a = [{"episode_id": "a", "expert_action_logp": -1.0, "own_gap": 0.4, "own_gap_action": None},
              {"episode_id": "b", "expert_action_logp": -3.0, "own_gap": 0.2, "own_gap_action": 0.5}]  # fmt: skip
    rows_b = [{"episode_id": "a", "expert_action_logp": -0.5, "own_gap": 0.1, "own_gap_action": 0.3},
              {"episode_id": "b", "expert_action_logp": -2.0, "own_gap": 0.2, "own_gap_action": 0.1},
              {"episode_id": "c", "expert_action_logp": 0.0, "own_gap": 0.0, "own_gap_action": 0.0}]  # fmt: skip
    summary = absorption_summary(rows_a)
    assert summary["expert_action_logp"]["mean"] == pytest.approx(-2.0)
    assert summary["expert_action_logp"]["se"] == pytest.approx(1.0)  # sd √2, over √2
    assert summary["own_gap_action"]["episodes"] == 1
    paired = absorption_paired(rows_a, rows_b)
    assert paired["expert_action_logp"]["episodes"] == 2  # c is not in a
    assert paired["expert_action_logp"]["mean"] == pytest.approx(0.75)  # (+0.5 + 1.0) / 2
    assert paired["expert_action_logp"]["se"] == pytest.approx(0.25)  # differences 0.5, 1.0: sd 0.3536 / √2
    assert paired["own_gap"]["mean"] == pytest.approx(-0.15) and paired["own_gap"]["down"] == 1
    assert paired["own_gap_action"]["episodes"] == 1 and paired["own_gap_action"]["mean"] == pytest.approx(-0.4)


def test_absorption_refuses_a_panel_it_would_misread():
    """Absorption scores the panel's actions as the expert's, and pairs a baseline by episode id, which repeats across
    runs (every eval's first episode is e0000): a model-played panel, a baseline probe of another panel, or one whose
    own samples were drawn at another temperature would give figures that mean something else, so each is refused."""
    from seedcli.artifacts import InputRef
    from seedcli.stages.probe import baseline_problem, panel_problem

    cfg = NS(measure="absorption", from_run="runs/eval/B", baseline="runs/probe/P", temperature=0.4, max_new_tokens=128)
    assert panel_problem(cfg, [NS(policy="expert")] * 2) == ""
    assert "model policy" in panel_problem(cfg, [NS(policy="expert"), NS(policy="model")])

    def probe_of(run_id: str):
        ref = InputRef(stage="eval", run_id=run_id, path=f"/runs/eval/{run_id}", manifest_sha256="0" * 64)
        return NS(inputs=[ref])

    drawn = {"absorption": {"temperature": 0.4, "max_new_tokens": 128}}
    source = NS(run_id="B")
    assert baseline_problem(cfg, source, probe_of("B"), drawn) == ""
    assert "not those of --from runs/eval/B (B)" in baseline_problem(cfg, source, probe_of("A"), drawn)
    hotter = {"absorption": {"temperature": 1.0, "max_new_tokens": 128}}
    assert "temperature=1.0" in baseline_problem(cfg, source, probe_of("B"), hotter)


def test_absorption_reads_the_expert_s_last_action_apart():
    """Two expert turns (a search whose action is two tokens, then an answer of one): the last action's mean is
    the answer's alone, the pooled mean weighs the three action tokens alike, and a turn without action tokens (its
    action not found in the reply) does not count as the last."""
    ln = math.log
    expert = [TurnScores(0, True, 0.0, [True, True, False], {"none": torch.tensor([ln(0.9), ln(0.7), ln(0.5)])}),
              TurnScores(0, True, 0.0, [False, True], {"none": torch.tensor([ln(0.4), ln(0.2)])}),
              TurnScores(0, True, 0.0, [False], {"none": torch.tensor([ln(0.3)])})]  # fmt: skip
    (row,) = absorption_rows(["e0"], expert, [])
    assert row["expert_final_action_logp"] == pytest.approx(ln(0.2))
    assert row["expert_action_logp"] == pytest.approx((ln(0.9) + ln(0.7) + ln(0.2)) / 3)
    assert row["expert_turns"][0] == pytest.approx((ln(0.9) + ln(0.7)) / 2) and row["expert_turns"][2] is None
    assert row["own_gap"] is None  # no own sample scored
