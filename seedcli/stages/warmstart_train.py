"""The warm start's training loop (`seed warmstart`, `seed model init --warm-start expert`): length-grouped batches,
the weighted next-token loss, AdamW with a warm-up and a cosine decay; in this process, or data-parallel on
`nproc` CPU processes under torchrun, started by the launcher sft and rl use (`rl.distributed`).

    python -m seedcli.stages.warmstart_train --worker DIR   # one rank (torchrun starts them; DIR/launch.json)
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from seedcli.errors import NonFiniteValue, UserError
from seedcli.precision import autocast
from seedcli.rl.batching import pack_in_order, pad_right
from seedcli.rl.distributed import DistInfo, all_reduce_, init_distributed, launch, shutdown, torchrun_command
from seedcli.rl.logprobs import sequence_logprobs
from seedcli.stages.demos import log

LAUNCH_FILE = "launch.json"
CURVE_FILE = "curve.json"
ERROR_FILE = "error.txt"  # a rank's NonFiniteValue, for the launcher to raise
PROGRESS_EVERY_S = 60.0  # a progress line at least this often (a CPU batch of 8k tokens takes ~30 s)


def batches(lengths: list[int], max_tokens: int, rng: random.Random) -> list[list[int]]:
    """Indices grouped by similar length (little padding), at most `max_tokens` padded tokens a batch, batch order
    shuffled: shortest first (ties in a seeded random order), packed by rl's packer (`pack_in_order`; rl's
    `pack_by_length` takes them longest first with ties by index, which would change the batches and so the
    weights)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    packed = pack_in_order(order, lengths, max_tokens)
    rng.shuffle(packed)
    return packed


def collate(examples, idx, pad_id: int, prompt_weight: float):
    """(ids [B, T], attention mask [B, T], loss weight of predicting token t [B, T]) of the examples `idx`, right-padded
    to the longest (`pad_right`): 1 on the response, `prompt_weight` on the prompt after its first token."""
    ids, attn = pad_right([examples[i][0] + examples[i][1] for i in idx], pad_id)
    weight = torch.zeros(ids.shape, dtype=torch.float32)
    for row, i in enumerate(idx):
        p, r = examples[i]
        weight[row, 1 : len(p)] = prompt_weight
        weight[row, len(p) : len(p) + len(r)] = 1.0
    return ids, attn, weight


def loss_denominator(weight) -> float:
    """What `batch_loss` divides by: the loss weight of the batch (response tokens only without prompt weight)."""
    if bool((weight[weight != 1.0] != 0).any()):
        return float(weight[:, 1:].sum())  # the weights of the predicted tokens (weight[:, 0] is 0)
    return float((weight == 1.0).sum())


def batch_loss(model, ids, attn, weight, denominator: float | None = None):
    """(weighted loss, response-token NLL sum, response tokens) of one batch. Without prompt weight only the
    response positions get logits (rl/logprobs.py: chunked, fp32), not a [B, T, vocab] tensor. `denominator`
    (data-parallel ranks: the whole batch's `loss_denominator`) replaces this share's own, so that the ranks' summed
    gradients are the gradient of the whole batch's loss. Both divide by a 0-dim fp32 tensor: a Python float would
    take torch's scalar path, whose rounding differs (the warm start's stored checksums hold the tensor one)."""
    resp = (weight == 1.0).float()  # [B, T]: response tokens
    if not bool((weight[weight != 1.0] != 0).any()):
        logp = sequence_logprobs(model, ids, attn, resp)  # [B, T] fp32, 0 off the response
        nll_sum = -(logp * resp).sum()
        n = resp.sum()
        return nll_sum / _denominator(n, denominator), float(nll_sum.detach()), float(n)
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()  # [B, T-1, V]
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # [B, T-1]
    w = weight[:, 1:]
    resp = (w == 1.0).float()
    loss = (nll * w).sum() / _denominator(w.sum(), denominator)
    return loss, float((nll.detach() * resp).sum()), float(resp.sum())


def _denominator(local: torch.Tensor, whole: float | None) -> torch.Tensor:
    """This share's own weight (a 0-dim fp32 tensor, at least 1), or the whole batch's as such a tensor."""
    if whole is None:
        return local.clamp(min=1.0)
    return torch.tensor(max(whole, 1.0), dtype=torch.float32)


def warmup_cosine(lr: float, total: int):
    """step -> lr: a linear warm-up over the first 5% of `total` steps, then a cosine decay to 10% of `lr`."""
    warmup = max(1, total // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    return lr_at


def train_clone(
    model,
    examples: list,
    epochs: int,
    seed: int,
    *,
    lr: float,
    batch_tokens: int,
    prompt_weight: float,
    pad_id: int,
    dtype: str = "float32",
    info: DistInfo | None = None,
) -> list[dict]:
    """`epochs` epochs of AdamW over `examples` (prompt ids, response ids) in length-grouped batches of at most
    `batch_tokens` padded tokens, lr with a linear warm-up and a cosine decay to 10%; returns the loss curve (one
    entry per batch). `dtype` bfloat16: the matmuls under bf16 autocast (the weights and AdamW state stay fp32).
    With `info` (torchrun ranks) every rank plans the same batches and takes every world-th example of each; the
    loss is divided by the whole batch's weight and the gradients summed over ranks, so the step is the one a
    single process takes on the whole batch (up to the order of float sums) and the ranks' weights stay equal."""
    rank, world = (info.rank, info.world) if info is not None and info.enabled else (0, 1)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    lengths = [len(p) + len(r) for p, r in examples]
    plan = [batches(lengths, batch_tokens, rng) for _ in range(epochs)]
    total = sum(len(b) for b in plan)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    lr_at = warmup_cosine(lr, total)
    model.train()
    curve: list[dict] = []
    step = 0
    t_train = t_logged = time.time()
    for epoch in range(epochs):
        for idx in plan[epoch]:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
            optimizer.zero_grad(set_to_none=True)
            loss, nll, ntok = _share_backward(model, examples, idx[rank::world], info, pad_id, prompt_weight, dtype)
            if world > 1:
                _sum_gradients(params, info)
                totals = all_reduce_(torch.tensor([loss, nll, ntok], dtype=torch.float64), info)
                loss, nll, ntok = (float(x) for x in totals)
            row = {"step": step + 1, "epoch": epoch + 1, "response_nll": nll / max(ntok, 1.0), "loss": loss}
            where = f"the warm start, batch {step + 1} of {total} (epoch {epoch + 1})"
            if not math.isfinite(loss):  # every rank holds the summed loss: all stop together
                raise NonFiniteValue(
                    f"{where}: the loss is {loss}; nothing is exported: start it again with a lower lr (now {lr:g})",
                    [*curve, row],
                )
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            if not all(bool(torch.isfinite(p).all()) for p in params):  # the ranks' weights are equal
                raise NonFiniteValue(
                    f"{where}: the weights are non-finite (nan or inf) after the optimizer step at lr "
                    f"{lr_at(step):g}; nothing is exported: start it again with a lower lr",
                    [*curve, row],
                )
            step += 1
            curve.append(row)
            now = time.time()
            if rank == 0 and (step % 20 == 0 or step == total or now - t_logged >= PROGRESS_EVERY_S):
                t_logged = now
                recent = curve[-20:]
                mean = sum(c["response_nll"] for c in recent) / len(recent)
                eta = (now - t_train) / step * (total - step)
                log(
                    f"epoch {epoch + 1}/{epochs} batch {step}/{total}: response NLL {mean:.3f} (mean of the last "
                    f"{len(recent)} batches) ({now - t_train:.0f}s, ~{eta:.0f}s left)"
                )
        if rank == 0:
            # the quantity warmstart.json and the manifest record as epoch_response_nll: the mean of the epoch's
            # batches' NLL per response token (a token-weighted mean over the epoch reads a little differently)
            rows = [c["response_nll"] for c in curve if c["epoch"] == epoch + 1]
            mean = sum(rows) / max(len(rows), 1)
            log(f"epoch {epoch + 1} done: response NLL {mean:.3f} (mean of its {len(rows)} batches)")
    return curve


def _share_backward(model, examples, share, info, pad_id, prompt_weight, dtype) -> tuple[float, float, float]:
    """Forward and backward of this rank's `share` of a batch; (loss, response NLL sum, response tokens) of it. With
    several ranks the loss is divided by the whole batch's weight (summed over ranks); a rank with no example of a
    small batch adds nothing (its gradients stay None and count as 0 in the sum)."""
    den, world = None, info.world if info is not None and info.enabled else 1
    if share:
        ids, attn, weight = collate(examples, share, pad_id, prompt_weight)
        den = loss_denominator(weight)
    if world > 1:  # every rank joins, an empty share too
        den = float(all_reduce_(torch.tensor([den or 0.0], dtype=torch.float64), info)[0])
    if not share:
        return 0.0, 0.0, 0.0
    device = next(model.parameters()).device
    ids, attn, weight = ids.to(device), attn.to(device), weight.to(device)
    with autocast(torch.bfloat16 if dtype == "bfloat16" else torch.float32, device):
        loss, nll, ntok = batch_loss(model, ids, attn, weight, den)
    loss.backward()
    return float(loss.detach()), nll, ntok


def _sum_gradients(params, info: DistInfo) -> None:
    """Sum every gradient over the ranks (one flat all-reduce); a parameter no example of this rank reached has a
    zero gradient here."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = all_reduce_(torch.cat([g.reshape(-1) for g in grads]), info)
    offset = 0
    for p, g in zip(params, grads, strict=True):
        n = g.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n


def train_on_ranks(model_dir: Path, examples: list, nproc: int, settings: dict) -> list[dict]:
    """Train the model at `model_dir` in place with `nproc` data-parallel CPU ranks (`train_clone` on each, rank 0
    saves the weights); returns the loss curve. `settings`: train_clone's keyword arguments, plus epochs and seed."""
    with tempfile.TemporaryDirectory(prefix="seed-warmstart-") as tmp:
        orders = {"model_dir": str(model_dir), "examples": examples, "settings": settings}
        (Path(tmp) / LAUNCH_FILE).write_text(json.dumps(orders))
        cmd = torchrun_command(nproc, Path(tmp), module="seedcli.stages.warmstart_train")
        rc = launch(cmd, env={"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
        if (Path(tmp) / ERROR_FILE).exists():  # a rank's one line (a non-finite loss): the same error here
            raise NonFiniteValue((Path(tmp) / ERROR_FILE).read_text())
        if rc != 0 or not (Path(tmp) / CURVE_FILE).exists():
            raise UserError(
                f"the warm start's torchrun ranks exited with code {rc} (their errors are above); fix the cause and "
                "run it again, or train in one process with nproc=1"
            )
        return json.loads((Path(tmp) / CURVE_FILE).read_text())


def _worker_main(run_dir: str) -> None:
    """One torchrun rank: train the model its orders name; rank 0 saves it and the curve."""
    orders = json.loads((Path(run_dir) / LAUNCH_FILE).read_text())
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    info = init_distributed(use_cuda=False, fsdp=False)
    try:
        model = AutoModelForCausalLM.from_pretrained(orders["model_dir"], dtype=torch.float32)
        settings = dict(orders["settings"])
        epochs, seed = settings.pop("epochs"), settings.pop("seed")
        examples = [tuple(e) for e in orders["examples"]]
        try:
            curve = train_clone(model, examples, epochs, seed, info=info, **settings)
        except NonFiniteValue as exc:  # every rank stops at the same batch; rank 0 hands the line to the launcher
            if info.is_main:
                (Path(run_dir) / ERROR_FILE).write_text(str(exc))
            raise SystemExit(2) from None
        if info.is_main:
            model.save_pretrained(orders["model_dir"], safe_serialization=True)
            (Path(run_dir) / CURVE_FILE).write_text(json.dumps(curve))
    finally:
        shutdown(info)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker_main(sys.argv[2])
    else:
        sys.exit("usage: python -m seedcli.stages.warmstart_train --worker DIR (started by the warm start, nproc > 1)")
