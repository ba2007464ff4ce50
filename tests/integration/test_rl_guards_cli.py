"""`seed rl` with the guards of issue 19 §3 on text Sokoban and the tiny model (CLI in subprocesses, CPU): collect,
annotate with the rules analyzer, then one update with those static skills and `leak_guard=mask
opd_contrast=shuffled` logs the OPD gate, harm and leak measures; with a library of differing skills the contrast's
extra teacher pass scores tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MEASURES = [
    "opd/gate_mean", "opd/gate_active_frac", "opd/teacher_gap_mean", "opd/token_frac", "opd/neg_adv_push_frac",
    "opd/high_entropy_push_frac", "skills/leak_frac",
]  # fmt: skip
SMALL = ["--max-steps", "3", "--max-new-tokens", "12"]


def seed(*args: str, **env_vars: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **env_vars}
    proc = subprocess.run(
        [sys.executable, "-m", "seedcli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def rl_record(runs: Path, model: Path, analyzer: str, *extra: str) -> dict:
    seed(
        "rl", "--env", "sokoban", "--model", str(model), "--steps", "1", "--batch-tasks", "2", "--group", "2", *SMALL,
        "--analyzer", analyzer, "--runs-dir", str(runs), "leak_guard=mask", "opd_contrast=shuffled", *extra,
    )  # fmt: skip
    lines = (runs / "rl" / "latest" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("guards")
    model, runs = root / "tiny", root / "runs"
    seed("model", "init", "--preset", "tiny", "--out", str(model))
    seed("collect", "--env", "sokoban", "--model", str(model), "--tasks", "2", "--rollouts", "2", *SMALL,
         "--runs-dir", str(runs))  # fmt: skip
    seed("annotate", "--analyzer", "rules", "--runs-dir", str(runs))
    return model, runs


@pytest.mark.slow
def test_guarded_update_logs_the_measures(pipeline):
    model, runs = pipeline
    rec = rl_record(runs, model, f"static:{runs / 'annotate' / 'latest'}", "sample_every=1")
    missing = [k for k in MEASURES if k not in rec]
    assert not missing, missing
    assert rec["opd/token_frac"] > 0  # the skills reached the teacher
    for key in ("opd/neg_adv_push_frac", "opd/high_entropy_push_frac", "skills/leak_frac"):
        assert 0.0 <= rec[key] <= 1.0
    assert rec["skills/leak_guarded"] >= 0 and "timing_s/rescore_contrast" in rec
    config = (runs / "rl" / "latest" / "config.yaml").read_text()
    assert "leak_guard: mask" in config and "opd_contrast: shuffled" in config
    # samples.jsonl carries what `seed inspect` marks: the skill's leaked spans and each token's entropy at θ
    sample = json.loads((runs / "rl" / "latest" / "samples.jsonl").read_text().splitlines()[0])
    assert sample["skill_leaks"] == [] and sample["entropy_threshold"] > 0
    assert all(len(t["entropy"]) == len(t["tokens"]) for t in sample["turns"])
    shown = seed("inspect", str(runs / "rl" / "latest"), COLUMNS="200").stdout
    assert "high-entropy tokens" in shown and "the update's top 20%" in shown


@pytest.mark.slow
def test_contrast_pass_scores_tokens_when_skills_differ(pipeline, tmp_path):
    model, runs = pipeline
    # the rules analyzer writes one text for every Sokoban episode: nothing to contrast with; a library of differing
    # skills gives the episodes different ones (chosen by episode id)
    library = tmp_path / "skills.json"
    words = ["walls", "corners", "boxes", "targets", "moves", "paths"]
    library.write_text(json.dumps({"sokoban": [f"Plan ahead: look at the {w} before each move." for w in words]}))
    rec = rl_record(runs, model, f"static:{library}")
    assert rec["opd/contrast_token_frac"] > 0
    assert rec["timing_s/rescore_contrast"] > 0
