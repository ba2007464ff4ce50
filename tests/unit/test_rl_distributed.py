"""Two CPU ranks (gloo) train exactly what one process trains, with DDP and with FSDP2 (the GPU code path in fp32):
gradients are averaged over the ranks' shares of each mini-batch (including a mini-batch where one rank has nothing),
DDP ranks end bit-identical, and an FSDP checkpoint restores the sharded optimizer state exactly."""

import os
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from seedcli.rl.batching import plan_minibatches, rank_indices
from seedcli.rl.checkpoint import load_optimizer_and_rng, save_checkpoint
from seedcli.rl.distributed import (
    DistInfo,
    all_gather_object,
    full_state_dict,
    gradient_sync,
    param_digest,
    torchrun_command,
    wrap_for_training,
)
from seedcli.rl.logprobs import Scorer, score_responses
from seedcli.rl.optimize import LossWeights, train_update

torch.set_num_threads(1)
transformers = pytest.importorskip("transformers")

N_SAMPLES = 5  # mini-batch 2 → the last mini-batch has one sample: rank 1 trains on a zero-weight dummy there


def _setup():
    from tests.unit.test_rl_trainer import make_samples, rescored, tiny_lm

    lm = tiny_lm(0)
    samples = rescored(lm, make_samples(N_SAMPLES), ref=tiny_lm(1))
    return lm, samples


def _train(lm, samples, info):
    model = wrap_for_training(Scorer(lm), info)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    plan = plan_minibatches(len(samples), mini_batch=2, world=info.world, seed=0)
    # micro_tokens 1: every sample is its own micro-batch, so one process and two ranks average the same gradients
    res = train_update(model, opt, samples, plan, info, weights=LossWeights(), micro_tokens=1, grad_clip=1.0, pad_id=0)
    return res, plan


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    out = Path(out_dir)

    # DDP
    info = DistInfo(rank=rank, world=world, backend="gloo")
    lm, samples = _setup()
    res, plan = _train(lm, samples, info)
    digests = all_gather_object(param_digest(lm), info)
    torch.save(
        {"state": lm.state_dict(), "metrics": res.metrics, "digests": digests, "mine": rank_indices(plan, rank)},
        out / f"ddp{rank}.pt",
    )

    # FSDP2 (fp32 on CPU: the GPU code path without bf16), after a no-grad forward through the sharded model as
    # re-scoring does, then a checkpoint and an optimizer restore into a fresh sharded model
    info = DistInfo(rank=rank, world=world, backend="gloo", fsdp=True)
    lm, samples = _setup()
    model = wrap_for_training(Scorer(lm), info)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    with torch.no_grad():
        score_responses(model, [(samples[0].prompt_ids, samples[0].response_ids)], max_tokens=512, pad_id=0)
    plan = plan_minibatches(len(samples), mini_batch=2, world=world, seed=0)
    res = train_update(model, opt, samples, plan, info, weights=LossWeights(), micro_tokens=1, grad_clip=1.0, pad_id=0)
    full = full_state_dict(lm)
    ckpt = save_checkpoint(out / "ckpt", 1, lm=lm, tokenizer=_StubTokenizer(), optimizer=opt, train_module=model,
                           info=info, state={})  # fmt: skip
    lm2 = transformers.AutoModelForCausalLM.from_pretrained(ckpt / "model", dtype=torch.float32)
    model2 = wrap_for_training(Scorer(lm2), info)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2, weight_decay=0.01)
    load_optimizer_and_rng(ckpt, opt2, model2, info)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True)
    restored = [get_optimizer_state_dict(m, o, options=opts) for m, o in ((model, opt), (model2, opt2))]
    torch.save(
        {"state": full, "metrics": res.metrics, "optim": restored, "reloaded": full_state_dict(lm2)},
        out / f"fsdp{rank}.pt",
    )
    dist.barrier()  # as distributed.shutdown: no rank tears gloo down while its peer is still talking
    dist.destroy_process_group()


class _StubTokenizer:
    def save_pretrained(self, path):
        (Path(path) / "tokenizer_config.json").write_text("{}")


@pytest.mark.slow
def test_two_ranks_match_one_process(tmp_path):
    lm, samples = _setup()
    res, _ = _train(lm, samples, DistInfo())
    single = lm.state_dict()

    init_file = tempfile.mktemp(dir=tmp_path)
    mp.spawn(_worker, args=(2, init_file, str(tmp_path)), nprocs=2, join=True)
    r0 = torch.load(tmp_path / "ddp0.pt", weights_only=False)
    r1 = torch.load(tmp_path / "ddp1.pt", weights_only=False)

    # DDP: bit-identical weights on both ranks, and the same update as one process
    assert r0["digests"][0] == r0["digests"][1] == r1["digests"][0]
    assert sorted(r0["mine"] + r1["mine"]) == list(range(N_SAMPLES)) and r0["mine"] and r1["mine"]
    for k, v in single.items():
        torch.testing.assert_close(r0["state"][k], v, atol=2e-6, rtol=1e-5)
    for key in ("actor/pg_loss", "actor/kl", "actor/kl_max", "actor/entropy", "opd/loss", "actor/grad_norm"):
        assert r0["metrics"][key] == pytest.approx(res.metrics[key], rel=1e-4, abs=1e-6), key
    assert r0["metrics"]["actor/optimizer_steps"] == 3.0

    # FSDP: the gathered weights and the grad norm (every parameter, embeddings included) match one process
    f0 = torch.load(tmp_path / "fsdp0.pt", weights_only=False)
    f1 = torch.load(tmp_path / "fsdp1.pt", weights_only=False)
    for k, v in single.items():
        if k in f0["state"]:
            torch.testing.assert_close(f0["state"][k], v, atol=1e-5, rtol=1e-4)  # reduce-scatter order
            assert torch.equal(f0["state"][k], f1["state"][k])
            assert torch.equal(f0["reloaded"][k], f0["state"][k])  # the HF checkpoint holds the trained weights
    for key in ("actor/pg_loss", "actor/kl", "actor/kl_max", "opd/loss", "actor/grad_norm"):
        assert f0["metrics"][key] == pytest.approx(res.metrics[key], rel=1e-4, abs=1e-6), key
    # the optimizer state restored from the sharded (DCP) checkpoint equals the one that was saved
    saved, loaded = f0["optim"]
    assert saved["state"].keys() == loaded["state"].keys() and len(saved["state"]) == len(single) - 1  # lm_head tied
    for name, st in saved["state"].items():
        for field in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(torch.as_tensor(st[field]), torch.as_tensor(loaded["state"][name][field])), (name, field)


def test_gradient_sync_is_a_no_op_without_a_wrapper():
    m = torch.nn.Linear(2, 2)
    with gradient_sync(m, enabled=False):
        m(torch.ones(1, 2)).sum().backward()
    assert m.weight.grad is not None


def test_torchrun_command():
    cmd = torchrun_command(2, Path("runs/rl/x"))
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--nproc-per-node", "2"]
    assert "--standalone" in cmd and cmd[-3:] == ["seedcli.stages.rl", "--worker", "runs/rl/x"]
    cmd = torchrun_command(8, Path("r"), "--nnodes 2 --node-rank 1 --rdzv-endpoint h:29500")
    assert "--standalone" not in cmd and cmd[5:11] == [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--rdzv-endpoint",
        "h:29500",
    ]


def test_single_process_collectives_are_identity():
    info = DistInfo()
    assert not info.enabled and info.is_main
    assert all_gather_object({"a": 1}, info) == [{"a": 1}]
    os.environ.pop("RANK", None)
