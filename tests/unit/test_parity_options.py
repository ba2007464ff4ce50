"""The settings and metrics added for parity with the SEED code (docs/parity.md), each against a hand computation:
the OPD window (`opd_start_after_steps`, `opd_stop_after_steps`), which episodes are analysed (`analyze`,
`failed_only_after_steps`), the minimum skill length, the parse retries, and the OPD gate metrics."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from seedcli.analyzers.parse import SKIPPED_SUCCESS, TOO_SHORT, UNPARSEABLE, parse_skill
from seedcli.analyzers.policy import SelfAnalysis, analyze_with_engine
from seedcli.config import RLConfig, build_config
from seedcli.engines.base import Completion
from seedcli.prompts import SCHEMA_REMINDER
from seedcli.records import Trajectory, Turn
from seedcli.rl.analyse import Batch, analyse, failed_only
from seedcli.rl.context import EnvHooks, Plan, opd_coef_at
from seedcli.rl.distributed import DistInfo
from seedcli.rl.losses import opd_gate_stats
from seedcli.rl.metrics import PhaseLog, update_metrics
from seedcli.rl.optimize import LossWeights, UpdateResult
from seedcli.rl.rescore import Rescored

torch.set_num_threads(1)

GOOD = json.dumps({"episode_summary": "It went.", "episode_skill": "Open the drawer before taking the mug."})
SHORT = json.dumps({"episode_summary": "It went.", "episode_skill": "Open the drawer first."})  # 4 words
BAD = "I think the agent did fine."  # no JSON, no fields


def trajectory(episode_id: str, won: bool) -> Trajectory:
    turn = Turn(
        step=1, observation="You are in a room.", admissible=["look"], prompt="Your task is to: find a mug.",
        response="<think>look</think><action>look</action>", action="look", valid=True,
    )  # fmt: skip
    return Trajectory(
        episode_id=episode_id, group_id="g0", env="alfworld", task_id="t0", split="train", category="pick",
        task="find a mug.", turns=[turn], won=won, score=float(won), reward=10.0 * won, length=1, engine="hf",
        model_id="m", model_hash="h", sampling={}, prompt_version="v", seed=0,
    )  # fmt: skip


class ScriptedEngine:
    """`render` and `generate` of an engine: the k-th generate call answers `script[k]` to every prompt."""

    def __init__(self, script: list[str]):
        self.script = script
        self.calls: list[list[list[dict]]] = []  # the messages of each prompt, per generate call
        self._rendered: list[list[dict]] = []

    def render(self, messages):
        self._rendered.append(messages)
        return [len(self._rendered) - 1]  # the id points back at the messages

    def generate(self, prompts, temperature, top_p, max_new_tokens, seed):
        self.calls.append([self._rendered[ids[0]] for ids in prompts])
        text = self.script[len(self.calls) - 1]
        return [Completion(text, [1, 2], [0.0, 0.0], "stop") for _ in prompts]


# ---------------------------------------------------------------------------------------------------- OPD window


def test_opd_weight_is_zero_before_start_and_after_stop():
    cfg = RLConfig(opd_start_after_steps=2, opd_stop_after_steps=4)
    # updates are 1-based: 1, 2 before the start; 3, 4 inside; 5, 6 after the stop
    assert [opd_coef_at(cfg, 0.01, step) for step in range(1, 7)] == [0.0, 0.0, 0.01, 0.01, 0.0, 0.0]
    assert [opd_coef_at(RLConfig(), 0.01, step) for step in (1, 2, 150)] == [0.01, 0.01, 0.01]
    assert [opd_coef_at(RLConfig(opd_start_after_steps=0), 0.01, s) for s in (1, 2)] == [0.01, 0.01]
    assert [opd_coef_at(RLConfig(opd_stop_after_steps=1), 0.01, s) for s in (1, 2)] == [0.01, 0.0]


def test_new_settings_at_their_defaults_keep_the_config_hash_and_count_when_changed():
    base = build_config("rl").config_hash()
    same = build_config("rl", overrides=["analyze=all", "min_skill_words=5", "analyzer_parse_retries=2"])
    assert same.config_hash() == base
    for override in ("opd_start_after_steps=10", "analyze=failed", "failed_only_after_steps=3", "min_skill_words=3",
                     "analyzer_parse_retries=3", "opd_stop_after_steps=100"):  # fmt: skip
        assert build_config("rl", overrides=[override]).config_hash() != base, override


# ---------------------------------------------------------------------------------------------------- analysis


def test_failed_only_schedule():
    assert [failed_only(RLConfig(), s) for s in (1, 50)] == [False, False]
    assert [failed_only(RLConfig(analyze="failed"), s) for s in (1, 50)] == [True, True]
    # after N updates only failed episodes, every episode before, whatever `analyze` says (the SEED code's override)
    for analyze in ("all", "failed"):
        cfg = RLConfig(analyze=analyze, failed_only_after_steps=3)
        assert [failed_only(cfg, s) for s in (1, 2, 3, 4, 5)] == [False, False, False, True, True]


def _ctx(cfg: RLConfig, engine) -> SimpleNamespace:
    return SimpleNamespace(cfg=cfg, plan=Plan("self", None, 0.01, 5.0), engine=engine, info=DistInfo(), images=None)


def test_analyze_failed_analyses_only_the_failed_episodes():
    episodes = [trajectory("e0", True), trajectory("e1", False), trajectory("e2", True), trajectory("e3", False)]
    engine = ScriptedEngine([GOOD])
    skills, reasons = analyse(_ctx(RLConfig(analyze="failed"), engine), episodes, step=1)
    assert len(engine.calls) == 1 and len(engine.calls[0]) == 2  # one batched call, the two failed episodes
    assert skills == [None, "Open the drawer before taking the mug.", None, "Open the drawer before taking the mug."]
    assert reasons == [SKIPPED_SUCCESS, None, SKIPPED_SUCCESS, None]
    # before `failed_only_after_steps` every episode is analysed; after it, only the failed ones
    cfg = RLConfig(failed_only_after_steps=1)
    engine = ScriptedEngine([GOOD, GOOD])
    assert analyse(_ctx(cfg, engine), episodes, step=1)[1] == [None] * 4
    assert analyse(_ctx(cfg, engine), episodes, step=2)[1] == [SKIPPED_SUCCESS, None, SKIPPED_SUCCESS, None]
    assert [len(call) for call in engine.calls] == [4, 2]
    # all won: nothing to ask
    engine = ScriptedEngine([])
    assert analyse(_ctx(RLConfig(analyze="failed"), engine), episodes[::2], step=1)[1] == [SKIPPED_SUCCESS] * 2
    assert engine.calls == []


def test_rules_analyzer_writes_each_episodes_skill_from_its_trajectory():
    """`--analyzer rules`: the environment's rules analyzer (ALFWorld's here) answers for every episode, no engine
    call; `analyze: failed` skips won ones; a skill under `min_skill_words` is rejected as too short."""
    from seedcli.envs import get_env
    from seedcli.stages.rl import resolve_plan

    env = get_env("alfworld")
    episodes = [trajectory("e0", True), trajectory("e1", False)]
    expected = [env.rules_skill(ep)[1] for ep in episodes]
    assert all(len(s.split()) >= 5 for s in expected) and expected[0] != expected[1]  # outcome-specific skills
    engine = ScriptedEngine([])

    def ctx(cfg):
        return SimpleNamespace(
            cfg=cfg, plan=resolve_plan(cfg), engine=engine, info=DistInfo(), images=None,
            hooks=EnvHooks(insert_skill=env.insert_skill, rules_skill=env.rules_skill),
        )  # fmt: skip

    cfg = RLConfig(analyzer="rules")
    assert ctx(cfg).plan.analyzer == "rules" and ctx(cfg).plan.teacher
    assert analyse(ctx(cfg), episodes, step=1) == (expected, [None, None])
    assert analyse(ctx(RLConfig(analyzer="rules", analyze="failed")), episodes, step=1) == (
        [None, expected[1]],
        [SKIPPED_SUCCESS, None],
    )
    longest = max(len(s.split()) for s in expected)
    assert analyse(ctx(RLConfig(analyzer="rules", min_skill_words=longest + 1)), episodes, step=1) == (
        [None, None],
        [TOO_SHORT, TOO_SHORT],
    )
    assert engine.calls == []  # nothing generated
    with pytest.raises(Exception, match="static:FILE, not rules"):
        resolve_plan(RLConfig(analyzer="rules", algo="sdar"))


def test_in_rollout_analysis_skips_won_episodes_and_retries_as_configured():
    engine = ScriptedEngine([])
    analysis = SelfAnalysis(engine, 64, attempts=3, min_words=5, failed_only=True)
    assert analysis.first(trajectory("won", True)) == []
    assert analysis.results["won"].reason == SKIPPED_SUCCESS and analysis.results["won"].attempts == 0
    (request,) = analysis.first(trajectory("lost", False))
    assert request.tag == ("lost", 0)
    (retry,) = analysis.land(("lost", 0), Completion(BAD, [1], [0.0], "stop"))
    assert retry.tag == ("lost", 1) and "lost" not in analysis.results
    messages = engine._rendered[retry.ids[0]]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == BAD and messages[2]["content"] == SCHEMA_REMINDER
    (retry,) = analysis.land(("lost", 1), Completion(SHORT, [1], [0.0], "stop"))  # 4 words < 5: asked again
    assert retry.tag == ("lost", 2)
    assert analysis.land(("lost", 2), Completion(BAD, [1], [0.0], "stop")) == []  # the third attempt is the last
    assert analysis.results["lost"].reason == UNPARSEABLE and analysis.results["lost"].attempts == 3
    # one attempt: the first answer is final
    once = SelfAnalysis(ScriptedEngine([]), 64, attempts=1)
    once.first(trajectory("x", True))  # failed_only off: a won episode is analysed too
    assert once.land(("x", 0), Completion(BAD, [1], [0.0], "stop")) == []
    assert once.results["x"].attempts == 1 and not once.results["x"].kept


# ---------------------------------------------------------------------------------------------------- parser, retries


def test_min_skill_words_is_honoured_by_the_parser():
    assert parse_skill(SHORT).reason == TOO_SHORT  # default 5
    assert parse_skill(SHORT, min_words=4).kept and parse_skill(SHORT, min_words=5).reason == TOO_SHORT
    assert parse_skill(GOOD, min_words=7).kept and parse_skill(GOOD, min_words=8).reason == TOO_SHORT  # 7 words
    assert parse_skill(SHORT, min_words=0).kept


@pytest.mark.parametrize(
    ("attempts", "calls", "kept", "last_attempt"),
    [(1, [2], 0, 1), (2, [2, 2], 0, 2), (3, [2, 2, 2], 2, 3), (4, [2, 2, 2], 2, 3)],
)
def test_parse_retries_are_honoured(attempts, calls, kept, last_attempt):
    engine = ScriptedEngine([BAD, SHORT, GOOD, GOOD])  # the third answer is the first usable one
    parsed = analyze_with_engine(engine, [trajectory("a", False), trajectory("b", True)], 64, attempts=attempts)
    assert [len(c) for c in engine.calls] == calls
    assert sum(p.kept for p in parsed) == kept and {p.attempts for p in parsed} == {last_attempt}
    if attempts >= 2:  # the retry shows the previous answer, then the schema reminder
        assert [m["content"] for m in engine.calls[1][0][1:]] == [BAD, SCHEMA_REMINDER]
    # with min_words 4 the second answer is already usable
    engine = ScriptedEngine([BAD, SHORT])
    parsed = analyze_with_engine(engine, [trajectory("a", False)], 64, attempts=3, min_words=4)
    assert parsed[0].kept and parsed[0].attempts == 2 and len(engine.calls) == 2


# ---------------------------------------------------------------------------------------------------- metrics


def test_opd_gate_stats_by_hand():
    student = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, float("nan"), 0.0]])  # [B, T]
    teacher = torch.tensor([[-0.8, -2.4, -0.5], [-2.0, float("nan"), 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    # Δ over the mask: 0.2, -0.4, 0.0, 1.0; β = 5: g = σ(1), σ(-2), σ(0) = 0.5 (not active), σ(5)
    stats = opd_gate_stats(student, teacher, mask, beta=5.0)
    sig = [1 / (1 + math.exp(-z)) for z in (1.0, -2.0, 0.0, 5.0)]
    assert stats["opd/gate_mean"].item() == pytest.approx(sum(sig) / 4, abs=1e-6)
    assert stats["opd/gate_active_frac"].item() == pytest.approx(2 / 4)
    assert stats["opd/teacher_gap_mean"].item() == pytest.approx((0.2 - 0.4 + 0.0 + 1.0) / 4, abs=1e-6)
    flat = opd_gate_stats(student, teacher, mask, beta=0.0)  # OPSD: g = 0.5 everywhere, never > 0.5
    assert flat["opd/gate_mean"].item() == pytest.approx(0.5) and flat["opd/gate_active_frac"].item() == 0.0


def test_update_metrics_reports_the_official_opd_names():
    info = DistInfo()
    turn = SimpleNamespace(response_ids=[1, 2], finish_reason="stop")
    episodes = [
        SimpleNamespace(won=w, invalid_turns=0, score=float(w), turns=[turn], group_id="g")
        for w in (True, False, False)
    ]
    batch = Batch(episodes, [None, "a skill of some words", None], [SKIPPED_SUCCESS, None, "unparseable"])
    sample = SimpleNamespace(score=1.0, length=4, skill_length=6, has_skill=True, advantage=0.5)
    mine = [
        # Δ = ℓ_skill − ℓ_old: 0.5, -0.5 | (no skill) | 0.1 → 2 of 3 tokens have g > 0.5
        SimpleNamespace(old_logp=torch.tensor([-1.0, -2.0]), skill_logp=torch.tensor([-0.5, -2.5])),
        SimpleNamespace(old_logp=torch.tensor([-1.0]), skill_logp=None),
        SimpleNamespace(old_logp=torch.tensor([-1.0]), skill_logp=torch.tensor([-0.9])),
    ]
    scored = Rescored([sample], [], mine, {}, 0.0, 0.1, 3, episode_rewards=[10.0, 0.0, 0.0])
    result = UpdateResult(
        {"opd/delta_mean": 0.25, "opd/delta_absmax": 1.5, "opd/gate_mean": 0.6, "opd/token_frac": 0.5, "opd/loss": 0.0}
    )
    ctx = SimpleNamespace(
        info=info, plan=Plan("self", None, 0.01, 5.0), hooks=EnvHooks(insert_skill=lambda p, s: p), cfg=RLConfig()
    )
    log = PhaseLog(info)
    log.timing.update({"rollout": 1.0, "rescore": 3.0, "rescore_teacher": 1.0, "rescore_contrast": 0.5})
    summary = {"success_rate": 1 / 3, "success_by_type": {}, "mean_length": 1.0, "invalid_rate": 0.0}
    record = update_metrics(
        ctx, 1, epoch=0, games=1, batch=batch, episode_summary=summary, scored=scored, result=result, sync={},
        log=log, weights=LossWeights(opd_coef=0.01, opd_beta=5.0),
    )  # fmt: skip
    assert record["opd/gate_active_frac"] == pytest.approx(2 / 3)
    assert record["reward/mean"] == pytest.approx(10 / 3)  # the rewards rescore computed, not computed again
    assert record["opd/teacher_gap_mean"] == 0.25 and record["opd/delta_mean"] == 0.25  # the same quantity
    assert record["opd/teacher_gap_absmax"] == 1.5 and record["opd/delta_absmax"] == 1.5
    assert record["opd/gate_mean"] == 0.6 and record["opd/token_frac"] == 0.5  # kept as they were
    assert record["analyzer/skipped_success"] == 1
    assert record["analyzer/rejected/unparseable"] == 1 and f"analyzer/rejected/{SKIPPED_SUCCESS}" not in record
    # tokens (4 plain + 6 skill-context) over rollout + rescore (the teacher and contrast passes are inside rescore)
    assert record["perf/tokens_per_s"] == pytest.approx(10 / 4.0)
