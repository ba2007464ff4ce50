"""Guards against skills that teach the wrong thing and the measures that show harm (issue 19 §3), each against a hand
computation: `opd/neg_adv_push_frac`, `opd/high_entropy_push_frac`, `leak_guard: mask | drop`, `opd_contrast:
shuffled` (the other skill's choice, its teacher pass and the contrasted gate)."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch

from seedcli.config import RLConfig
from seedcli.records import Trajectory, Turn
from seedcli.rl.analyse import GUARD_PLACEHOLDER, Batch, contrast_skills, guard_skills
from seedcli.rl.batching import collate, plan_minibatches
from seedcli.rl.context import EnvHooks, Plan
from seedcli.rl.distributed import DistInfo
from seedcli.rl.logprobs import Scorer
from seedcli.rl.losses import high_entropy_push_frac, opd_gap, opd_harm_sums, opd_loss
from seedcli.rl.metrics import PhaseLog, update_metrics
from seedcli.rl.optimize import LossWeights, UpdateResult, train_update
from seedcli.rl.rescore import Rescored, rescore, rescore_samples
from seedcli.rl.samples import TurnSample, build_turn_samples
from tests.helpers_models import tiny_lm

torch.set_num_threads(1)
pytest.importorskip("transformers")

VOCAB = 97


def sig(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


# --------------------------------------------------------------------------------------------- the measures


def test_neg_adv_push_sums_by_hand():
    gate = torch.tensor([[0.9, 0.2, 0.7], [0.6, 0.8, 0.5]])  # [B, T]
    gap = torch.tensor([[0.5, -0.3, 0.1], [0.2, -1.0, 9.0]])
    adv = torch.tensor([[-1.0, -1.0, -1.0], [2.0, 2.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    weight, harm = opd_harm_sums(gate, gap, adv, mask)
    # weight: 0.9 + 0.2 + 0.7 + 0.6 + 0.8 (the last token is masked); harm: A < 0 and gap > 0 → 0.9 + 0.7
    assert float(weight) == pytest.approx(3.2)
    assert float(harm) == pytest.approx(1.6)


def test_high_entropy_push_frac_by_hand():
    entropy = torch.tensor([0.1, 0.5, 0.9, 0.3, 0.7, 0.2, 0.4, 0.8, 0.6, 0.05])  # 10 tokens: top 20% = 0.9, 0.8
    weight = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0, 1.5, 0.0, 1.0])
    assert high_entropy_push_frac(entropy, weight) == pytest.approx((0.5 + 1.5) / 5.0)
    # 7 tokens: k = ceil(1.4) = 2; a tie with the 2nd largest counts in
    e7 = torch.tensor([0.3, 0.9, 0.5, 0.5, 0.1, 0.2, 0.0])
    w7 = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 4.0])
    assert high_entropy_push_frac(e7, w7) == pytest.approx(3.0 / 10.0)
    assert high_entropy_push_frac(e7, torch.zeros(7)) == 0.0  # no OPD weight
    assert high_entropy_push_frac(torch.zeros(0), torch.zeros(0)) == 0.0


def test_contrasted_gate_and_gradient_by_hand():
    student = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)  # [B, T]
    teacher = torch.tensor([[-0.5, -2.5], [-0.5, -1.0]])
    other = torch.tensor([[-1.5, -1.0], [7.0, 7.0]])
    cmask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])  # row 2 has no other skill: plain Δ there
    mask = torch.ones(2, 2)
    # gate reads ℓ_skill − ℓ_other on row 1 (1.0, −1.5) and Δ = ℓ_skill − ℓ_θ on row 2 (0.0, 2.0)
    gaps = [1.0, -1.5, 0.0, 2.0]
    assert opd_gap(student, teacher, other, cmask).flatten().tolist() == pytest.approx(gaps)
    loss, gate = opd_loss(student, teacher, mask, beta=2.0, contrast_logp=other, contrast_mask=cmask)
    assert gate.flatten().tolist() == pytest.approx([sig(2 * d) for d in gaps], abs=1e-6)
    loss.backward()  # ∇L = −g / n, the official factor with the contrasted gate
    assert student.grad.flatten().tolist() == pytest.approx([-sig(2 * d) / 4 for d in gaps], abs=1e-6)
    plain, g0 = opd_loss(student.detach(), teacher, mask, beta=2.0)  # no contrast: the official gate
    assert g0.flatten().tolist() == pytest.approx([sig(2 * d) for d in (0.5, -0.5, 0.0, 2.0)], abs=1e-6)


# --------------------------------------------------------------------------------------------- the guards


def test_guard_skills_mask_drop_off():
    skills = ["go up up left left then push", None, "push the box", "left left down down"]
    spans = [[(3, 8), (9, 18)], None, [], [(0, 19)]]
    masked, n = guard_skills(skills, spans, "mask")
    assert masked == [f"go {GUARD_PLACEHOLDER} {GUARD_PLACEHOLDER} then push", None, "push the box", GUARD_PLACEHOLDER]
    assert n == 2
    dropped, n = guard_skills(skills, spans, "drop")
    assert dropped == [None, None, "push the box", None] and n == 2
    assert guard_skills(skills, spans, "off") == (skills, 0)


def test_contrast_skills_same_category_other_text_deterministic():
    eps = [SimpleNamespace(category=c) for c in ("a", "a", "a", "b", "b", "c")]
    skills = ["s1", "s1", "s2", "s3", None, "s4"]
    out = contrast_skills(eps, skills, seed=7)
    assert out == contrast_skills(eps, skills, seed=7)  # seeded: the same choice on every rank and every rerun
    # episodes 0 and 1 can only get s2 (episode 1's text is the same as theirs); 2 gets s1; b and c have no other
    assert out == ["s2", "s2", "s1", None, None, None]


def trajectory(eid: str, category: str, responses: list[list[int]], won: bool = False) -> Trajectory:
    turns = [
        Turn(step=k + 1, observation="o", admissible=[], prompt=f"task {eid} turn {k}", response="r",
             response_ids=ids, action="up", valid=True)
        for k, ids in enumerate(responses)
    ]  # fmt: skip
    return Trajectory(
        episode_id=eid, group_id="g0", env="sokoban", task_id="t", split="train", category=category, task="t",
        turns=turns, won=won, score=float(won), reward=float(won), length=len(turns), engine="hf", model_id="m",
        model_hash="h", sampling={}, prompt_version="v", seed=0,
    )  # fmt: skip


def test_build_turn_samples_inserts_the_contrast_skill():
    eps = [trajectory("e0", "a", [[5, 6], [7]]), trajectory("e1", "a", [[8]])]
    samples = build_turn_samples(
        eps, ["mine", None], None, insert_skill=lambda p, s: f"<{s}> {p}", contrast_skills=["theirs", "x"]
    )
    assert [s.contrast_prompt for s in samples] == ["<theirs> task e0 turn 0", "<theirs> task e0 turn 1", None]
    assert samples[0].skill_prompt == "<mine> task e0 turn 0"


class CharEngine:
    """`render` of an engine: one token id per character (mod the vocabulary)."""

    tokenizer = SimpleNamespace(pad_token_id=0)

    def render(self, messages):
        return [2 + ord(ch) % (VOCAB - 2) for ch in messages[0]["content"]]


def test_rescore_phase_applies_the_guard_and_the_contrast_pass():
    lm = tiny_lm(0, vocab=VOCAB)
    eps = [trajectory("e0", "a", [[5, 6, 7]], won=True), trajectory("e1", "a", [[8, 9]]), trajectory("e2", "a", [[3]])]
    skills = ["push left left left left", "avoid corners", "walk around"]
    leaks = [[(5, 24)], [], []]  # episode 0's skill leaks its moves
    cfg = RLConfig(leak_guard="mask", opd_contrast="shuffled", mini_batch=8, advantage_norm="mean_std")
    ctx = SimpleNamespace(
        cfg=cfg, info=DistInfo(), engine=CharEngine(), plan=Plan("static", None, 0.01, 5.0),
        hooks=EnvHooks(insert_skill=lambda p, s: f"[{s}] {p}", find_leaks=lambda e, s: leaks),
        models=SimpleNamespace(train_model=Scorer(lm), ref_model=None),
        pad_id=0, vision_processor=None, padding_ids=lambda: None,
    )  # fmt: skip
    weights = LossWeights(opd_coef=0.01)
    scored = rescore(ctx, Batch(eps, skills, [None] * 3), step=1, weights=weights)
    assert scored.leak_guarded == 1
    by_ep = {s.episode_index: s for s in scored.samples}
    assert by_ep[0].skill_prompt == f"[push {GUARD_PLACEHOLDER}] task e0 turn 0"
    # the contrast is another episode's (guarded) skill of the same category, chosen by the update's seed
    for s in by_ep.values():
        assert s.contrast_prompt is not None and s.contrast_prompt != s.skill_prompt
        assert "left left" not in s.contrast_prompt  # chosen after the guard: never the leaked text
        assert s.contrast_logp is not None and s.contrast_logp.shape == (len(s.response_ids),)
    # ℓ_other is the response scored under the contrast prompt
    s = by_ep[1]
    again = copy.deepcopy(s)
    again.prompt_ids = list(CharEngine().render([{"content": s.contrast_prompt}]))
    rescore_samples([again], old_fn=Scorer(lm), ref_fn=None, teacher=False, max_tokens=4096, pad_id=0)
    assert torch.allclose(again.old_logp, s.contrast_logp, atol=1e-5)
    assert "contrast" in scored.forwards
    # drop: the leaking episode has no skill prompt, so no OPD
    ctx.cfg = RLConfig(leak_guard="drop", mini_batch=8)
    dropped = rescore(ctx, Batch(eps, skills, [None] * 3), step=1, weights=weights)
    assert dropped.leak_guarded == 1
    assert [s.has_skill for s in sorted(dropped.samples, key=lambda s: s.episode_index)] == [False, True, True]
    assert all(s.contrast_prompt is None for s in dropped.samples)  # opd_contrast: none → no extra pass


# --------------------------------------------------------------------------------------------- in the update


def samples_with_contrast(lm) -> list[TurnSample]:
    out = []
    for i, (p, r) in enumerate([([4, 5, 6], [7, 8, 9]), ([10, 11], [12, 13]), ([14, 15, 16, 17], [18, 19, 20, 21])]):
        s = TurnSample(i, 0, "g0", p, r, [1, 50, 51, *p], 0.0, advantage=(-1.0, 0.5, 0.5)[i])
        s.contrast_prompt_ids = [1, 60, *p] if i < 2 else None
        out.append(s)
    rescore_samples(out, old_fn=Scorer(lm), ref_fn=Scorer(lm), teacher=True, max_tokens=512, pad_id=0, contrast=True)
    return out


def test_update_logs_the_harm_measures_by_hand():
    lm = tiny_lm(0, vocab=VOCAB)
    samples = samples_with_contrast(lm)
    assert samples[2].contrast_logp is None and samples[0].contrast_logp is not None
    # θ = π_old at the one mini-batch's forward: gap = ℓ_skill − ℓ_other (or − ℓ_old without another skill)
    gaps = [s.skill_logp - (s.contrast_logp if s.contrast_logp is not None else s.old_logp) for s in samples]
    gates = [torch.sigmoid(5 * g) for g in gaps]
    total = sum(float(g.sum()) for g in gates)
    harm = sum(float(g[d > 0].sum()) for s, g, d in zip(samples, gates, gaps, strict=True) if s.advantage < 0)
    entropies = []
    for s in samples:
        batch = collate([s], 0)
        _, ent = Scorer(lm)(batch["input_ids"], batch["attention_mask"], batch["response_mask"], with_entropy=True)
        entropies.append(ent[batch["response_mask"] != 0])
    entropy, weight = torch.cat(entropies), torch.cat(gates)  # 9 tokens: the top 20% = the 2 largest entropies
    top = torch.topk(entropy, 2).indices
    model = Scorer(lm)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    res = train_update(
        model, opt, samples, plan_minibatches(3, 3, 1, 0), DistInfo(), weights=LossWeights(), micro_tokens=10_000,
        grad_clip=1.0, pad_id=0,
    )  # fmt: skip
    m = res.metrics
    assert m["opd/gate_mean"] == pytest.approx(total / 9, rel=1e-4)
    assert m["opd/neg_adv_push_frac"] == pytest.approx(harm / total, rel=1e-4)
    assert m["opd/high_entropy_push_frac"] == pytest.approx(float(weight[top].sum()) / total, rel=1e-4)
    assert m["opd/contrast_token_frac"] == pytest.approx(5 / 9)
    assert 0.0 < m["opd/high_entropy_push_frac"] < 1.0


def test_update_metrics_logs_leak_guarded_only_when_on():
    info = DistInfo()
    turn = SimpleNamespace(response_ids=[1], finish_reason="stop")
    episodes = [SimpleNamespace(won=False, invalid_turns=0, score=0.0, turns=[turn], group_id="g")]
    sample = SimpleNamespace(score=0.0, length=2, skill_length=3, has_skill=True, advantage=0.0)
    log = PhaseLog(info)
    log.timing["rollout"] = 1.0
    summary = {"success_rate": 0.0, "success_by_type": {}, "mean_length": 1.0, "invalid_rate": 0.0}
    for guard, expect in (("off", None), ("mask", 2)):
        ctx = SimpleNamespace(
            info=info, plan=Plan("static", None, 0.01, 5.0), hooks=EnvHooks(insert_skill=lambda p, s: p),
            cfg=RLConfig(leak_guard=guard),
        )  # fmt: skip
        scored = Rescored([sample], [], [], {}, 0.0, 0.0, 0, leak_guarded=2)
        record = update_metrics(
            ctx, 1, epoch=0, games=1, batch=Batch(episodes, ["s"], [None]), episode_summary=summary, scored=scored,
            result=UpdateResult({"opd/loss": 0.0}), sync={}, log=log, weights=LossWeights(),
        )  # fmt: skip
        assert record.get("skills/leak_guarded") == expect


def test_update_metrics_count_the_samples_and_groups_without_signal():
    # 3 groups: g0 won and lost (signal), g1 all lost, g2 all won; 2 of 5 samples have advantage 0
    info = DistInfo()
    turn = SimpleNamespace(response_ids=[1], finish_reason="stop")
    outcomes = [("g0", True), ("g0", False), ("g1", False), ("g1", False), ("g2", True)]
    episodes = [SimpleNamespace(won=w, invalid_turns=0, score=float(w), turns=[turn], group_id=g) for g, w in outcomes]
    samples = [
        SimpleNamespace(score=0.0, length=2, skill_length=0, has_skill=False, advantage=a)
        for a in (0.7, -0.7, 0.0, 0.0, 0.3)
    ]
    log = PhaseLog(info)
    log.timing["rollout"] = 1.0
    summary = {"success_rate": 0.4, "success_by_type": {}, "mean_length": 1.0, "invalid_rate": 0.0}
    ctx = SimpleNamespace(
        info=info, plan=Plan("none", None, 0.0, 5.0), hooks=EnvHooks(insert_skill=lambda p, s: p), cfg=RLConfig()
    )
    record = update_metrics(
        ctx, 1, epoch=0, games=3, batch=Batch(episodes, [None] * 5, [None] * 5), episode_summary=summary,
        scored=Rescored(samples, [], [], {}, 0.0, 0.0, 0), result=UpdateResult({}), sync={}, log=log,
        weights=LossWeights(),
    )  # fmt: skip
    assert record["adv/zero_frac"] == pytest.approx(2 / 5)
    assert record["adv/mixed_group_frac"] == pytest.approx(1 / 3)


def test_guard_options_keep_default_hashes():
    base = RLConfig()
    assert "leak_guard" not in base.hashed() and "opd_contrast" not in base.hashed()
    assert RLConfig(leak_guard="off", opd_contrast="none").config_hash() == base.config_hash()
    assert RLConfig(leak_guard="mask").config_hash() != base.config_hash()
    assert RLConfig(opd_contrast="shuffled").hashed()["opd_contrast"] == "shuffled"


# --------------------------------------------------------------------------------------------- seed inspect


def test_inspect_marks_leaked_spans_and_high_entropy_tokens(tmp_path):
    import io
    import json

    from rich.console import Console

    from seedcli.rl.inspect import HIGH_ENTROPY, LEAK_STYLE, render_sample, show_samples, skill_text

    rec = {
        "step": 1, "episode_id": "u0001-g000-r00", "task": "push the box", "category": "sokoban", "won": False,
        "skill": "Push up up left left to win.", "skill_leaks": [[5, 22]], "leak_guard": "mask",
        "entropy_threshold": 1.5, "opd_beta": 5.0,
        "turns": [{
            "turn": 1, "action": "up", "valid": True, "advantage": -0.5, "tokens": ["<a>", "up", "</a>"],
            "old_logp": [-1.0, -2.0, -0.5], "skill_logp": [-0.5, -3.0, -0.5], "shift": [0.5, -1.0, 0.0],
            "gate": [0.92, 0.01, 0.5], "entropy": [0.2, 1.5, 2.0],
        }],
    }  # fmt: skip
    text = skill_text(rec["skill"], rec["skill_leaks"])
    assert [(s.start, s.end, str(s.style)) for s in text.spans] == [(5, 22, LEAK_STYLE)]
    body = render_sample(rec)[2]  # the panel, the turn line, then the turn's tokens
    underlined = [body.plain[s.start : s.end] for s in body.spans if HIGH_ENTROPY in str(s.style)]
    assert underlined == ["up", "</a>"]  # entropy 1.5 and 2.0 are ≥ the threshold, 0.2 is not
    (tmp_path / "samples.jsonl").write_text(json.dumps(rec) + "\n")
    buf = io.StringIO()
    show_samples(tmp_path, 1, Console(file=buf, width=200, force_terminal=True, color_system="truecolor"))
    out = buf.getvalue()
    assert "1 leaked span(s)" in out and "high-entropy tokens 2/3" in out and "entropy ≥ 1.500" in out
