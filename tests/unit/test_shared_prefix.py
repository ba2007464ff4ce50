"""The scorer's shared prefix (rl/logprobs.py `share_prefix`): rows that begin alike run their common prefix once,
and the log-probs, entropies and gradients equal a full forward's (up to float rounding), also under DDP over gloo
(two CPU ranks; each decoder layer runs twice in one forward); `pack_by_prefix` puts rows that begin alike side by
side. FSDP2 frees a layer's gathered weights after each call, which a second call's backward then needs (measured:
"setStorage … out of bounds for storage of size 0"), so a fully sharded scorer runs whole rows: checked here too."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from seedcli.rl.batching import pack_by_prefix, pad_right
from seedcli.rl.logprobs import MIN_SHARED_PREFIX, Scorer, score_responses, sequence_logprobs, shared_prefix_len
from tests.helpers_models import tiny_lm

torch.set_num_threads(1)
VOCAB = 97


def _rows(seed: int = 0, prefix: int = 40, rows: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded rows that share `prefix` prompt tokens, then prompts and responses of their own lengths."""
    g = torch.Generator().manual_seed(seed)
    common = torch.randint(1, VOCAB, (prefix,), generator=g).tolist()
    seqs, spans = [], []
    for r in range(rows):
        own = torch.randint(1, VOCAB, (3 + 2 * r,), generator=g).tolist()  # the prompt's own tail
        resp = torch.randint(1, VOCAB, (4 + r,), generator=g).tolist()
        seqs.append(common + own + resp)
        spans.append((prefix + len(own), len(resp)))
    ids, attn = pad_right(seqs, 0)
    resp_mask = torch.zeros(ids.shape)
    for b, (p, r) in enumerate(spans):
        resp_mask[b, p : p + r] = 1
    return ids, attn, resp_mask


def test_shared_prefix_len_by_hand():
    ids = torch.tensor([[5, 6, 7, 8, 9, 1], [5, 6, 7, 2, 3, 0]])
    attn = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    resp = torch.tensor([[0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 0]])
    assert shared_prefix_len(ids, attn, resp) == 3  # rows differ at column 3
    resp2 = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 0]])
    assert shared_prefix_len(ids, attn, resp2) == 1  # the state at column 1 predicts row 0's first response token
    same = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 8, 9]])
    full = torch.ones_like(same)
    assert shared_prefix_len(same, full, torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 1]])) == 2  # identical rows
    assert shared_prefix_len(same[:1], full[:1], torch.tensor([[0, 0, 0, 1, 1]])) == 0  # one row: nothing to share
    assert shared_prefix_len(same, full, torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]])) == 0  # a row scores nothing
    left = torch.tensor([[0, 1], [1, 1]])  # a padded (left) column is not shared
    assert shared_prefix_len(torch.tensor([[0, 4], [0, 4]]), left, torch.tensor([[0, 1], [0, 1]])) == 0


@pytest.mark.parametrize("with_entropy", [False, True])
def test_shared_prefix_scores_and_gradients_equal_a_full_forward(with_entropy):
    ids, attn, resp = _rows()
    assert shared_prefix_len(ids, attn, resp) == 40 >= MIN_SHARED_PREFIX
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))
    results = {}
    for share in (False, True):
        model = tiny_lm(0, vocab=VOCAB, tie=False).train()  # no dropout in the tiny model: train == eval numerics
        out = sequence_logprobs(model, ids, attn, resp, with_entropy=with_entropy, chunk_tokens=5, share_prefix=share)
        logp, ent = out if with_entropy else (out, torch.zeros(()))
        ((logp * weights).sum() + (ent * weights).sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results[share] = (logp.detach(), ent.detach(), grads)
    (lp0, e0, g0), (lp1, e1, g1) = results[False], results[True]
    assert (lp1 != 0).sum() == resp.sum() - 0  # every response token scored (none at column 0)
    torch.testing.assert_close(lp1, lp0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(e1, e0, rtol=1e-5, atol=1e-5)
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-4, atol=1e-6, msg=name)


def test_short_or_absent_prefix_runs_the_full_forward_unchanged():
    ids, attn, resp = _rows(prefix=MIN_SHARED_PREFIX - 8)
    model = tiny_lm(0, vocab=VOCAB)
    with torch.no_grad():
        a = sequence_logprobs(model, ids, attn, resp, share_prefix=False)
        b = sequence_logprobs(model, ids, attn, resp, share_prefix=True)
    assert torch.equal(a, b)  # below MIN_SHARED_PREFIX: the very same computation


def test_score_responses_packs_alike_pairs_together_and_scores_the_same():
    g = torch.Generator().manual_seed(5)
    games = [torch.randint(1, VOCAB, (48,), generator=g).tolist() for _ in range(2)]
    pairs = []
    for k in range(6):  # two games' prompts, interleaved, each with its own tail and response
        tail = torch.randint(1, VOCAB, (2 + k,), generator=g).tolist()
        pairs.append((games[k % 2] + tail, torch.randint(1, VOCAB, (3,), generator=g).tolist()))
    lm = tiny_lm(0, vocab=VOCAB)
    plain, shared = Scorer(lm), Scorer(lm, share_prefix=True)
    calls = []
    real = shared.forward

    def spy(input_ids, *args, **kw):
        calls.append(shared_prefix_len(input_ids, args[0], args[1]))
        return real(input_ids, *args, **kw)

    shared.forward = spy
    a = score_responses(plain, pairs, max_tokens=3 * 60, pad_id=0)
    b = score_responses(shared, pairs, max_tokens=3 * 60, pad_id=0)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-5)
    assert calls == [48, 48]  # each micro-batch holds one game's three pairs and shares its 48 tokens


def test_pack_by_prefix_by_hand():
    keys = [("g1", 2, 0), ("g0", 1, 1), ("g1", 1, 0), ("g0", 1, 0)]
    assert pack_by_prefix(keys, [10, 10, 10, 10], 20) == [[3, 1], [2, 0]]
    assert pack_by_prefix(keys, [10, 30, 10, 10], 20) == [[3], [1], [2, 0]]  # longer than the budget: its own batch
    with pytest.raises(ValueError):
        pack_by_prefix(keys, [1, 1, 1, 1], 0)


def _worker(rank: int, world: int, init_file: str, out_dir: str, fsdp: bool) -> None:
    from seedcli.rl.distributed import DistInfo, wrap_for_training

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    info = DistInfo(rank=rank, world=world, backend="gloo", fsdp=fsdp)
    ids, attn, resp = _rows(seed=rank)
    out = {}
    for share in (False, True):
        lm = tiny_lm(0, vocab=VOCAB, tie=True).train()
        scorer = Scorer(lm, share_prefix=share)
        model = wrap_for_training(scorer, info)
        model(ids, attn, resp).sum().backward()
        out[share] = {n: (p.grad.full_tensor() if fsdp else p.grad).clone() for n, p in lm.named_parameters()}
        out[f"tally{share}"] = scorer.take_tally()
    torch.save(out, Path(out_dir) / f"r{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp2"])
@pytest.mark.slow
def test_gradients_over_two_ranks_equal_the_full_forwards(tmp_path, fsdp):
    init = Path(tempfile.mkdtemp()) / "init"
    mp.spawn(_worker, args=(2, str(init), str(tmp_path), fsdp), nprocs=2, join=True)
    for rank in range(2):
        out = torch.load(tmp_path / f"r{rank}.pt")
        for name, full in out[False].items():
            torch.testing.assert_close(out[True][name], full, rtol=1e-4, atol=1e-6, msg=name)
        tokens, saved = out["tallyTrue"]
        assert out["tallyFalse"] == [tokens, 0] and tokens > 0
        assert saved == (0 if fsdp else 3 * 40)  # FSDP2 runs whole rows; DDP ran the 40 shared tokens once for 4 rows


def test_share_prefix_is_on_by_default_and_not_hashed():
    from seedcli.config import build_config

    default = build_config("rl", None, {"env": "ezpoints"})
    off = build_config("rl", None, {"env": "ezpoints"}, overrides=["share_prefix=false"])
    assert default.share_prefix is True and off.share_prefix is False
    assert off.config_hash() == default.config_hash()  # the same computation up to float rounding
