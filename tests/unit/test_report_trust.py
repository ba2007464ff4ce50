"""`seed report` claims only what its inputs support (issue 55 §1): a run given twice is refused, every file it reads
is checked against its run's manifest, and evals played under different protocols are not paired unless the user
says so (--allow-mismatch), with the differences shown. The evals are real: Sokoban's expert on four games."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedcli.artifacts import InputRef, manifest_sha256, read_manifest
from seedcli.cli import app
from tests.helpers_runs import flip_byte, seal_run


def _eval(runs: Path, *args: str) -> Path:
    """`seed eval` of Sokoban's expert on the first four test games; the run directory."""
    result = CliRunner().invoke(
        app,
        ["eval", "--env", "sokoban", "--policy", "expert", "--runs-dir", str(runs), "--limit", "4", "--workers", "0"]
        + ["--json", *args],
    )
    assert result.exit_code == 0, result.output
    return runs / "eval" / json.loads(result.stdout.strip().splitlines()[-1])["run_id"]


@pytest.fixture(scope="module")
def evals(tmp_path_factory) -> dict[str, Path]:
    """Three evals of the same eight-step protocol (start, a, b), one with a three-step turn limit (short) and one
    at another temperature (warm)."""
    runs = tmp_path_factory.mktemp("report_trust") / "runs"
    return {
        "start": _eval(runs, "--max-steps", "8"),
        "a": _eval(runs, "--max-steps", "8", "--seed", "1"),
        "b": _eval(runs, "--max-steps", "8", "--seed", "2"),
        "short": _eval(runs, "--max-steps", "3"),
        "warm": _eval(runs, "--max-steps", "8", "--temperature", "0.7"),
    }


def _report(*args) -> object:
    return CliRunner().invoke(app, ["report", *map(str, args)])


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    text = result.output.strip()
    assert len(text.splitlines()) == 1 and text.startswith("error:") and "Traceback" not in text, text
    return text


def _copy(run: Path, tmp_path: Path, name: str = "copy") -> Path:
    dst = tmp_path / name / "eval" / run.name
    shutil.copytree(run, dst)
    return dst


# ------------------------------------------------------------------------------------------ a run given twice


def test_one_run_given_three_times_as_three_seeds_is_refused(evals, tmp_path):
    # the issue's probe: START R R R --seeds 3 made the seeds' spread 0 and the SE fall from 14.2 to 8.3
    out = tmp_path / "rep"
    r = evals["a"]
    text = _one_line_error(_report(evals["start"], r, r, r, "--seeds", "3", "--out", out))
    assert f"run 3 ({r}) is the same run directory as run 2 ({r})" in text and "pass each eval run once" in text
    assert not out.exists()  # nothing written
    # the same run by another path: its results.json, and runs/eval/latest pointing at it
    latest = r.parent / "latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    os.symlink(r.name, latest)
    assert "the same run directory as" in _one_line_error(_report(evals["start"], r, latest, "--out", out))
    assert "the same run directory as" in _one_line_error(_report(r, r / "results.json", "--out", out))
    # the start given again (after a recipe's run)
    assert "the same run directory as" in _one_line_error(
        _report(evals["start"], evals["a"], evals["start"], "--out", out)
    )
    # a copy of a run elsewhere: the same manifest.json
    copy = _copy(r, tmp_path)
    text = _one_line_error(_report(evals["start"], r, copy, "--out", out))
    assert f"run 3 ({copy}) is a copy (the same manifest.json) of run 2 ({r})" in text
    # three different runs of one protocol are compared
    ok = _report(evals["start"], evals["a"], evals["b"], "--out", out)
    assert ok.exit_code == 0, ok.output
    assert (out / "compare.md").exists()


# ----------------------------------------------------------------------------------------- edited inputs


def test_an_edited_results_json_is_refused(evals, tmp_path):
    # the probe: valid JSON, sha256 no longer in the manifest; it printed Micro 50.0% beside +100 (8 of 8 up)
    run = _copy(evals["a"], tmp_path)
    results = json.loads((run / "results.json").read_text())
    results["micro_success"] = 0.5
    (run / "results.json").write_text(json.dumps(results, indent=2))
    text = _one_line_error(_report(evals["start"], run, "--out", tmp_path / "rep"))
    assert f"{run}: results.json does not match its sha256 in the manifest" in text
    # the same size, one byte changed: still refused (every byte is read)
    run = _copy(evals["b"], tmp_path, "copy2")
    flip_byte(run / "results.json", offset=5)
    assert "results.json does not match its sha256" in _one_line_error(_report(evals["start"], run))


def test_an_edited_episodes_file_is_refused(evals, tmp_path):
    # the probe: an edited episodes.jsonl printed +87.5 beside 100%
    run = _copy(evals["a"], tmp_path)
    lines = (run / "episodes.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["won"] = not first["won"]
    (run / "episodes.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    text = _one_line_error(_report(evals["start"], run, "--out", tmp_path / "rep"))
    assert f"{run}: episodes.jsonl does not match its sha256 in the manifest" in text


def test_a_truncated_or_missing_manifest_is_refused(evals, tmp_path):
    run = _copy(evals["a"], tmp_path)
    data = (run / "manifest.json").read_bytes()
    (run / "manifest.json").write_bytes(data[: len(data) // 2])
    text = _one_line_error(_report(evals["start"], run, "--out", tmp_path / "rep"))
    assert "manifest.json: not valid JSON; the manifest was damaged" in text
    (run / "manifest.json").unlink()
    assert "no manifest.json" in _one_line_error(_report(evals["start"], run, "--out", tmp_path / "rep"))


def test_the_training_run_an_eval_names_is_checked_too(evals, tmp_path):
    """An eval's label and recipe name come from the rl run it names: an rl manifest edited after the eval read it
    is refused; one that only finished after the eval started (an eval of a checkpoint) is not a change."""
    rl = tmp_path / "runs" / "rl" / "20260101T000000Z-00000000"
    seal_run(rl, "rl", {"algo": "grpo"}, created="2026-01-01T00:00:00Z")
    run = _copy(evals["a"], tmp_path)
    manifest = read_manifest(run)
    manifest.inputs = [InputRef(stage="rl", run_id=rl.name, path=str(rl), manifest_sha256=manifest_sha256(rl))]
    (run / "manifest.json").write_text(manifest.model_dump_json(indent=2))
    assert _report(evals["start"], run, "--out", tmp_path / "ok").exit_code == 0
    rl_manifest = read_manifest(rl)
    rl_manifest.config["algo"] = "seed"  # edited after the eval: the label would read SEED
    (rl / "manifest.json").write_text(rl_manifest.model_dump_json(indent=2))
    text = _one_line_error(_report(evals["start"], run, "--out", tmp_path / "rep"))
    assert f"its input rl run {rl.resolve()} changed after {run.name} read it" in text
    # a run that finished after the eval began (it was read while it trained): accepted
    rl_manifest.finished = "2999-01-01T00:00:00Z"
    (rl / "manifest.json").write_text(rl_manifest.model_dump_json(indent=2))
    assert _report(evals["start"], run, "--out", tmp_path / "ok2").exit_code == 0


# ------------------------------------------------------------------------------------- different protocols


def test_evals_with_different_turn_limits_are_not_paired(evals, tmp_path):
    # the probe: --max-steps 3 against 8 read as a paired gain; here the expert wins 3 of 4 in 3 steps, 4 of 4 in 8
    out = tmp_path / "rep"
    text = _one_line_error(_report(evals["short"], evals["a"], "--out", out))
    assert "not played under one protocol (max_steps 3 (run 1) vs 8 (run 2))" in text and "--allow-mismatch" in text
    assert not out.exists()
    text = _one_line_error(_report(evals["start"], evals["a"], evals["warm"], "--out", out))
    assert "temperature 0.4 (runs 1, 2) vs 0.7 (run 3)" in text
    # allowed: the comparison is written, with the table of differences in compare.md and on stderr
    allowed = CliRunner().invoke(
        app, ["report", str(evals["short"]), str(evals["a"]), "--out", str(out), "--allow-mismatch"]
    )
    assert allowed.exit_code == 0, allowed.output
    md = (out / "compare.md").read_text()
    assert "## Protocol differences (compared with --allow-mismatch)" in md and "| max_steps | 3 | 8 |" in md
    assert "| max_steps | 3 | 8 |" in allowed.stderr


def test_evals_of_different_tasks_or_environment_options_are_not_paired(evals, tmp_path):
    runs = evals["start"].parent.parent
    fewer = _eval(runs, "--max-steps", "8", "--limit", "2")  # overrides the fixture's --limit 4: two of the games
    text = _one_line_error(_report(evals["start"], fewer, "--out", tmp_path / "rep"))
    assert "tasks 4 (ids" in text and "vs 2 (ids" in text
    bigger = _eval(runs, "--max-steps", "8", "--env-options", "{dim: 7}")
    text = _one_line_error(_report(evals["start"], bigger, "--out", tmp_path / "rep"))
    assert 'env_options none (run 1) vs {"dim":7} (run 2)' in text
