"""What the one-line messages promise, kept (issue 62 §3): the full disk's `--resume` resumes after a record cut
mid-line (a simulated ENOSPC, and a real full tmpfs where this process may mount one), a read-only runs directory is
one line as the full disk is, `leak_guard=off` is the option `off` and not YAML's False, and each message that pointed
somewhere wrong (a missing extra's brackets, SDAR's library, an OpenEnv app that is no web app, `probe --from` a run
of another environment, `--model ORG/NAME@`, a 5,000-character `--model`) says what is so. CLI in process (typer's
runner) where it can be; a subprocess for the real filesystem."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedcli.cli import app
from seedcli.config import build_config
from seedcli.errors import UserError

runner = CliRunner()

# a game with an expert and no data (each record a few hundred bytes): 12 test tasks, won in 3 moves
GAME = '''
from seedcli.envs import TextEnv


class Steps(TextEnv):
    """Walk to the end of a short corridor."""

    max_steps = 4

    def tasks(self, split):
        return [{"id": f"t{i}", "length": 3} for i in range(12 if split == "test" else 4)]

    def reset(self, task):
        self.left = task["length"]
        return f"{self.left} steps to the end."

    def step(self, action):
        self.left -= action == "walk"
        if self.left == 0:
            return "The end.", 1.0, True
        return f"{self.left} steps to the end.", 0.0, False, {"invalid": action != "walk"}

    def admissible(self):
        return ["walk", "wait"]

    def expert(self):
        return "walk"
'''


@pytest.fixture
def game(tmp_path, monkeypatch) -> str:
    """`--env` of the game above, importable here and in the env workers."""
    folder = tmp_path / "plugin"
    folder.mkdir()
    (folder / "steps_game.py").write_text(GAME)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(folder), os.environ.get("PYTHONPATH")))))
    return "steps_game:Steps"


def _invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "400", "NO_COLOR": "1"})


def _one_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    return lines[0]


# ------------------------------------------------------------------------------------------------------ full disk


class FullDisk(io.RawIOBase):
    """A file on a disk with `room` bytes left: a write past it stores what fits and then fails with ENOSPC (as a
    network or FUSE mount reports it: part of the data reached the disk), after which the space is back (the failed
    run freed its temporary files)."""

    def __init__(self, path, disk: dict):
        self.real, self.disk = io.FileIO(path, "ab"), disk

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.real.fileno()

    def write(self, data) -> int:
        data = bytes(data)
        if len(data) > self.disk["room"]:
            self.real.write(data[: self.disk["room"]])
            self.disk["room"] = 1 << 40
            raise OSError(errno.ENOSPC, "No space left on device", str(self.real.name))
        self.disk["room"] -= len(data)
        return self.real.write(data)

    def close(self) -> None:
        self.real.close()
        super().close()


def test_a_disk_full_mid_line_resumes_from_the_last_whole_record(game, tmp_path, monkeypatch):
    from seedcli import records
    from seedcli.stages import eval as eval_stage

    disk = {"room": 0}

    def on_a_full_disk(file, mode="r", buffering=-1, *args, **kw):
        if Path(file).name == "episodes.jsonl" and "a" in mode:
            raw = FullDisk(file, disk)
            return raw if buffering == 0 else io.BufferedWriter(raw)
        return open(file, mode, buffering, *args, **kw)

    monkeypatch.setattr(records, "open", on_a_full_disk, raising=False)
    cfg = build_config("eval", cli={"env": game, "policy": "expert", "runs_dir": str(tmp_path / "runs"), "workers": 0})
    disk["room"] = 5000  # a record is about 2.4 kB: the disk fills in the middle of the third
    with pytest.raises(OSError) as full:
        eval_stage.run(cfg)
    assert full.value.errno == errno.ENOSPC
    run_dir = next((tmp_path / "runs" / "eval").glob("2*"))
    kept = (run_dir / "episodes.jsonl").read_bytes()
    # `seed eval --resume DIR`, as the disk-full message says: the episodes on disk are kept, the rest played
    again = eval_stage.run(build_config("eval", cli={"resume": str(run_dir), "workers": 0}))
    assert again.status == "complete" and again.metrics["games"] == 12 and again.metrics["wins"] == 12
    assert kept.count(b"\n") == 2 and kept.endswith(b"\n")  # whole records only: the half on the disk was cut
    ids = [records.Trajectory.model_validate_json(x).episode_id for x in (run_dir / "episodes.jsonl").open("rb")]
    assert sorted(ids) == [f"e{i:04d}" for i in range(12)]


def test_a_record_retried_whole_after_its_half_is_cut_on_resume(tmp_path, capsys):
    from seedcli.records import Trajectory, repair_tail
    from seedcli.stages.common import read_done

    path = tmp_path / "episodes.jsonl"
    whole = _trajectory_line("e0000")
    torn = _trajectory_line("e0001")
    path.write_bytes(whole + torn[:100] + torn)  # a buffered writer retried the whole record after its half
    assert set(read_done(path)) == {"e0000"}  # the torn last line is cut, as a journal does
    assert path.read_bytes() == whole and "cut its half-written last line" in capsys.readouterr().err
    path.write_bytes(torn[:100] + torn + whole)  # a bad line before good ones is damage: the reader names it
    assert repair_tail(path, Trajectory) == 0
    with pytest.raises(UserError, match=r"episodes.jsonl:1: not a valid Trajectory record"):
        read_done(path)


def test_a_last_line_cut_before_its_newline_is_cut_and_said(tmp_path, capsys):
    from seedcli.stages.common import read_done

    path = tmp_path / "episodes.jsonl"
    whole = _trajectory_line("e0000")
    path.write_bytes(whole + _trajectory_line("e0001")[:100])  # the disk filled before the record's end
    assert set(read_done(path)) == {"e0000"} and path.read_bytes() == whole
    assert "cut its half-written last line (100 bytes)" in capsys.readouterr().err


def _trajectory_line(episode_id: str) -> bytes:
    from seedcli.records import Trajectory, dumps

    fields = {"env": "steps_game:Steps", "task_id": "t0", "split": "test", "category": "all", "task": "walk"}
    played = {"turns": [], "won": False, "reward": 0.0, "length": 0, "engine": "", "model_id": "", "model_hash": ""}
    return dumps(
        Trajectory(
            episode_id=episode_id, group_id=episode_id, sampling={}, prompt_version="v", seed=0, **fields, **played
        )
    )


def _tmpfs(path: Path, size: str, *options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    opts = ",".join((f"size={size}", *options))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}); the simulated tests cover it")


def _umount(path: Path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True)


@pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="mounting a tmpfs needs root on Linux")
def test_a_real_full_filesystem_resumes(game, tmp_path):
    disk = tmp_path / "disk"
    _tmpfs(disk, "24k")
    try:
        seed = [sys.executable, "-m", "seedcli", "eval", "--env", game, "--policy", "expert", "--runs-dir"]
        env = {**os.environ, "PYTHONPATH": os.environ["PYTHONPATH"]}
        full = subprocess.run([*seed, str(disk / "runs")], capture_output=True, text=True, cwd=tmp_path, env=env)
        assert full.returncode == 2 and "no space left on" in full.stderr, full.stderr
        resume = full.stderr.split("`")[1]  # the command the message gives
        assert resume.startswith("seed eval --resume ")
        subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)
        again = subprocess.run(
            [sys.executable, "-m", "seedcli", *resume.split()[1:], "--json"], capture_output=True, text=True,
            cwd=tmp_path, env=env,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
        assert '"games": 12' in again.stdout and '"status": "complete"' in again.stdout
    finally:
        _umount(disk)


# -------------------------------------------------------------------------------------------- read-only runs dir


def test_a_read_only_runs_dir_is_one_line(game, tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    real_mkdir = os.mkdir

    def read_only(path, *args, **kw):
        if str(path).startswith(str(runs)):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_mkdir(path, *args, **kw)

    monkeypatch.setattr(os, "mkdir", read_only)
    monkeypatch.setattr("seedcli.artifacts.CURRENT_RUN", None)  # (no run of this command was opened before)
    line = _one_line(_invoke("eval", "--env", game, "--policy", "expert", "--runs-dir", str(runs)))
    assert "is read-only" in line and "--runs-dir DIR" in line and "unexpected" not in line


@pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="mounting a tmpfs needs root on Linux")
def test_a_real_read_only_filesystem_is_one_line(game, tmp_path):
    disk = tmp_path / "ro"
    _tmpfs(disk, "1m", "ro")
    try:
        env = {**os.environ, "PYTHONPATH": os.environ["PYTHONPATH"]}
        done = subprocess.run(
            [sys.executable, "-m", "seedcli", "eval", "--env", game, "--policy", "expert", "--runs-dir", str(disk)],
            capture_output=True, text=True, cwd=tmp_path, env=env,
        )  # fmt: skip
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert f"the file system at {disk} is read-only" in done.stderr
    finally:
        _umount(disk)


@pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="a bind mount needs root on Linux")
def test_a_read_only_bind_mount_is_named_not_its_device_root(tmp_path):
    # a bind mount shares its device with its parent, so a walk up by os.path.ismount named "/" (writable)
    from seedcli.cli.common import mount_of, not_writable_message

    src, disk = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    disk.mkdir()
    if subprocess.run(["mount", "--bind", str(src), str(disk)], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount here; the tmpfs test covers a read-only file system")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(disk)], capture_output=True, check=True)
        assert mount_of(disk / "runs" / "eval") == disk
        exc = OSError(errno.EROFS, "Read-only file system", str(disk / "runs"))
        assert f"the file system at {disk} is read-only" in not_writable_message(exc, "eval")
    finally:
        _umount(disk)


# --------------------------------------------------------------------------------------- YAML's booleans as words


def test_off_and_on_are_the_options_not_yaml_booleans(tmp_path):
    cfg = build_config("rl", overrides=["leak_guard=off", "opd_retire=off"])
    assert (cfg.leak_guard, cfg.opd_retire) == ("off", "off")
    preset = tmp_path / "guard.yaml"
    preset.write_text("rl:\n  leak_guard: off\n")  # as a preset writes it (YAML 1.1: False)
    assert build_config("rl", str(preset)).leak_guard == "off"
    assert build_config("rl", overrides=["leak_guard=mask"]).leak_guard == "mask"
    with pytest.raises(UserError, match=r"field 'leak_guard'"):  # `on` is no option of leak_guard: still refused
        build_config("rl", overrides=["leak_guard=on"])
    # the message the oracle's check writes is a command that works
    with pytest.raises(UserError, match=r"set leak_guard=off") as err:
        build_config("rl", overrides=["analyzer=oracle", "leak_guard=mask"])
    fixed = str(err.value).split("set ")[1].split(" ")[0]
    assert build_config("rl", overrides=["analyzer=oracle", fixed]).leak_guard == "off"
    # an environment's options too: a field whose words YAML reads as booleans
    from typing import Literal

    from seedcli.envs.base import EnvOptions

    class Switch(EnvOptions):
        light: Literal["on", "off", "dim"] = "dim"
        answer: Literal["yes", "no"] = "no"

    assert Switch.model_validate({"light": True, "answer": False}).model_dump() == {"light": "on", "answer": "no"}


# ----------------------------------------------------------------------------------------------- the messages


def test_a_missing_extra_names_the_extra_with_its_brackets(tmp_path, monkeypatch):
    from seedcli.envs.adapters import require, textarena

    # as if the extra were not installed: the library does not import (and no game list is cached)
    monkeypatch.setattr(textarena, "_library", lambda: require("textarena_absent", "textarena", textarena.PYPI, "TA"))
    textarena.single_player_games.cache_clear()
    args = ("--env", "textarena", "--env-options", "{game: GuessTheNumber}", "--policy", "expert", "workers=0")
    line = _one_line(_invoke("eval", *args, "--runs-dir", str(tmp_path)))
    textarena.single_player_games.cache_clear()
    assert "install it with pip install -e '.[textarena]'" in line


@pytest.mark.parametrize("env", ["ezpoints", "sokoban"])
def test_sdar_without_a_shipped_library_names_the_environment(env):
    from seedcli.stages.rl import resolve_plan

    with pytest.raises(UserError) as err:
        resolve_plan(build_config("rl", cli={"env": env, "algo": "sdar"}))
    text = str(err.value)
    title = {"ezpoints": "EZPoints", "sokoban": "Sokoban"}[env]
    assert f"ships none for {title}" in text and "--analyzer static:FILE" in text
    assert f"static_skills_{env}.json" not in text  # no file that does not exist
    with pytest.raises(UserError) as none:
        resolve_plan(build_config("rl", cli={"env": env, "algo": "sdar", "analyzer": "none"}))
    assert "static_skills.json" not in str(none.value)  # ALFWorld's is no default here


def test_an_openenv_app_that_is_not_a_web_app_fails_at_once(tmp_path, monkeypatch):
    pytest.importorskip("uvicorn")
    from seedcli.envs.adapters.openenv import START_TIMEOUT_S, serve

    (tmp_path / "not_a_server.py").write_text("app = 42\n")
    monkeypatch.chdir(tmp_path)
    t0 = time.monotonic()
    with pytest.raises(UserError) as err:
        serve("not_a_server:app")
    assert time.monotonic() - t0 < START_TIMEOUT_S / 3  # not the 60 s timeout
    assert "is not an OpenEnv server" in str(err.value) and "HTTP 500" in str(err.value)
    assert "'int' object is not callable" in str(err.value)


def _complete(stage: str, cfg, inputs=()) -> Path:
    from seedcli.artifacts import open_run

    with open_run(stage, cfg, argv=[]) as run:
        for s, p in inputs:
            run.add_input(s, p)
        run.file("out.txt").write_text("x")
        run.complete({"out.txt": None})
    return run.path


def test_probe_from_a_run_of_another_environment_suggests_no_model_path(tmp_path):
    from seedcli.config import CollectConfig

    runs = str(tmp_path / "runs")
    collect = _complete("collect", CollectConfig(runs_dir=runs, env="ezpoints", tasks=2))
    line = _one_line(_invoke("probe", "--env", "sokoban", "--from", str(collect), "--runs-dir", runs))
    assert "--env sokoban" in line and "played ezpoints" in line
    assert "--model" not in line and "/model" not in line  # a collect run holds no model to start from
    shown = _invoke("probe", "--from", str(collect), "--runs-dir", runs, "--print-config")
    assert shown.exit_code == 0 and "env: ezpoints" in shown.stdout  # without --env: the run's environment


def test_an_empty_revision_is_not_a_directory_to_build(tmp_path):
    line = _one_line(_invoke("eval", "--model", "org/name@", "--runs-dir", str(tmp_path)))
    assert "nothing after the '@'" in line and "seed model init" not in line


def test_a_model_name_too_long_for_a_path_is_one_line(tmp_path):
    line = _one_line(_invoke("eval", "--model", "m" * 5000, "--runs-dir", str(tmp_path)))
    assert "a name of 5,000 characters" in line and "unexpected" not in line and len(line) < 400
    assert not (tmp_path / "logs").exists()  # no crash log: nothing unexpected happened
