"""Ranks with different numbers of micro-batches (and a rank with no teacher samples at all) under FSDP2 over gloo:
every pass must run the same number of forwards on every rank, or the collectives mismatch (gloo aborts, NCCL hangs).
And the loss is a token mean over the whole mini-batch across ranks, so the gradient of one update is the same for
one process and two, and for two micro-batch sizes (issue 11, findings 2 and 8)."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from seedcli.rl.batching import plan_micro_batches, plan_minibatches, rank_indices
from seedcli.rl.distributed import DistInfo, full_state_dict, max_over_ranks, wrap_for_training, wrap_frozen
from seedcli.rl.logprobs import Scorer
from seedcli.rl.losses import low_var_kl
from seedcli.rl.optimize import LossWeights, train_update
from seedcli.rl.rescore import rescore_samples
from seedcli.rl.samples import TurnSample
from tests.helpers_models import tiny_lm

torch.set_num_threads(1)

VOCAB = 97
N = 9  # as the review's reproduction: 9 turn-samples, 5 on rank 0 and 4 on rank 1
SMALL, LARGE = 38, 100_000  # micro-batch token budgets: SMALL packs rank 0's share into more micro-batches


def make_samples() -> list[TurnSample]:
    """Samples of very different lengths; only rank 0's share (under the 2-rank plan) has skill prompts."""
    plan = plan_minibatches(N, N, 2, seed=0)
    rank0 = set(plan[0][0])
    g = random.Random(3)
    out = []
    for i in range(N):
        p = [g.randrange(2, VOCAB) for _ in range(g.choice([3, 4, 12, 14]))]
        r = [g.randrange(2, VOCAB) for _ in range(g.randrange(1, 7))]
        skill = [1, *p[:2], 50, 51, *p[2:]] if i in rank0 and i % 2 == 0 else None
        out.append(TurnSample(i // 3, i % 3, f"g{i // 4}", p, r, skill, 0.0, advantage=(-1.0) ** i * (0.5 + i / 7)))
    return out


def weights() -> LossWeights:
    return LossWeights(kl_coef=0.1, entropy_coef=0.01, opd_coef=0.5)  # large enough that every term matters


def run_update(info: DistInfo, micro_tokens: int):
    """Rescore this rank's share with FSDP-synchronised pass counts, then one update with SGD(lr=1) so the weight
    change is exactly minus the gradient."""
    lm, ref_lm = tiny_lm(0, vocab=VOCAB), tiny_lm(1, vocab=VOCAB)
    model = wrap_for_training(Scorer(lm), info)
    ref = wrap_frozen(Scorer(ref_lm), info)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)  # before any forward: it must hold the sharded parameters
    samples = make_samples()
    plan = plan_minibatches(N, N, info.world, seed=0)
    mine = [samples[i] for i in rank_indices(plan, info.rank)]
    counts = rescore_samples(
        mine, old_fn=model, ref_fn=ref, teacher=True, max_tokens=micro_tokens, pad_id=0,
        sync_count=lambda n: max_over_ranks(n, info),
    )  # fmt: skip
    res = train_update(
        model, opt, samples, plan, info, weights=weights(), micro_tokens=micro_tokens, grad_clip=1e9, pad_id=0
    )
    return full_state_dict(lm), res, counts, [len(s.response_ids) for s in mine if s.skill_prompt_ids is not None]


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    info = DistInfo(rank=rank, world=world, backend="gloo", fsdp=True)
    state, res, counts, teacher = run_update(info, SMALL)
    torch.save({"state": state, "metrics": res.metrics, "counts": counts, "teacher": teacher}, Path(out_dir) / f"r{rank}.pt")
    dist.barrier()  # as distributed.shutdown: no rank tears gloo down while its peer is still talking
    dist.destroy_process_group()


def test_the_two_ranks_really_are_uneven():
    samples = make_samples()
    plan = plan_minibatches(N, N, 2, seed=0)
    a, b = (plan_micro_batches(samples, plan[0], r, SMALL) for r in (0, 1))
    assert len(a.micro) != len(b.micro) and a.n_micro == b.n_micro == max(len(a.micro), len(b.micro))
    assert any(samples[i].skill_prompt_ids for i in plan[0][0]) and not any(samples[i].skill_prompt_ids for i in plan[0][1])
    # the denominators are the whole mini-batch's token counts, the same on both ranks
    assert a.tokens == b.tokens == sum(len(s.response_ids) for s in samples)
    assert a.opd_tokens == sum(len(s.response_ids) for s in samples if s.skill_prompt_ids)


def test_gradient_does_not_depend_on_micro_batch_size():
    before = tiny_lm(0, vocab=VOCAB).state_dict()
    small, res_small, *_ = run_update(DistInfo(), SMALL)
    large, res_large, *_ = run_update(DistInfo(), LARGE)
    moved = 0
    for k, v in small.items():
        torch.testing.assert_close(v, large[k], atol=1e-6, rtol=1e-5)
        moved += int(not torch.equal(v, before[k]))
    assert moved > 0  # the update did something
    for key in ("actor/pg_loss", "actor/kl", "actor/kl_max", "actor/entropy", "opd/loss", "actor/grad_norm"):
        assert res_small.metrics[key] == pytest.approx(res_large.metrics[key], rel=1e-5, abs=1e-7), key


def test_kl_max_is_the_mean_over_replies_of_each_replys_largest_token_kl():
    """`actor/kl_max`: each reply's largest per-token KL(θ‖ref) at θ, averaged over the replies; `actor/kl` is the
    token mean, which a long reply around one deciding token dilutes."""
    info = DistInfo()
    model = wrap_for_training(Scorer(tiny_lm(0, vocab=VOCAB)), info)
    ref = wrap_frozen(Scorer(tiny_lm(1, vocab=VOCAB)), info)
    samples = make_samples()
    rescore_samples(samples, old_fn=model, ref_fn=ref, teacher=True, max_tokens=SMALL, pad_id=0)
    per_reply = [low_var_kl(s.old_logp, s.ref_logp) for s in samples]  # at θ: π_old is θ before the one step
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    res = train_update(
        model, opt, samples, plan_minibatches(N, N, 1, seed=0), info, weights=weights(), micro_tokens=SMALL,
        grad_clip=1e9, pad_id=0,
    )  # fmt: skip
    largest = [float(k.max()) for k in per_reply]
    assert res.metrics["actor/kl_max"] == pytest.approx(sum(largest) / N, rel=1e-4)
    assert res.metrics["actor/kl"] == pytest.approx(float(torch.cat(per_reply).mean()), rel=1e-4)
    assert res.metrics["actor/kl_max"] > res.metrics["actor/kl"] > 0


@pytest.mark.slow
def test_two_fsdp_ranks_with_uneven_passes_match_one_process(tmp_path):
    single, res, *_ = run_update(DistInfo(), SMALL)
    init_file = tempfile.mktemp(dir=tmp_path)
    mp.spawn(_worker, args=(2, init_file, str(tmp_path)), nprocs=2, join=True)  # a collective mismatch would abort
    r0, r1 = (torch.load(tmp_path / f"r{r}.pt", weights_only=False) for r in (0, 1))
    # rank 1 scored no teacher sample, yet both ran the same number of teacher forwards
    assert r0["teacher"] and not r1["teacher"]
    passes = ("old", "ref", "teacher")
    assert [r0["counts"][k] for k in passes] == [r1["counts"][k] for k in passes] and r0["counts"]["teacher"] >= 1
    assert r1["counts"]["padding"] >= r0["counts"]["teacher"]  # rank 1 padded every teacher forward
    for k, v in single.items():
        if k in r0["state"]:
            torch.testing.assert_close(r0["state"][k], v, atol=1e-5, rtol=1e-4)
            assert torch.equal(r0["state"][k], r1["state"][k])
    for key in ("actor/pg_loss", "actor/kl", "actor/kl_max", "actor/entropy", "opd/loss", "actor/grad_norm"):
        assert r0["metrics"][key] == pytest.approx(res.metrics[key], rel=1e-4, abs=1e-6), key
    # padding micro-batches / all micro-batches over both ranks; none on one process
    a, b = (plan_micro_batches(make_samples(), plan_minibatches(N, N, 2, seed=0)[0], r, SMALL) for r in (0, 1))
    expected = (2 * a.n_micro - len(a.micro) - len(b.micro)) / (2 * a.n_micro)
    assert expected > 0 and r0["metrics"]["actor/pad_forward_frac"] == pytest.approx(expected)
    assert res.metrics["actor/pad_forward_frac"] == 0.0


def test_bf16_checkpoint_keeps_fp32_master_weights_for_an_exact_resume(tmp_path):
    """On GPU checkpoints hold bf16 model weights (what eval and vLLM load; half the disk) and the fp32 master
    weights beside them, so a resume continues from exactly the weights that were trained."""
    import json

    import transformers

    from seedcli.rl.checkpoint import load_optimizer_and_rng, save_checkpoint

    class Tok:
        def save_pretrained(self, path):
            (Path(path) / "tokenizer_config.json").write_text("{}")

    lm = tiny_lm(0, vocab=VOCAB)
    with torch.no_grad():
        for p in lm.parameters():
            p.add_(1e-4 * torch.randn_like(p))  # values bf16 cannot hold exactly
    model = Scorer(lm)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ckpt = save_checkpoint(tmp_path, 1, lm=lm, tokenizer=Tok(), optimizer=opt, train_module=model, info=DistInfo(),
                           state={}, model_dtype=torch.bfloat16)  # fmt: skip
    assert json.loads((ckpt / "model" / "config.json").read_text())["dtype"] == "bfloat16"
    saved = transformers.AutoModelForCausalLM.from_pretrained(ckpt / "model")
    assert next(saved.parameters()).dtype == torch.bfloat16
    # a resumed trainer loads model/ (bf16) and then the fp32 master weights: bit-identical to what was trained
    lm2 = transformers.AutoModelForCausalLM.from_pretrained(ckpt / "model", dtype=torch.float32)
    differs = any(not torch.equal(a, b) for a, b in zip(lm2.state_dict().values(), lm.state_dict().values(), strict=True))
    assert differs  # bf16 alone would lose the low bits
    model2 = Scorer(lm2)
    load_optimizer_and_rng(ckpt, torch.optim.AdamW(model2.parameters(), lr=1e-6), model2, DistInfo())
    for k, v in lm.state_dict().items():
        assert torch.equal(lm2.state_dict()[k], v), k
