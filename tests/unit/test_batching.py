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


def _continuous(engine, requests: list[Request], trickle: int) -> tuple[dict, int]:
    """Serve `requests` continuously, `trickle` submitted at first and one more each time one finishes."""
    scheduler = ContinuousScheduler(engine)
    queue = list(requests)
    for r in queue[:trickle]:
        scheduler.submit(r)
    queue = queue[trickle:]
    out = {}
    while scheduler.busy:
        for tag, c in scheduler.step():
            out[tag] = c
            if queue:
                scheduler.submit(queue.pop(0))
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
