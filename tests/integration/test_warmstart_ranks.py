"""The warm start's data-parallel path (`nproc` CPU ranks under torchrun, the launcher sft and rl use): two ranks
train the same weights a single process does on the same batches, and the same loss curve."""

from __future__ import annotations

import random

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from seedcli.engines.tiny import build_tiny_model
from seedcli.envs import sample_texts
from seedcli.stages.warmstart_train import train_clone, train_on_ranks
from tests.helpers_models import SMALL_SHAPE


def _examples(n: int, vocab: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) of varied lengths: batches of several sizes, an odd one among them."""
    rng = random.Random(seed)
    return [
        ([rng.randrange(3, vocab) for _ in range(rng.randint(4, 20))], [rng.randrange(3, vocab) for _ in range(3)])
        for _ in range(n)
    ]


@pytest.mark.parametrize("prompt_weight", [0.0, 0.5])
@pytest.mark.slow
def test_two_ranks_train_the_weights_one_process_trains(tmp_path, prompt_weight):
    torch.set_num_threads(1)
    base = build_tiny_model(tmp_path / "one", preset="tiny", seed=0, corpus=sample_texts(), **SMALL_SHAPE)
    ranks_dir = build_tiny_model(tmp_path / "two", preset="tiny", seed=0, corpus=sample_texts(), **SMALL_SHAPE)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    examples = _examples(13, model.config.vocab_size)
    # ~3 examples a batch: one rank gets 1 or 2 of them, and a lone last example leaves the other rank without any
    settings = {"lr": 1e-3, "batch_tokens": 72, "prompt_weight": prompt_weight, "pad_id": 0, "dtype": "float32"}
    one = train_clone(model, examples, 2, 0, **settings)
    two = train_on_ranks(ranks_dir, examples, 2, {**settings, "epochs": 2, "seed": 0})

    assert len(one) == len(two) > 4
    for a, b in zip(one, two, strict=True):
        assert (a["step"], a["epoch"]) == (b["step"], b["epoch"])
        assert b["response_nll"] == pytest.approx(a["response_nll"], rel=1e-5, abs=1e-6)
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-6)
    assert two[-1]["response_nll"] < two[0]["response_nll"]  # it learned something
    trained = load_file(ranks_dir / "model.safetensors")
    start = AutoModelForCausalLM.from_pretrained(base.parent / "one", dtype=torch.float32).state_dict()
    moved = 0.0
    diffs = {}
    for name, tensor in model.state_dict().items():
        if name in trained:
            diffs[name] = float((trained[name] - tensor).abs().max())
            moved = max(moved, float((tensor - start[name]).abs().max()))
    # a key bias shifts every score of a query alike, so softmax cancels it: its exact gradient is 0 and AdamW turns
    # the float noise of either sum order into steps (3e-5 after 16 updates, measured); every other weight: <1e-6
    loose = {name for name in diffs if name.endswith("k_proj.bias")}
    assert max(diffs[n] for n in diffs if n not in loose) < 5e-6, diffs
    assert max((diffs[n] for n in loose), default=0.0) < 1e-3, diffs
    assert moved > 1e-3  # the single process's step moved the weights (the comparison is not of two untrained models)


@pytest.mark.slow
def test_the_warm_start_with_two_ranks_records_what_one_process_records(tmp_path):
    """`warm_start` (the clone, its checks and warmstart.json) with nproc=2 on text Sokoban, against nproc=1."""
    from seedcli.config import WarmStartConfig
    from seedcli.stages.warmstart import warm_start

    records = {}
    for nproc in (1, 2):
        model = build_tiny_model(tmp_path / f"m{nproc}", preset="tiny", seed=0, corpus=sample_texts(), **SMALL_SHAPE)
        cfg = WarmStartConfig(
            model=str(model), games=4, epochs=2, noise=0.3, workers=0, lr=3e-3, check_turns=2, env="sokoban",
            prompt_weight=0.0, skill_writing=False, cache_dir=str(tmp_path / "demos"), nproc=nproc,
        )  # fmt: skip
        records[nproc] = warm_start(model, cfg)
    one, two = records[1], records[2]
    assert two["turns"] == one["turns"] and len(two["curve"]) == len(one["curve"])
    for a, b in zip(one["curve"], two["curve"], strict=True):
        assert b["response_nll"] == pytest.approx(a["response_nll"], rel=1e-5, abs=1e-6)
    assert two["check"]["valid_rate"] == one["check"]["valid_rate"]  # the checks ran on the ranks' saved weights
