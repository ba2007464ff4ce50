"""Process groups, data-parallel wrapping and collectives for `seed rl` (docs/design.md §5).

- CPU, one process: no process group; every collective here is the identity.
- CPU, `--nproc N`: N processes under torchrun, gloo, DDP over the actor (gradients averaged across ranks).
- GPU, `--gpus N`: N processes under torchrun (one in-process rank for N = 1), NCCL, FSDP2 (`fully_shard`) over
  the actor and the reference; each rank runs its own colocated rollout engine.

`seed rl --gpus N` / `--nproc N` re-launches itself as `python -m torch.distributed.run ... -m seedcli.stages.rl
--worker RUN_DIR`; multi-node runs pass torchrun's rendezvous options through `torchrun_args`.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

# Rollouts on one rank can take many minutes while the others wait in a collective; past this a hang is an error.
# `seed rl collective_timeout_min=...` sets it per run.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)


@dataclass
class DistInfo:
    """Where this process sits: rank, world size, device, and how the actor is parallelised."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None  # None: no process group
    fsdp: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.backend is not None and dist.is_available() and dist.is_initialized()


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(
    use_cuda: bool, fsdp: bool | None = None, timeout: datetime.timedelta = COLLECTIVE_TIMEOUT
) -> DistInfo:
    """Join the torchrun group (gloo on CPU, NCCL on GPU). `fsdp` (default: on GPU) shards the actor with FSDP2,
    else several ranks use DDP. A lone FSDP process gets a one-rank group, so FSDP runs the same code on one GPU as
    on eight; a lone DDP process gets no group. FSDP on CPU (gloo, fp32) runs the GPU code path where tests can."""
    fsdp = use_cuda if fsdp is None else fsdp
    if launched_by_torchrun():
        rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    elif fsdp:
        rank, world, local = 0, 1, 0
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    else:
        return DistInfo()
    if use_cuda:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {"backend": backend, "timeout": timeout}
        if use_cuda:
            kwargs["device_id"] = device
        dist.init_process_group(**kwargs)
    return DistInfo(rank=rank, world=world, local_rank=local, device=device, backend=backend, fsdp=fsdp)


def shutdown(info: DistInfo) -> None:
    if info.enabled:
        with contextlib.suppress(Exception):
            dist.barrier()
        dist.destroy_process_group()


# --------------------------------------------------------------------------------------------- collectives


def all_gather_object(obj: Any, info: DistInfo) -> list[Any]:
    """Every rank's `obj`, in rank order (pickled; for episodes, skills and small metric dicts)."""
    if not info.enabled or info.world == 1:
        return [obj]
    out: list[Any] = [None] * info.world
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, info: DistInfo, src: int = 0) -> Any:
    if not info.enabled or info.world == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_reduce_(tensor: torch.Tensor, info: DistInfo, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce (sum or max) of a tensor on this rank's device."""
    if info.enabled and info.world > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return tensor


def max_over_ranks(n: int, info: DistInfo) -> int:
    """The largest `n` over all ranks (every rank calls it): how many forwards each rank must run in a pass."""
    if not info.enabled or info.world == 1:
        return n
    t = torch.tensor([n], dtype=torch.int64, device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def barrier(info: DistInfo) -> None:
    if info.enabled and info.world > 1:
        dist.barrier()


# --------------------------------------------------------------------------------------------- wrapping


def wrap_for_training(module: torch.nn.Module, info: DistInfo) -> torch.nn.Module:
    """DDP (CPU, several ranks) or FSDP2 (GPU) around a scorer module; unchanged for a lone CPU process.

    FSDP2 shards each decoder layer and puts the remaining parameters (embeddings, final norm, lm_head — tied or not)
    in the root group, which the scorer's forward gathers: so the whole forward must go through the returned module.
    """
    if info.fsdp:
        return _fully_shard(module, trainable=True, bf16=info.device.type == "cuda")
    if info.enabled and info.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(module)
    return module


def wrap_frozen(module: torch.nn.Module, info: DistInfo) -> torch.nn.Module:
    """The reference model: sharded like the actor under FSDP (no optimizer), else unchanged."""
    if info.fsdp:
        return _fully_shard(module, trainable=False, bf16=info.device.type == "cuda")
    return module


def _fully_shard(module: torch.nn.Module, trainable: bool, bf16: bool) -> torch.nn.Module:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # GPU: bf16 compute with fp32 master weights and fp32 gradient reduction (halves activation memory and
    # all-gather traffic; the optimizer still updates fp32 weights). CPU: fp32 throughout.
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    )
    lm = getattr(module, "lm", module)
    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    inner = base.model
    # a vision-language model: the text stack's layers and the vision tower's blocks
    layers = list(inner.layers) if hasattr(inner, "layers") else list(inner.language_model.layers)
    if hasattr(inner, "visual"):
        layers += list(inner.visual.blocks)
    for layer in layers:
        fully_shard(layer, mp_policy=mp, reshard_after_forward=True)
    fully_shard(module, mp_policy=mp, reshard_after_forward=not trainable)
    return module


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The module inside DDP (FSDP2 modifies modules in place, so there is nothing to unwrap)."""
    return (
        module.module
        if hasattr(module, "module") and isinstance(module, torch.nn.parallel.DistributedDataParallel)
        else module
    )


def reshard(module: torch.nn.Module) -> None:
    """Under FSDP2, free the unsharded parameters a forward left behind (the root keeps them after forward, and a
    no-grad forward has no backward to reshard them) and register the sharded ones the optimizer holds; else a no-op."""
    if hasattr(module, "reshard") and hasattr(module, "unshard"):
        module.reshard()


@contextlib.contextmanager
def gradient_sync(model: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Accumulate locally (no all-reduce / reduce-scatter) when `enabled` is False: the micro-batches of a
    mini-batch sync only on their last backward."""
    if enabled:
        yield
        return
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        with model.no_sync():
            yield
        return
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
        return
    yield


def full_state_dict(
    module: torch.nn.Module, to_cpu: bool = True, keep: bool = True, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """The module's full (unsharded) state dict; under FSDP each DTensor is gathered in turn (a collective: every rank
    must call this). `keep=False` takes part in the gathers but keeps nothing (ranks that do not write the file).
    `dtype` casts floating tensors (each right after its gather, so the fp32 copy never accumulates)."""
    from torch.distributed.tensor import DTensor

    out: dict[str, torch.Tensor] = {}
    for name, value in module.state_dict().items():
        if isinstance(value, DTensor):
            value = value.full_tensor()
        if keep:
            value = value.detach()
            if dtype is not None and value.is_floating_point():
                value = value.to(dtype)
            out[name] = value.cpu() if to_cpu else value
    return out


def iter_full_params(module: torch.nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of every parameter and buffer of the state dict, one at a time, in `dtype`: under FSDP
    each shard is cast first (bf16: half the bytes of an fp32 gather, the same bits as casting after it) and
    gathered when the consumer asks for it, so at most one full parameter exists at a time (a collective: every rank
    must consume the whole stream in the same order). Names that share one parameter (a tied lm_head) are gathered
    once and yielded together, at the first name's place."""
    from torch.distributed.tensor import DTensor

    state = module.state_dict()
    # which names share a tensor: the module's own parameter objects (the same on every rank, so every rank skips
    # the same gathers); state_dict() detaches, so its values cannot tell
    owner = {
        name: id(t)
        for name, t in (*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False))
    }
    aliases: dict[object, list[str]] = {}
    for name in state:
        aliases.setdefault(owner.get(name, name), []).append(name)
    for name, value in state.items():
        names = aliases.pop(owner.get(name, name), None)
        if names is None:  # yielded with the first name of its tensor
            continue
        value = value.detach()
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)  # a DTensor casts its local shard
        if isinstance(value, DTensor):
            value = value.full_tensor()
        for alias in names:
            yield alias, value


def param_digest(module: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes in name order: equal digests on two ranks mean bit-identical weights."""
    h = hashlib.sha256()
    for name, p in sorted(unwrap(module).named_parameters(), key=lambda kv: kv[0]):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------- launching


def torchrun_command(
    nproc: int, run_dir: Path, torchrun_args: str | None = None, module: str = "seedcli.stages.rl"
) -> list[str]:
    """`python -m torch.distributed.run ... -m MODULE --worker RUN_DIR`: the one launcher of the stages that train on
    several processes (rl's ranks, and sft's with `module="seedcli.stages.sft_train"`); without rendezvous options
    it is a standalone job on this node."""
    extra = shlex.split(torchrun_args) if torchrun_args else ["--standalone"]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        *extra,
        "-m",
        module,
        "--worker",
        str(run_dir),
    ]


def launch(cmd: Sequence[str], env: dict[str, str] | None = None) -> int:
    """Run the torchrun job in the foreground; Ctrl-C / SIGTERM reach the workers through their process group."""
    proc = subprocess.Popen(list(cmd), env={**os.environ, **(env or {})})
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        raise
