"""The warm start's progress line: every 20 batches, at the last one, and at least every PROGRESS_EVERY_S seconds
(a 38-batch run on two CPU cores would otherwise print once, ten minutes in), with the time left."""

from __future__ import annotations

import re

import torch

from seedcli.stages import warmstart_train
from tests.helpers_models import tiny_lm


def _batch_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("[warm-start] epoch 1/1 batch ")]


def test_a_progress_line_at_least_every_interval(monkeypatch, capsys):
    torch.set_num_threads(1)
    examples = [([1, 2, 3, 4], [5, 6]) for _ in range(6)]  # 6 tokens each, 2 a batch of 12: 3 batches
    monkeypatch.setattr(warmstart_train, "PROGRESS_EVERY_S", 0.0)
    curve = warmstart_train.train_clone(
        tiny_lm(), examples, 1, 0, lr=1e-3, batch_tokens=12, prompt_weight=0.0, pad_id=0
    )
    lines = _batch_lines(capsys.readouterr().err)
    assert len(curve) == 3
    assert [int(re.search(r"batch (\d+)/3", line).group(1)) for line in lines] == [1, 2, 3]
    assert all(re.search(r"\(\d+s, ~\d+s left\)$", line) for line in lines)
    assert lines[-1].endswith("~0s left)")


def test_only_the_last_batch_within_the_interval(monkeypatch, capsys):
    torch.set_num_threads(1)
    examples = [([1, 2, 3, 4], [5, 6]) for _ in range(6)]
    monkeypatch.setattr(warmstart_train, "PROGRESS_EVERY_S", 3600.0)
    warmstart_train.train_clone(tiny_lm(), examples, 1, 0, lr=1e-3, batch_tokens=12, prompt_weight=0.0, pad_id=0)
    lines = _batch_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "batch 3/3" in lines[0]
