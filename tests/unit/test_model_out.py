"""Issue 55 §6: models are never overwritten. `seed model init` / `import` refuse an --out that holds a model (unless
--force), take the writer lock the stages take, and build beside --out then rename into place: a killed writer leaves
nothing at --out, and the next writer says what it found and clears it (or puts back the model a `--force`
replacement had moved aside)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedcli.artifacts.lock import LOCK
from seedcli.artifacts.staging import REPLACED, model_output, staging_dir
from seedcli.cli import app
from seedcli.errors import UserError
from tests.helpers_cli import start_model_init

runner = CliRunner()


def _model(path: Path, marker: str) -> Path:
    """A directory that reads as a model (config.json + a marker of which one it is)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2", "which": marker}))
    (path / "model.safetensors").write_bytes(marker.encode())
    return path


def _which(path: Path) -> str:
    return json.loads((path / "config.json").read_text())["which"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_model_init_refuses_an_existing_model_and_a_file(tmp_path):
    out = _model(tmp_path / "agent", "warm-started")
    for extra in ([], ["--warm-start", "expert", "--env", "ezpoints", "--tasks", "1"]):
        r = runner.invoke(app, ["model", "init", "--preset", "tiny", "--out", str(out), *extra])
        assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.output
        assert f"--out {out} holds a model already; pass --force to replace it" in r.stderr
    assert _which(out) == "warm-started" and sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
    ]
    assert not staging_dir(out).exists()
    afile = tmp_path / "afile"
    afile.write_text("x")
    for cmd in (["model", "init"], ["model", "import", "--gguf", str(afile)]):
        r = runner.invoke(app, [*cmd, "--out", str(afile)])
        assert r.exit_code == 2 and "a file, not a directory" in r.stderr, r.output
    assert afile.read_text() == "x"


def test_force_replaces_only_once_the_new_model_is_built(tmp_path):
    out = _model(tmp_path / "agent", "old")
    with pytest.raises(UserError, match="holds a model already"):
        with model_output(out):
            pass
    with pytest.raises(RuntimeError, match="boom"):  # the build fails: the old model stays, nothing is left beside
        with model_output(out, force=True) as build:
            _model(build, "half")
            raise RuntimeError("boom")
    assert _which(out) == "old" and not staging_dir(out).exists()
    with model_output(out, force=True) as build:
        assert build.parent == staging_dir(out) and not build.exists()
        _model(build, "new")
        assert _which(out) == "old"  # still the old one while the new one is built
    assert _which(out) == "new" and not staging_dir(out).exists()


def test_a_second_writer_of_the_same_out_is_refused_while_the_first_runs(tmp_path):
    out = tmp_path / "agent"
    with model_output(out) as build:  # this process holds the lock, as a warm start of `model init` would
        r = runner.invoke(app, ["model", "init", "--preset", "tiny", "--out", str(out)])
        assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.output
        assert f"--out {out} is being written by PID {os.getpid()}" in r.stderr and "kill" in r.stderr
        _model(build, "first")
    assert _which(out) == "first"


def test_a_killed_model_init_leaves_nothing_at_out_and_the_rerun_clears_its_partial_model(tmp_path):
    out = tmp_path / "agent"
    proc = start_model_init(out, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()  # before: the half-built model sat at --out
    assert (staging_dir(out) / LOCK).exists()  # the killed writer's lock, and its partial model beside --out
    notes: list[str] = []
    with model_output(out, say=notes.append) as again:
        _model(again, "rebuilt")
    assert _which(out) == "rebuilt" and not staging_dir(out).exists()
    assert len(notes) == 1 and notes[0].startswith(f"note: removed a partial model for {out}")
    assert f"PID {proc.pid}" in notes[0]


def test_an_interrupted_force_replacement_puts_the_old_model_back(tmp_path):
    out = tmp_path / "agent"
    staging = staging_dir(out)
    _model(staging / REPLACED, "old")  # killed between moving the old model aside and renaming the new one in
    _model(staging / "model", "new-but-unchecked")
    (staging / LOCK).write_text(json.dumps({"pid": _dead_pid(), "host": os.uname().nodename, "started": "then"}))
    notes: list[str] = []
    with pytest.raises(UserError, match="holds a model already"):  # the old model is back, so no --force: refused
        with model_output(out, say=notes.append):
            pass
    assert _which(out) == "old" and notes[0].startswith(f"note: restored {out}")
    assert "removed a partial model" in notes[1] and not staging.exists()
