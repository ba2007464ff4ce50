"""`seed rl --logger tensorboard` live on the tiny model: the event files hold every numeric metric of metrics.jsonl,
with the same names, steps and values (read back with TensorBoard's own reader)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seedcli.loggers import scalars

REPO = Path(__file__).resolve().parents[2]
STATIC = f"static:{REPO / 'data' / 'static_skills.json'}"

pytestmark = [
    pytest.mark.skipif(
        not (Path(os.environ.get("ALFWORLD_DATA", "")) / "json_2.1.1").is_dir(), reason="ALFWorld data not found"
    ),
    pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="pip install 'seedcli[tensorboard]'"),
]


@pytest.mark.slow
def test_rl_tensorboard_holds_every_metric_of_metrics_jsonl(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from seedcli.engines.tiny import build_tiny_model
    from seedcli.envs import tokenizer_texts

    model = build_tiny_model(tmp_path / "tiny", preset="tiny", seed=0, corpus=tokenizer_texts())
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "seedcli", "rl", "-c", "tiny", "--model", str(model), "--runs-dir", str(runs),
           "--max-steps", "2", "--steps", "2", "--analyzer", STATIC, "--logger", "tensorboard"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run,) = [d for d in (runs / "rl").iterdir() if d.is_dir() and not d.is_symlink()]

    expected: dict[str, list[tuple[int, float]]] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        step, values = scalars(json.loads(line))
        for key, value in values.items():
            expected.setdefault(key, []).append((step, value))
    assert [s for s, _ in expected["actor/pg_loss"]] == [1, 2] and len(expected) > 20

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})  # 0 = keep every point
    acc.Reload()
    got = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert sorted(got) == sorted(expected)
    for tag, points in expected.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
        # TensorBoard keeps float32: equal to the jsonl value up to its rounding
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in points], rel=1e-6, abs=1e-30), tag
