"""The update on re-scored turn-samples: collation (advantage broadcast, OPD mask), mini-batch plans, one update on a
tiny model against hand-computable values, non-finite handling, and checkpoint round trips."""

import random

import pytest
import torch

from seedcli.rl.batching import collate, plan_minibatches, rank_indices
from seedcli.rl.checkpoint import latest_checkpoint, load_optimizer_and_rng, read_checkpoint_state, save_checkpoint
from seedcli.rl.distributed import DistInfo
from seedcli.rl.logprobs import Scorer
from seedcli.rl.optimize import LossWeights, NonFiniteGuard, TrainingStopped, train_update
from seedcli.rl.rescore import rescore_samples
from seedcli.rl.samples import TurnSample
from tests.helpers_models import tiny_lm as helpers_tiny_lm

torch.set_num_threads(1)
transformers = pytest.importorskip("transformers")

VOCAB = 97


def tiny_lm(seed: int = 0):
    return helpers_tiny_lm(seed, vocab=VOCAB)


def make_samples(n: int = 6, seed: int = 0, skill_every: int = 2) -> list[TurnSample]:
    g = random.Random(seed)
    out = []
    for i in range(n):
        p = [g.randrange(2, VOCAB) for _ in range(g.randrange(3, 9))]
        r = [g.randrange(2, VOCAB) for _ in range(g.randrange(1, 5))]
        skill = [1, *p[:2], 50, 51, *p[2:]] if i % skill_every == 0 else None
        out.append(TurnSample(i // 2, i % 2, f"g{i // 3}", p, r, skill, 0.0, advantage=(-1.0) ** i * (1 + i / 10)))
    return out


def rescored(lm, samples, teacher=True, ref=None):
    rescore_samples(samples, old_fn=Scorer(lm), ref_fn=Scorer(ref or lm), teacher=teacher, max_tokens=256, pad_id=0)
    return samples


# --------------------------------------------------------------------------------------------- batching


def test_collate_broadcasts_advantage_and_masks():
    s = make_samples(2)
    for x in s:
        x.old_logp = torch.full((len(x.response_ids),), -1.0)
        x.ref_logp = torch.full((len(x.response_ids),), -2.0)
    s[0].skill_logp = torch.full((len(s[0].response_ids),), -0.5)
    b = collate(s, pad_id=0)
    for row, x in enumerate(s):
        p, r = len(x.prompt_ids), len(x.response_ids)
        assert b["input_ids"][row, : p + r].tolist() == x.prompt_ids + x.response_ids
        assert b["attention_mask"][row].sum() == p + r
        assert b["response_mask"][row].nonzero().flatten().tolist() == list(range(p, p + r))
        # the sample's advantage on every response token, nothing elsewhere
        assert b["advantages"][row, p : p + r].tolist() == pytest.approx([x.advantage] * r)
        assert b["advantages"][row].abs().sum() == pytest.approx(abs(x.advantage) * r)
        assert b["old_logp"][row, p : p + r].tolist() == [-1.0] * r
    p0, r0 = len(s[0].prompt_ids), len(s[0].response_ids)
    assert b["opd_mask"][0].nonzero().flatten().tolist() == list(range(p0, p0 + r0))
    assert b["opd_mask"][1].sum() == 0  # no valid skill: no OPD on its tokens


def test_plan_minibatches_covers_every_sample_once():
    plan = plan_minibatches(11, mini_batch=4, world=2, seed=0)
    assert [sum(len(share) for share in mb) for mb in plan] == [4, 4, 3]
    flat = [i for mb in plan for share in mb for i in share]
    assert sorted(flat) == list(range(11))
    assert [len(share) for share in plan[-1]] == [2, 1]
    assert sorted(rank_indices(plan, 0) + rank_indices(plan, 1)) == list(range(11))
    assert plan_minibatches(11, 4, 2, seed=0) == plan and plan_minibatches(11, 4, 2, seed=1) != plan


# --------------------------------------------------------------------------------------------- update


def test_one_update_at_ratio_one_by_hand():
    lm = tiny_lm()
    samples = rescored(lm, make_samples(6))
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    model = Scorer(lm)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    plan = plan_minibatches(len(samples), mini_batch=6, world=1, seed=0)  # one mini-batch → one step at θ = π_old
    res = train_update(
        model, opt, samples, plan, DistInfo(), weights=LossWeights(), micro_tokens=10_000, grad_clip=1.0, pad_id=0
    )
    n_tok = sum(len(s.response_ids) for s in samples)
    # ratio = 1 everywhere: the PPO loss is −(token mean of A); θ = ref: KL = 0; nothing clipped
    expected_pg = -sum(s.advantage * len(s.response_ids) for s in samples) / n_tok
    assert res.metrics["actor/pg_loss"] == pytest.approx(expected_pg, rel=1e-5)
    assert res.metrics["actor/kl"] == pytest.approx(0.0, abs=1e-6)
    assert res.metrics["actor/clip_frac"] == 0.0
    assert res.metrics["actor/entropy"] > 0
    assert res.tokens == n_tok and res.optimizer_steps == 1 and not res.skipped
    # OPD at θ = π_old: Δ = ℓ_skill − ℓ_old per token, gate σ(5Δ), loss = mean g·Δ over tokens with a skill
    with_skill = [s for s in samples if s.skill_logp is not None]
    deltas = torch.cat([s.skill_logp - s.old_logp for s in with_skill])
    gates = torch.sigmoid(5 * deltas)
    assert res.metrics["opd/loss"] == pytest.approx(float((gates * deltas).mean()), rel=1e-4, abs=1e-6)
    assert res.metrics["opd/gate_mean"] == pytest.approx(float(gates.mean()), rel=1e-5)
    assert res.metrics["opd/delta_mean"] == pytest.approx(float(deltas.mean()), rel=1e-4, abs=1e-6)
    # each reply's largest |Δ|, averaged over the replies with a skill (not over tokens, not over all replies)
    absmax = [float((s.skill_logp - s.old_logp).abs().max()) for s in with_skill]
    assert 0 < len(with_skill) < len(samples)
    assert res.metrics["opd/delta_absmax"] == pytest.approx(sum(absmax) / len(absmax), rel=1e-4)
    assert res.metrics["opd/delta_absmax"] > abs(res.metrics["opd/delta_mean"])
    assert res.metrics["opd/token_frac"] == pytest.approx(len(deltas) / n_tok)
    assert res.metrics["opd/loss"] != 0.0
    assert any(not torch.equal(before[k], v) for k, v in lm.state_dict().items())
    assert res.metrics["actor/grad_norm"] > 0


def test_several_minibatches_step_several_times_and_clip_later():
    lm = tiny_lm()
    samples = rescored(lm, make_samples(8))
    model = Scorer(lm)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-2)
    plan = plan_minibatches(len(samples), mini_batch=2, world=1, seed=0)
    res = train_update(
        model, opt, samples, plan, DistInfo(), weights=LossWeights(), micro_tokens=16, grad_clip=1.0, pad_id=0
    )
    assert res.optimizer_steps == 4
    assert res.metrics["actor/kl"] > 0  # θ moved away from the reference after the first step
    assert res.metrics["actor/clip_frac"] > 0  # a large lr pushes later mini-batches' ratios past 1 ± ε


def test_grpo_weights_ignore_opd():
    lm = tiny_lm()
    samples = rescored(lm, make_samples(4), teacher=False)
    model = Scorer(lm)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    plan = plan_minibatches(4, 4, 1, 0)
    w = LossWeights(opd_coef=0.0)
    res = train_update(model, opt, samples, plan, DistInfo(), weights=w, micro_tokens=10_000, grad_clip=1.0, pad_id=0)
    assert (
        res.metrics["opd/loss"] == 0.0 and res.metrics["opd/token_frac"] == 0.0 and res.metrics["opd/gate_mean"] == 0.0
    )


def test_non_finite_loss_skips_the_step_and_names_the_cause():
    lm = tiny_lm()
    samples = rescored(lm, make_samples(4))
    plan = plan_minibatches(4, 2, 1, 0)
    bad = samples[plan[0][0][0]]  # a sample of the first mini-batch gets a NaN reference score
    bad.ref_logp = bad.ref_logp.clone()
    bad.ref_logp[0] = float("nan")
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    model = Scorer(lm)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    res = train_update(
        model, opt, samples, plan, DistInfo(), weights=LossWeights(), micro_tokens=10_000, grad_clip=1.0, pad_id=0
    )
    assert res.skipped and res.metrics["actor/skipped"] == 1.0
    assert "non-finite actor/kl" in res.cause and "mini-batch 1" in res.cause
    assert res.optimizer_steps == 0  # the update stopped at the bad mini-batch
    assert all(torch.equal(before[k], v) for k, v in lm.state_dict().items())
    assert not opt.state  # AdamW never stepped
    assert all(p.grad is None for p in model.parameters())


def test_guard_stops_after_three_in_a_row():
    g = NonFiniteGuard(limit=3)
    g.observe(1, True, "non-finite actor/kl")
    assert g.streak == 1
    g.observe(2, False, None)
    assert g.streak == 0
    g.at_end(2)  # the last update trained: the run may complete
    g.observe(3, True, "a")
    g.observe(4, True, "b")
    with pytest.raises(TrainingStopped, match=r"stopped at update 5: .*3 updates in a row \(3..5\); last cause: c"):
        g.observe(5, True, "c")


def test_a_run_whose_last_updates_were_skipped_does_not_complete():
    # rl lr=1e30 --steps 2 ended "complete" with update 2's loss NaN and exported the weights that made it NaN
    g = NonFiniteGuard(limit=3)
    g.observe(1, False, None)
    g.observe(2, True, "non-finite actor/pg_loss in mini-batch 1")
    with pytest.raises(TrainingStopped, match=r"stopped at update 2: the run ended with update 2 skipped .*pg_loss"):
        g.at_end(2)
    g.observe(3, True, "b")
    with pytest.raises(TrainingStopped, match=r"ended with updates 2..3 skipped .*last cause: b"):
        g.at_end(3)


def test_stall_watch_says_once_per_streak_of_updates_without_a_win():
    from seedcli.rl.metrics import StallWatch

    w = StallWatch(limit=3)
    won, lost = {"rollout/success_rate": 0.25}, {"rollout/success_rate": 0.0}
    said = [w.observe(step, rec) for step, rec in enumerate([won, won, lost, lost, lost, lost, won, lost], start=1)]
    assert [i + 1 for i, m in enumerate(said) if m] == [5]  # updates 3-5, once; the streak after update 7 is short
    assert said[4].startswith("updates 3-5 won no episode (the last won episode was in update 2)")
    assert "so they train next to nothing; the policy may have collapsed" in said[4]
    fresh = StallWatch(limit=2)
    fresh.observe(1, {"rollout/success_rate": 0.0, "opd/token_frac": 0.4})
    msg = fresh.observe(2, {"rollout/success_rate": 0.0, "opd/token_frac": 0.4})
    assert "(none won this session)" in msg and "(OPD still trains 40% of the response tokens)" in msg


# --------------------------------------------------------------------------------------------- checkpoints


class StubTokenizer:
    def save_pretrained(self, path):
        (path / "tokenizer_config.json").write_text("{}")


def test_checkpoint_round_trip(tmp_path):
    lm = tiny_lm()
    samples = rescored(lm, make_samples(4))
    model = Scorer(lm)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_update(
        model,
        opt,
        samples,
        plan_minibatches(4, 4, 1, 0),
        DistInfo(),
        weights=LossWeights(),
        micro_tokens=10_000,
        grad_clip=1.0,
        pad_id=0,
    )
    info = DistInfo()
    root = tmp_path / "checkpoints"
    torch.manual_seed(123)
    for step in (1, 2, 3):
        save_checkpoint(root, step, lm=lm, tokenizer=StubTokenizer(), optimizer=opt, train_module=model, info=info,
                        state={"sampler": {"position": 4 * step}}, keep=2)  # fmt: skip
    expected_next = torch.rand(3)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000002", "step_000003"]
    assert not list(root.glob(".tmp*"))
    ckpt = latest_checkpoint(root)
    assert ckpt.name == "step_000003" and (root / "latest").resolve() == ckpt
    assert read_checkpoint_state(ckpt) == {"step": 3, "sampler": {"position": 12}}
    assert (ckpt / "model" / "config.json").exists() and (ckpt / "model" / "tokenizer_config.json").exists()

    lm2 = transformers.AutoModelForCausalLM.from_pretrained(ckpt / "model", dtype=torch.float32)
    for (k, a), b in zip(lm.state_dict().items(), lm2.state_dict().values(), strict=False):
        assert torch.equal(a, b), k
    opt2 = torch.optim.AdamW(Scorer(lm2).parameters(), lr=1e-3)
    torch.manual_seed(999)
    load_optimizer_and_rng(ckpt, opt2, Scorer(lm2), info)
    assert torch.equal(torch.rand(3), expected_next)  # the RNG continues where the checkpoint left it
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert s1.keys() == s2.keys()
    for k in s1:
        assert torch.equal(s1[k]["exp_avg"], s2[k]["exp_avg"])


def test_latest_checkpoint_ignores_incomplete(tmp_path):
    root = tmp_path / "checkpoints"
    assert latest_checkpoint(root) is None
    (root / "step_000001").mkdir(parents=True)
    (root / "step_000001" / "state.json").write_text('{"step": 1}')
    (root / "step_000002").mkdir()  # no state.json: a half-written checkpoint
    assert latest_checkpoint(root).name == "step_000001"


# --------------------------------------------------------------------------------------------- old_logp reuse


def _update_once(samples, reuse: bool, micro_tokens: int = 24):
    """One single-mini-batch update of a fresh tiny model; ℓ_old re-scored, or (reuse) left for the update."""
    lm = tiny_lm()
    rescore_samples(
        samples,
        old_fn=None if reuse else Scorer(lm),
        teacher_fn=Scorer(lm),
        ref_fn=Scorer(tiny_lm(1)),
        teacher=True,
        max_tokens=256,
        pad_id=0,
    )
    model = Scorer(lm)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    plan = plan_minibatches(len(samples), mini_batch=len(samples), world=1, seed=0)
    res = train_update(
        model, opt, samples, plan, DistInfo(), weights=LossWeights(), micro_tokens=micro_tokens, grad_clip=1.0, pad_id=0
    )
    return lm, res


def test_old_logp_reuse_equals_the_rescored_update():
    """One optimizer step: ℓ_old from the update's own forward gives the re-scored update's loss, metrics and weights
    (the forwards run the same tensors; only the detached ℓ_old's origin differs), and fills each sample's ℓ_old."""
    rescored_samples, reused_samples = make_samples(6), make_samples(6)
    assert all(s.old_logp is None for s in reused_samples)
    lm_a, res_a = _update_once(rescored_samples, reuse=False)
    lm_b, res_b = _update_once(reused_samples, reuse=True)
    for key in ("actor/pg_loss", "actor/kl", "actor/entropy", "opd/loss", "opd/gate_mean", "actor/grad_norm"):
        assert res_b.metrics[key] == pytest.approx(res_a.metrics[key], rel=1e-5, abs=1e-7), key
    assert res_b.metrics["actor/ppo_kl"] == 0.0 and res_b.metrics["actor/clip_frac"] == 0.0  # the ratio is exactly 1
    for (name, a), b in zip(lm_a.state_dict().items(), lm_b.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
    for a, b in zip(rescored_samples, reused_samples, strict=True):
        assert b.old_logp is not None and b.old_logp.shape == (len(b.response_ids),)
        torch.testing.assert_close(b.old_logp, a.old_logp, rtol=1e-5, atol=1e-6)


def test_collate_refuses_a_micro_batch_that_mixes_reused_and_rescored():
    s = make_samples(2)
    s[0].old_logp = torch.zeros(len(s[0].response_ids))
    with pytest.raises(ValueError, match="mixes"):
        collate(s, pad_id=0)
    s[0].old_logp = None
    assert "old_logp" not in collate(s, pad_id=0)


def test_lr_warmup_rises_linearly_then_holds():
    from seedcli.rl.update import set_lr, warmup_lr

    assert [warmup_lr(3e-5, 3, k) for k in (1, 2, 3, 4, 10)] == pytest.approx([1e-5, 2e-5, 3e-5, 3e-5, 3e-5])
    assert warmup_lr(3e-5, 0, 1) == 3e-5
    opt = torch.optim.AdamW(tiny_lm().parameters(), lr=1.0)
    set_lr(opt, 2e-5)
    assert [g["lr"] for g in opt.param_groups] == [2e-5] * len(opt.param_groups)


def test_zero_adv_drop_keeps_the_samples_that_teach():
    from seedcli.rl.rescore import teaching_samples

    s = make_samples(6)  # samples 0, 2, 4 have a skill prompt
    for i in (1, 2, 3):
        s[i].advantage = 0.0
    assert teaching_samples(s, "keep") == [0, 1, 2, 3, 4, 5]
    assert teaching_samples(s, "drop") == [0, 2, 4, 5]  # 1 and 3: advantage 0, no OPD term; 2 keeps its OPD term


def test_opd_grad_share_on_the_log_probs_by_hand():
    """`opd/grad_share` (issue 61 §4): each term's gradient on ℓ_θ, by hand on one reply of two tokens. At ratio 1 the
    PPO term's gradient on token t is −A_t/n; the signed OPD term's is −c·clip(Δ_t)/n_opd. With A = (1, 1), n = 2:
    g_rest = (−0.5, −0.5), ‖g_rest‖ = √0.5; with Δ = (+0.6, −0.2), c = 1: g_opd = (−0.3, +0.1), ‖g_opd‖ = √0.1."""
    import math

    from seedcli.rl.losses import opd_loss, ppo_clip_loss
    from seedcli.rl.optimize import _grad_sq_on_logp, _share

    weights = torch.tensor([[0.0, 0.0]], requires_grad=True)
    logp = weights + torch.tensor([[-1.0, -2.0]])  # ℓ_θ as the model's output: a non-leaf with a graph behind it
    hooked = []
    logp.register_hook(lambda g: hooked.append(g))  # as FSDP2 hooks its root forward's output (an unshard)
    mask = torch.ones(1, 2)
    old, teacher = logp.detach(), logp.detach() + torch.tensor([[0.6, -0.2]])

    def opd_and_rest(lp):
        opd, _ = opd_loss(lp, teacher, mask, form="signed", clip=1.0)
        return 1.0 * opd, ppo_clip_loss(lp, old, torch.tensor([[1.0, 1.0]]), mask)

    sq_opd, sq_rest = _grad_sq_on_logp(logp, opd_and_rest)
    assert float(sq_rest) == pytest.approx(0.5)
    assert float(sq_opd) == pytest.approx(0.1)
    assert _share(float(sq_opd), float(sq_rest)) == pytest.approx(math.sqrt(0.1) / (math.sqrt(0.1) + math.sqrt(0.5)))
    # the measurement leaves the gradients, and the hooks on ℓ_θ, to the backward that follows: under FSDP2 a hook
    # fired per measurement is a collective that ranks with and without OPD tokens run unequally (a hang)
    assert weights.grad is None and hooked == []
    assert _share(0.0, 0.0) == 0.0 and _grad_sq_on_logp(logp.detach(), opd_and_rest) == (0.0, 0.0)
