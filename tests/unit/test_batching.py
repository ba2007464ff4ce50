"""Continuous batching gives every request the completion `generate` gives it: the same tokens from the same seed
(log-probs equal up to float noise), whatever joins or leaves the batch around it — sampled, greedy, forced-length
and mixed-settings requests alike; and it spends fewer decode steps than lockstep when reply lengths differ."""

from __future__ import annotations

import random

import pytest
import torch

from seedcli.engines.scheduling import ContinuousScheduler, Request, generate_requests

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from seedcli.engines import load_engine
    from seedcli.engines.tiny import build_tiny_model
    from seedcli.envs import tokenizer_texts

    path = build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", preset="tiny", seed=0, corpus=tokenizer_texts())
    return load_engine("hf", path, device="cpu", max_batch=4)


def _requests(engine, n: int, seed: int, **kw) -> list[Request]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = "You are in the middle of a room. " * rng.randint(1, 12)
        ids = engine.render([{"role": "user", "content": text}])
        settings = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 16, **kw}
        if callable(settings["max_new_tokens"]):
            settings["max_new_tokens"] = settings["max_new_tokens"](i)
        if callable(settings["temperature"]):
            settings["temperature"] = settings["temperature"](i)
        out.append(Request(tag=i, ids=ids, seed=rng.randrange(2**31), **settings))
    return out


def _continuous(engine, requests: list[Request], trickle: int, stats: dict | None = None) -> tuple[dict, int]:
    """Serve `requests` continuously, `trickle` submitted at first and one more each time one finishes; `stats`
    receives the batcher's whole-batch copies and the most rows it held."""
    scheduler = ContinuousScheduler(engine)
    queue = list(requests)
    for r in queue[:trickle]:
        scheduler.submit(r)
    queue = queue[trickle:]
    out = {}
    most = 0
    while scheduler.busy:
        for tag, c in scheduler.step():
            out[tag] = c
            if queue:
                scheduler.submit(queue.pop(0))
        most = max(most, len(scheduler.batcher.rows))
    if stats is not None:
        stats.update(copies=scheduler.batcher.copies, rows=most)
    return out, scheduler.steps


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"temperature": 0.0},
        {"top_p": 0.8},
        {"max_new_tokens": lambda i: 3 + 5 * (i % 4), "ban_stop": True},  # forced lengths, as the rollout bench
        {"temperature": lambda i: 0.0 if i % 3 == 0 else 1.0},  # greedy analyses among sampled turns
    ],
)
def test_continuous_batching_gives_generates_completions(engine, kw):
    requests = _requests(engine, 10, seed=1, **kw)
    reference, _ = generate_requests(engine, requests, gen_batch=64)
    served, _ = _continuous(engine, requests, trickle=3)
    assert sorted(served) == list(range(10))
    for r, ref in zip(requests, reference, strict=True):
        got = served[r.tag]
        assert got.token_ids == ref.token_ids and got.finish_reason == ref.finish_reason and got.text == ref.text
        assert max((abs(a - b) for a, b in zip(got.logprobs, ref.logprobs, strict=True)), default=0) < 1e-4
    if kw.get("ban_stop"):
        assert [len(served[r.tag].token_ids) for r in requests] == [r.max_new_tokens for r in requests]


def test_continuous_batching_spends_fewer_steps_on_uneven_lengths(engine):
    lengths = [2, 30, 3, 2, 28, 4, 2, 3]
    requests = _requests(engine, 8, seed=2, max_new_tokens=lambda i: lengths[i], ban_stop=True)
    _, lockstep_steps = generate_requests(engine, requests, gen_batch=8)
    _, steps = _continuous(engine, requests, trickle=8)
    # lockstep: each max_batch (4) sub-batch decodes until its longest reply; continuous: 4 rows always busy
    assert steps < lockstep_steps
    assert steps >= -(-sum(lengths) // 4)  # never better than the rows allow


def test_a_finished_requests_row_waits_for_the_next_request_instead_of_copying_the_batch(engine):
    """Holes: a request that finishes leaves its row; the next one is prefilled and copied into that row alone. Dropping
    the row and splicing the next request in copies every row's cache twice a turn; the completions are the same."""
    requests = _requests(engine, 12, seed=3, max_new_tokens=lambda i: 2 + 3 * (i % 5), ban_stop=True)
    served, copies = {}, {}
    for holes in (False, True):
        engine.kv_holes = holes
        stats: dict = {}
        try:
            served[holes], _ = _continuous(engine, requests, trickle=4, stats=stats)
        finally:
            engine.kv_holes = True
        copies[holes] = stats["copies"]
        assert stats["rows"] <= engine.max_batch
    for r in requests:
        a, b = served[False][r.tag], served[True][r.tag]
        assert a.token_ids == b.token_ids and len(a.token_ids) == r.max_new_tokens
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    # without holes: a copy when each of the first 8 requests leaves and one when its successor joins; with holes a
    # successor fills the row its predecessor left, and only a prompt wider than the running rows or the drain at the
    # end (a quarter of the rows empty) copies the batch
    assert copies[False] >= 2 * 8
    assert copies[True] < copies[False] / 2
