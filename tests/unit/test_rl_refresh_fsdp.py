"""The streamed refresh's gathers under FSDP2 over gloo (two CPU ranks): each shard is cast to the engine's dtype
before it is gathered (half the bytes of an fp32 gather, the same bits as casting after it), and a tied lm_head is
gathered once with the embedding it shares."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from seedcli.rl.distributed import DistInfo, iter_full_params, wrap_for_training
from seedcli.rl.logprobs import Scorer
from tests.helpers_models import tiny_lm

torch.set_num_threads(1)


@contextlib.contextmanager
def counting_gathers():
    """Record (dtype, bytes) of every DTensor.full_tensor() (an all-gather under FSDP)."""
    calls: list[tuple[torch.dtype, int]] = []
    original = DTensor.full_tensor

    def full_tensor(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        calls.append((out.dtype, out.numel() * out.element_size()))
        return out

    DTensor.full_tensor = full_tensor
    try:
        yield calls
    finally:
        DTensor.full_tensor = original


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    info = DistInfo(rank=rank, world=world, backend="gloo", fsdp=True)
    result = {}
    for tie in (True, False):
        lm = tiny_lm(0, tie=tie)
        wrap_for_training(Scorer(lm), info)
        state = lm.state_dict()
        assert all(isinstance(v, DTensor) for v in state.values())
        with counting_gathers() as before:  # what the refresh did: every name gathered in fp32, then cast
            old = {name: v.full_tensor().to(torch.bfloat16) for name, v in state.items()}
        with counting_gathers() as after:
            new = list(iter_full_params(lm, dtype=torch.bfloat16))
        streamed = dict(new)
        result[tie] = {
            "names": [name for name, _ in new],
            "state_names": list(state),
            "bitwise": all(torch.equal(streamed[k].view(torch.int16), old[k].view(torch.int16)) for k in old),
            "one_tensor": streamed["lm_head.weight"] is streamed["model.embed_tokens.weight"],
            "before": before,
            "after": after,
            "numel": {name: v.numel() for name, v in state.items()},
        }
    torch.save(result, Path(out_dir) / f"r{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp_refresh_gathers_each_storage_once_in_the_engine_dtype(tmp_path):
    init_file = tempfile.mktemp(dir=tmp_path)
    mp.spawn(_worker, args=(2, init_file, str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        res = torch.load(tmp_path / f"r{rank}.pt", weights_only=False)
        for tie, r in res.items():
            # the same names and, after the cast, the same bits as gathering in fp32 and casting then
            assert sorted(r["names"]) == sorted(r["state_names"]) and len(r["names"]) == len(r["state_names"])
            assert r["bitwise"]
            numel = r["numel"]
            unique = sum(numel.values()) - (numel["lm_head.weight"] if tie else 0)
            # before: one fp32 gather per name, the tied embedding twice
            assert [d for d, _ in r["before"]] == [torch.float32] * len(numel)
            assert sum(b for _, b in r["before"]) == 4 * sum(numel.values())
            # now: one bf16 gather per tensor, the tied lm_head none of its own
            assert [d for d, _ in r["after"]] == [torch.bfloat16] * (len(numel) - tie)
            assert sum(b for _, b in r["after"]) == 2 * unique
            assert r["one_tensor"] == tie
            if tie:  # yielded beside the embedding, so no second full copy is held while the rest streams
                i = r["names"].index("model.embed_tokens.weight")
                assert r["names"][i + 1] == "lm_head.weight"
            else:
                assert r["names"] == r["state_names"]  # untied: the state dict's order, unchanged
