"""`seed rl --skill_mode episode_step dump_analyses=true` end to end on text Sokoban and the tiny model (CLI in a
subprocess, CPU, one update): the self-analyzer is asked for step skills (the step prompt, Sokoban's cap of 2), the
dump holds one line per episode with its prompt, answer and rejection reason, and the step-skill metrics are logged.
A random model writes no usable JSON, so no teacher prompt is dumped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_step_mode_run_writes_the_dumps(tmp_path):
    from seedcli.engines.tiny import build_tiny_model
    from seedcli.envs import tokenizer_texts

    model = build_tiny_model(tmp_path / "tiny", preset="tiny", seed=0, corpus=tokenizer_texts())
    runs = tmp_path / "runs"
    cmd = [
        sys.executable, "-m", "seedcli", "rl", "--env", "sokoban", "--model", str(model), "--steps", "1",
        "--batch-tasks", "2", "--group", "2", "--max-steps", "3", "--max-new-tokens", "12", "--analyzer", "self",
        "--runs-dir", str(runs), "skill_mode=episode_step", "dump_analyses=true", "analyzer_max_new_tokens=16",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = runs / "rl" / "latest"
    rows = [json.loads(line) for line in (run / "analyses" / "step_000001.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and len({r["episode_id"] for r in rows}) == 4
    for r in rows:
        assert r["skill_mode"] == "episode_step" and r["prompt_version"] == "analysis-step-v1"
        assert "Also pick at most 2 critical step(s)" in r["prompt"] and r["answer"] is not None
        assert r["reason"] is not None and r["skill"] is None  # a random model's answer is rejected
        assert r["attempts"] == 2  # analyzer_parse_retries 2: one retry
    assert (run / "teacher_prompts" / "step_000001.jsonl").read_text() == ""
    (record,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert record["skills/step_skills"] == 0.0 and record["opd/step_skill_turn_frac"] == 0.0
    config = (run / "config.yaml").read_text()
    assert "skill_mode: episode_step" in config and "max_step_skills: 2" in config
