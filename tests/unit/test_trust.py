"""Runs a user can trust (issue 14): one writer per run, interrupted runs, damaged runs listed, lineage that survives
a `cd`, strict YAML, `--resume DIR` from the saved config, one-line errors with no run left behind, a catch-all."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedcli.artifacts import (
    LOCK,
    open_run,
    read_lock,
    read_manifest,
    resolve_input,
    run_state,
    verify_run,
)
from seedcli.cli import app
from seedcli.config import CollectConfig, build_config
from seedcli.errors import UserError


def _dead_pid() -> int:
    """The PID of a process that has exited (reaped), i.e. a writer that is gone."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _started_run(tmp_path: Path, **kw) -> Path:
    """A collect run that wrote one record and then was interrupted (Ctrl-C)."""
    cfg = CollectConfig(runs_dir=str(tmp_path / "runs"), tasks=2, **kw)
    with pytest.raises(KeyboardInterrupt):
        with open_run("collect", cfg, argv=["seed", "collect"]) as run:
            run.file("trajectories.jsonl").write_text('{"a": 1}\n')
            raise KeyboardInterrupt
    return run.path


def _one_line(result) -> str:
    text = (result.stderr or "").strip()
    assert "Traceback" not in text, text
    assert len(text.splitlines()) == 1, text
    return text


# ------------------------------------------------------------------------------------------- 1, 2: one writer


def test_a_second_writer_on_a_live_run_is_refused_and_the_lock_names_its_holder(tmp_path):
    cfg = CollectConfig(runs_dir=str(tmp_path), tasks=2)
    with open_run("collect", cfg, argv=["seed", "collect"]) as run:
        lock = read_lock(run.path)
        assert lock["pid"] == os.getpid() and lock["host"] == socket.gethostname() and lock["started"]
        run.file("trajectories.jsonl").write_text('{"a": 1}\n')
        again = cfg.model_copy(update={"resume": str(run.path)})
        with pytest.raises(UserError, match=rf"being written by PID {os.getpid()} on .*kill {os.getpid()}"):
            with open_run("collect", again, argv=[]):
                pass
        assert run_state(run.path, read_manifest(run.path)) == "running"
        with pytest.raises(UserError, match="still running"):
            verify_run(run.path, "collect")
    assert not (run.path / LOCK).exists()  # released when the stage ends


def test_a_lock_whose_process_is_gone_is_stale_and_taken_over(tmp_path):
    path = _started_run(tmp_path)
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps({**manifest, "status": "running"}))  # as a SIGKILL leaves it
    dead = _dead_pid()
    (path / LOCK).write_text(json.dumps({"pid": dead, "host": socket.gethostname(), "started": "x"}))
    assert run_state(path, read_manifest(path)) == "interrupted"
    cfg = CollectConfig(runs_dir=str(tmp_path / "runs"), tasks=2, resume=str(path))
    with open_run("collect", cfg, argv=[]) as run:
        assert run.path == path and read_lock(path)["pid"] == os.getpid()
        assert run.manifest.resumed == 1
    # a lock from a PID that now belongs to another process (different start time) is stale too
    (path / LOCK).write_text(
        json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": "x", "proc_start": "1"})
    )
    assert run_state(path, read_manifest(path).model_copy(update={"status": "running"})) == "interrupted"


def test_sigkilled_run_shows_interrupted_in_seed_runs(tmp_path):
    runs = tmp_path / "runs"
    code = (
        "import os, signal\n"
        "from seedcli.artifacts import open_run\n"
        "from seedcli.config import CollectConfig\n"
        f"cfg = CollectConfig(runs_dir={str(runs)!r}, tasks=2)\n"
        "with open_run('collect', cfg, argv=[]) as run:\n"
        "    run.file('trajectories.jsonl').write_text('{}\\n')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == -9
    (path,) = [p for p in (runs / "collect").iterdir() if p.is_dir()]
    assert read_manifest(path).status == "running" and (path / LOCK).exists()  # on disk: as the killed writer left it
    result = CliRunner().invoke(app, ["runs", "--runs-dir", str(runs)])
    assert result.exit_code == 0 and "interrupted" in result.stdout and "running" not in result.stdout


def test_seed_runs_all_lists_damaged_runs_with_the_reason(tmp_path):
    runs = tmp_path / "runs"
    good = _started_run(tmp_path)
    bad = runs / "collect" / "20260101T000000Z-deadbeef"
    bad.mkdir()
    (bad / "manifest.json").write_text("{not json")
    empty = runs / "eval" / "20260101T000000Z-00000000"
    empty.mkdir(parents=True)
    plain = CliRunner().invoke(app, ["runs", "--runs-dir", str(runs)])
    assert bad.name not in plain.stdout and "2 damaged run directories not shown: `seed runs --all`" in plain.stdout
    shown = CliRunner().invoke(app, ["runs", "--runs-dir", str(runs), "--all"])
    assert shown.exit_code == 0
    row = next(line for line in shown.stdout.splitlines() if bad.name in line)
    assert "damaged" in row and "not valid JSON" in row
    assert any(empty.name in line and "no manifest.json" in line for line in shown.stdout.splitlines())
    assert good.name in shown.stdout


# ------------------------------------------------------------------------------------ 7: lineage after a cd


def test_lineage_resolves_from_another_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    collect_cfg = CollectConfig(runs_dir="runs", tasks=2)  # relative, as a user types it
    with open_run("collect", collect_cfg, argv=[]) as c:
        c.file("trajectories.jsonl").write_text("{}\n")
        c.complete({"trajectories.jsonl": 1})
    with open_run("collect", CollectConfig(runs_dir="runs", tasks=3), argv=[]) as reader:
        path, manifest = resolve_input("collect", None, "runs")
        reader.add_input("collect", path, manifest)
        reader.file("trajectories.jsonl").write_text("{}\n")
        reader.complete({"trajectories.jsonl": 1})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    (ref,) = read_manifest(tmp_path / "runs" / "collect" / reader.id).inputs
    assert Path(ref.path).is_absolute() and ref.runs_path == f"collect/{c.id}"
    assert ref.locate() == (tmp_path / "runs" / "collect" / c.id).resolve()
    # the whole tree moved: still found through the runs root
    moved = tmp_path / "moved"
    (tmp_path / "runs").rename(moved)
    assert ref.locate() is None and ref.locate(moved) == (moved / "collect" / c.id).resolve()


# ------------------------------------------------------------------------------------------- 5: strict YAML


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("colect:\n  tasks: 2\n", "unknown section 'colect'; did you mean 'collect'?"),
        ("max_step: 3\n", "unknown key 'max_step'; did you mean 'max_steps'?"),
        ("collect:\n  tmperature: 0.5\n", "unknown key 'collect.tmperature'; did you mean 'temperature'?"),
        ("rl:\n  opd_coeff: 0.1\n", "unknown key 'rl.opd_coeff'; did you mean 'opd_coef'?"),
    ],
)
def test_typos_at_any_level_of_a_yaml_config_are_errors(tmp_path, text, needle):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(UserError) as err:
        build_config("collect", str(cfg))
    assert needle in str(err.value) and str(cfg) in str(err.value)


def test_a_valid_shared_key_for_another_stage_is_accepted():
    cfg_text = "max_steps: 3\nlr: 0.001\ncollect:\n  tasks: 2\n"  # lr belongs to sft/rl: fine in a shared preset
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"seed-shared-{os.getpid()}.yaml"
    path.write_text(cfg_text)
    try:
        cfg = build_config("collect", str(path))
        assert cfg.max_steps == 3 and cfg.tasks == 2
    finally:
        path.unlink()


# ---------------------------------------------------------------------------- 8: --resume DIR just works


def test_resume_dir_reads_the_saved_config_and_refuses_differing_options(tmp_path, monkeypatch):
    path = _started_run(tmp_path, temperature=0.7, model="models/tiny")
    monkeypatch.chdir(tmp_path / "runs")  # a different directory: runs_dir comes from the run itself
    cfg = build_config("collect", None, {"resume": str(path)})
    assert cfg.temperature == 0.7 and cfg.model == "models/tiny" and cfg.tasks == 2
    assert Path(cfg.runs_dir).resolve() == (tmp_path / "runs").resolve()
    assert cfg.config_hash() == read_manifest(path).config_hash
    same = build_config("collect", None, {"resume": str(path), "temperature": 0.7, "workers": 5})
    assert same.workers == 5  # options that do not change results may differ
    with pytest.raises(UserError) as err:
        build_config("collect", None, {"resume": str(path), "temperature": 0.9, "tasks": 4})
    msg = str(err.value)
    assert "temperature (run: 0.7, given: 0.9)" in msg and "tasks (run: 2, given: 4)" in msg
    with open_run("collect", cfg, argv=[]) as run:
        assert run.path.resolve() == path.resolve()


# ----------------------------------------------------------------------- 6: one-line errors, nothing left


def _tiny_model_dir(tmp_path: Path, config: str = '{"model_type": "qwen2"}', weights: bool = True) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(config)
    if weights:
        (d / "model.safetensors").write_bytes(b"x")
    return d


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        ("cuda", "--device cuda: no CUDA GPU is visible"),
        ("vllm", "--engine vllm: vLLM is not installed"),
        ("empty-config", "config.json is empty"),
        ("no-weights", "no weights"),
    ],
)
def test_unusable_device_engine_or_model_is_one_line_and_leaves_no_run(tmp_path, monkeypatch, setup, needle):
    import importlib.util

    import torch

    runs = tmp_path / "runs"
    model = _tiny_model_dir(
        tmp_path, config="" if setup == "empty-config" else '{"model_type": "qwen2"}', weights=setup != "no-weights"
    )
    args = ["collect", "--model", str(model), "--runs-dir", str(runs), "--tasks", "1"]
    if setup == "cuda":
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        args += ["--device", "cuda"]
    if setup == "vllm":
        real = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a))
        args += ["--engine", "vllm"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert needle in _one_line(result)
    assert not (runs / "collect").exists() or not any((runs / "collect").iterdir())


def test_a_run_that_fails_before_writing_anything_leaves_no_directory(tmp_path):
    cfg = CollectConfig(runs_dir=str(tmp_path), tasks=2)
    with pytest.raises(UserError):
        with open_run("collect", cfg, argv=[]) as run:
            run.file("trajectories.jsonl").touch()  # opened, nothing in it
            raise UserError("model failed to load")
    assert not run.path.exists() and not (tmp_path / "collect" / "latest").exists()


def test_an_unexpected_exception_is_one_line_plus_a_log_with_the_traceback(tmp_path, monkeypatch):
    import seedcli.stages.collect as collect_stage

    def boom(cfg):
        raise RuntimeError("something nobody planned for\nsecond line")

    monkeypatch.setattr(collect_stage, "run", boom)
    runs = tmp_path / "runs"
    result = CliRunner().invoke(app, ["collect", "--runs-dir", str(runs), "--tasks", "1"])
    assert result.exit_code == 1
    line = _one_line(result)
    assert "unexpected RuntimeError: something nobody planned for" in line and "second line" not in line
    log = Path(line.split("traceback in ")[1].split(";")[0])
    assert log.parent == runs / "logs" and log.exists()
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "second line" in text and "def boom" not in line


def test_seed_env_shows_the_resolved_data_roots(alfworld_root):
    result = CliRunner().invoke(app, ["env"])
    info = json.loads(result.stdout)
    assert info["data_roots"]["alfworld"] == str(alfworld_root)


# ------------------------------------------------------------------------------------------ 11: plot noise


def test_plots_label_latest_by_its_run_and_use_whole_step_ticks(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from seedcli.report.commands import _run_label
    from seedcli.report.plots import _draw_family

    run = tmp_path / "rl" / "20260101T000000Z-abcdef12"
    run.mkdir(parents=True)
    (tmp_path / "rl" / "latest").symlink_to(run.name)
    assert _run_label(tmp_path / "rl" / "latest") == run.name
    fig, ax = plt.subplots()
    _draw_family(ax, "loss", "loss", [(run.name, "", "actor/pg_loss", [1, 2], [0.5, 0.25])], {run.name: "C0"})
    ticks = [t for t in ax.get_xticks() if 1 <= t <= 2]
    assert ticks and all(float(t).is_integer() for t in ticks)
    plt.close(fig)
