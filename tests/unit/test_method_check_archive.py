"""scripts/method_check_archive.py on a hand-made method-check directory: the record keeps every file but weights
and checkpoints, its index points at itself; a restore forgets exactly the steps whose weights are gone; verify
says when a rebuilt model differs from the recorded one."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers_cli import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def archive():
    return load_script("method_check_archive")


def _check(runs: Path) -> dict:
    """A check that finished: warm start, Stage-1 sft, GRPO seed 0 with its eval, SEED seed 0 without one."""
    files = {
        "models/agent/model.safetensors": b"warm-weights",
        "models/agent/warmstart.json": b'{"games": 64}',
        "sft/s1/model/model.safetensors": b"sft-weights",
        "sft/s1/manifest.json": b"{}",
        "rl/g0/metrics.jsonl": b'{"step": 1}\n',
        "rl/g0/checkpoints/step_000012/model.safetensors": b"rl-weights",
        "rl/g0/checkpoints/step_000012/state.json": b"{}",
        "rl/s0/metrics.jsonl": b'{"step": 1}\n',
        "eval/e0/results.json": b'{"micro_success": 0.5}',
        "commands.jsonl": b'{"name": "warmstart"}\n',
        "eval/e1/episodes.jsonl": b'{"won": true}\n',  # an eval the sitting's end interrupted
        "eval/e1/writer.lock": b'{"pid": 4242}',
        ".lock": b"",
    }
    for rel, data in files.items():
        (runs / rel).parent.mkdir(parents=True, exist_ok=True)
        (runs / rel).write_bytes(data)
    index = {
        "warmstart": None,
        "collect_stage1": f"{runs}/collect/c1",
        "annotate_stage1": f"{runs}/annotate/a1",
        "sft_stage1": f"{runs}/sft/s1",
        "kept_after_sft": f"{runs}/annotate/k1",
        "rl_grpo_s0": f"{runs}/rl/g0",
        "eval_grpo_s0": f"{runs}/eval/e0",
        "rl_seed_self_s0": f"{runs}/rl/s0",
    }
    (runs / "index.json").write_text(json.dumps(index))
    return index


def test_save_keeps_all_but_weights_and_rebases_the_index(archive, tmp_path):
    runs, record = tmp_path / "runs" / "mc", tmp_path / "docs" / "record"
    _check(runs)
    assert archive.save(runs, record) == 0
    kept = sorted(str(p.relative_to(record)) for p in record.rglob("*") if p.is_file())
    assert kept == [
        "commands.jsonl", "eval/e0/results.json", "eval/e1/episodes.jsonl", "index.json", "models/agent/warmstart.json",
        "rl/g0/metrics.jsonl", "rl/s0/metrics.jsonl", "sft/s1/manifest.json", "weights.json",
    ]  # fmt: skip
    index = json.loads((record / "index.json").read_text())
    assert index["rl_grpo_s0"] == f"{record}/rl/g0" and index["warmstart"] is None
    weights = json.loads((record / "weights.json").read_text())["sha256"]
    assert weights == {
        "models/agent/model.safetensors": hashlib.sha256(b"warm-weights").hexdigest(),
        "sft_stage1/model/model.safetensors": hashlib.sha256(b"sft-weights").hexdigest(),
    }


def test_git_keeps_every_file_a_record_holds(archive, tmp_path):
    """The committed record (docs/method-check/record) loses nothing to .gitignore: a `models/` pattern that matched at
    any depth once kept the record's models/agent/warmstart.json out of git, and the document lost its warm start."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    runs, record = tmp_path / "runs" / "mc", tmp_path / "record"
    _check(runs)
    archive.save(runs, record)
    kept = [f"docs/method-check/record/{p.relative_to(record).as_posix()}" for p in record.rglob("*") if p.is_file()]
    ignored = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "--no-index", *kept], capture_output=True, text=True
    ).stdout.split()
    assert "docs/method-check/record/models/agent/warmstart.json" in kept and ignored == []


def test_restore_forgets_the_rebuilt_steps_and_an_rl_run_without_its_eval(archive, tmp_path, capsys):
    runs, record, again = tmp_path / "runs" / "mc", tmp_path / "record", tmp_path / "again" / "mc"
    _check(runs)
    archive.save(runs, record)
    assert archive.restore(record, again) == 0
    index = json.loads((again / "index.json").read_text())
    # warm start and sft are rebuilt (their weights are not in the record); SEED s0 has no eval, so no checkpoint;
    # what the warm start played stays until verify-warm compares the rebuilt warm start
    assert index == {
        "collect_stage1": f"{again}/collect/c1",
        "annotate_stage1": f"{again}/annotate/a1",
        "kept_after_sft": f"{again}/annotate/k1",
        "rl_grpo_s0": f"{again}/rl/g0",
        "eval_grpo_s0": f"{again}/eval/e0",
    }
    assert not (again / "models").exists()  # `seed model init` refuses a non-empty --out
    assert (again / "rl" / "g0" / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert archive.restore(record, again) == 2  # never over a runs directory in use
    assert "restore only into a fresh runs directory" in capsys.readouterr().err


def test_verify_notes_a_rebuilt_model_that_differs(archive, tmp_path, capsys):
    runs, record, again = tmp_path / "runs" / "mc", tmp_path / "record", tmp_path / "again" / "mc"
    _check(runs)
    archive.save(runs, record)
    archive.restore(record, again)
    (again / "models" / "agent").mkdir(parents=True)
    (again / "models" / "agent" / "model.safetensors").write_bytes(b"warm-weights")  # the same warm start
    (again / "sft" / "s2" / "model").mkdir(parents=True)
    (again / "sft" / "s2" / "model" / "model.safetensors").write_bytes(b"other-sft-weights")  # a different sft
    index = json.loads((again / "index.json").read_text())
    (again / "index.json").write_text(json.dumps({**index, "sft_stage1": f"{again}/sft/s2"}))
    assert archive.verify(again) == 0
    note = json.loads((again / "machine.json").read_text())["rebuild_note"]
    assert note.startswith("the rebuilt sft_stage1/model/model.safetensors differ") and "models/agent" not in note
    assert "warning:" in capsys.readouterr().err


@pytest.mark.parametrize("same", [True, False])
def test_verify_warm_keeps_what_the_warm_start_played_only_if_it_is_the_same(archive, tmp_path, capsys, same):
    runs, record, again = tmp_path / "runs" / "mc", tmp_path / "record", tmp_path / "again" / "mc"
    _check(runs)
    archive.save(runs, record)
    archive.restore(record, again)
    (again / "models" / "agent").mkdir(parents=True)
    (again / "models" / "agent" / "model.safetensors").write_bytes(b"warm-weights" if same else b"other-weights")
    assert archive.verify_warm(again) == 0
    index = json.loads((again / "index.json").read_text())
    played = {"collect_stage1", "annotate_stage1"}
    if same:
        assert played <= set(index) and "equals the recorded one" in capsys.readouterr().out
    else:
        assert not played & set(index) and "kept_after_sft" in index  # the sft's steps are verify's to note
        err = capsys.readouterr().err
        assert "differs from the record's" in err and "collect_stage1, annotate_stage1" in err
