"""Issue 55 §7: the environment's faults are one line, not a crash. A full disk (ENOSPC) is one line, exit 2, with
the run left failed and resumable and no temp file behind; an --out that is a file, a --model that is a file, a
--gguf that is a directory, a truncated model or a missing tokenizer are one line each; Ctrl-C of `seed model init`
says what was kept (exit 130); Typer's range and type errors are the one `error:` line; the warm start prints the
epoch loss its manifest records."""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedcli.artifacts import read_manifest
from seedcli.artifacts.staging import staging_dir
from seedcli.cli import app
from seedcli.records import JsonlWriter, dumps
from tests.helpers_cli import start_model_init
from tests.helpers_models import build_test_model

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_test_model(tmp_path_factory.mktemp("tiny") / "model")


def _one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and lines and lines[-1].startswith("error: "), result.output
    assert not any("Traceback" in line or "unexpected" in line for line in lines), result.output
    return lines[-1]


# ------------------------------------------------------------------------------------------------ a full disk


class FullDisk:
    """The disk fills after `after` trajectories: the next one is cut half-way (as a real full disk cuts it), and
    every fsync of a temp file (the atomic writes' of the manifest) fails with ENOSPC; rewriting a file's own bytes
    in place (which allocates nothing) still works, as it does on a full disk."""

    def __init__(self, monkeypatch, after: int):
        self.after, self.written, self.full = after, 0, False
        real_write, real_fsync = JsonlWriter.write, os.fsync

        def write(writer, record):
            if writer.path.name == "trajectories.jsonl":
                self.written += 1
                self.full = self.full or self.written > self.after
            if self.full:
                data = dumps(record)
                writer._fh.write(data[: len(data) // 2])
                writer._fh.flush()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(writer.path))
            real_write(writer, record)

        def fsync(fd):
            if self.full and os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_fsync(fd)

        monkeypatch.setattr(JsonlWriter, "write", write)
        monkeypatch.setattr(os, "fsync", fsync)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="the fault names its files through /proc")
def test_a_full_disk_is_one_line_and_the_run_resumes_after_space_is_freed(tiny_model, tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    args = ["collect", "--env", "ezpoints", "--model", str(tiny_model), "--runs-dir", str(runs), "--tasks", "3",
            "--rollouts", "2", "--max-new-tokens", "8", "--workers", "0", "--json"]  # fmt: skip
    with monkeypatch.context() as patch:
        FullDisk(patch, after=2)
        r = runner.invoke(app, args)
    line = _one_error_line(r)
    [run_dir] = (runs / "collect").iterdir()
    assert re.fullmatch(
        rf"error: no space left on \S+ \(\d+ MB free\); free space and run `seed collect --resume {run_dir}` "
        r"\(what was written is kept\)",
        line,
    ), line
    manifest = read_manifest(run_dir)
    assert manifest.status == "failed" and "No space left on device" in manifest.error  # not `running` forever
    assert not [p.name for p in run_dir.rglob("*") if p.name.endswith(".tmp")]  # no temp file survives
    # space freed: the resume keeps the two episodes on disk (the cut third is dropped) and plays the rest
    r = runner.invoke(app, ["collect", "--resume", str(run_dir), "--json"])
    assert r.exit_code == 0, r.output
    manifest = read_manifest(run_dir)
    assert manifest.status == "complete" and manifest.metrics["episodes"] == 6
    assert manifest.metrics["resumed_episodes"] == 2


# --------------------------------------------------------------------------------------- paths that are wrong


def test_out_model_and_gguf_paths_of_the_wrong_kind_are_one_line(tiny_model, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    runs = tmp_path / "runs"
    ev = runner.invoke(app, ["eval", "--policy", "expert", "--env", "ezpoints", "--limit", "2", "--workers", "0",
                             "--runs-dir", str(runs), "--json"])  # fmt: skip
    assert ev.exit_code == 0, ev.output
    eval_run = runs / "eval" / "latest"
    for cmd in (["report", str(eval_run)], ["plot", str(eval_run)], ["model", "init"]):
        line = _one_error_line(runner.invoke(app, [*cmd, "--out", str(afile)]))
        assert f"--out {afile}: a file, not a directory" in line
    assert afile.read_text() == "x"
    # --model FILE: what it is, and a suggestion that works (not `seed model init --out FILE`)
    line = _one_error_line(runner.invoke(app, ["collect", "--model", str(tiny_model / "config.json"),
                                               "--runs-dir", str(runs)]))  # fmt: skip
    assert "a file, not a model directory" in line and f"(e.g. {tiny_model})" in line and "model init" not in line
    # --gguf DIR: a directory, not "no such file"; the .gguf files it holds are named
    (tmp_path / "ggufs").mkdir()
    (tmp_path / "ggufs" / "q.gguf").write_bytes(b"GGUF")
    line = _one_error_line(runner.invoke(app, ["model", "import", "--gguf", str(tmp_path / "ggufs"),
                                               "--out", str(tmp_path / "m")]))  # fmt: skip
    assert "a directory, not a GGUF file" in line and "q.gguf" in line and not (tmp_path / "m").exists()


def test_a_truncated_model_or_a_missing_tokenizer_is_one_line_before_the_warm_start(tiny_model, tmp_path):
    truncated, no_tokenizer = tmp_path / "truncated", tmp_path / "no_tokenizer"
    shutil.copytree(tiny_model, truncated)
    shutil.copytree(tiny_model, no_tokenizer)
    weights = truncated / "model.safetensors"
    size = weights.stat().st_size
    os.truncate(weights, size // 3)
    for f in no_tokenizer.glob("tokenizer*"):
        f.unlink()
    runs = tmp_path / "runs"
    common = ["--runs-dir", str(runs), "--env", "ezpoints", "--tasks", "1", "--epochs", "1", "--workers", "0"]
    line = _one_error_line(runner.invoke(app, ["warmstart", "--model", str(truncated), *common]))
    assert f"model.safetensors is truncated or damaged ({size // 3} bytes, its header says {size})" in line
    line = _one_error_line(runner.invoke(app, ["warmstart", "--model", str(no_tokenizer), *common]))
    assert "no tokenizer (tokenizer.json" in line
    assert not runs.exists()  # refused before a run directory was made


# ------------------------------------------------------------------------------------------------------ Ctrl-C


def _sigint_as_at_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_of_model_init_says_what_was_kept_and_exits_130(tmp_path):
    """Ctrl-C at a terminal while the model is being built. The child gets SIGINT's default disposition, as a
    terminal's foreground job does: a test run started in the background (`make test &`, a CI runner's job) ignores
    SIGINT, and an ignored signal stays ignored across exec: the build would finish as if never interrupted."""
    out = tmp_path / "agent"
    proc = start_model_init(out, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_sigint_as_at_a_terminal)  # fmt: skip
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1] == (
        f"interrupted; {out} was left as it was and the partial model in {staging_dir(out)} removed, so run "
        "`seed model init` again"
    )
    assert not out.exists() and not staging_dir(out).exists()


# ------------------------------------------------------------------------------------ Typer's usage errors


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["model", "init", "--out", "x", "--noise", "1.5"], "Invalid value for '--noise'"),
        (["model", "init", "--out", "x", "--epochs", "abc"], "Invalid value for '--epochs'"),
        (["model", "init"], "Missing option '--out'"),
        (["collect", "--bogus"], "No such option: --bogus"),
        (["report"], "Missing argument 'runs'"),
        (["retriever", "serve", "--corpus", "c", "--topk", "0"], "Invalid value for '--topk'"),
        (["colect"], "No such command 'colect'"),
    ],
)
def test_usage_errors_are_the_one_error_line(args, says):
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and r.stdout == "", r.output
    [line] = r.stderr.strip().splitlines()  # no usage box: one line
    assert line.startswith(f"error: {says}") and line.endswith("--help`)") and "╭" not in line


# ------------------------------------------------------------------------------------ the warm start's epoch loss


def test_the_epoch_loss_printed_is_the_one_the_manifest_records(tiny_model, tmp_path):
    runs = tmp_path / "runs"
    r = runner.invoke(app, ["warmstart", "--model", str(tiny_model), "--runs-dir", str(runs), "--env", "ezpoints",
                            "--tasks", "3", "--epochs", "2", "--workers", "0", "--check-turns", "0",
                            "--check-skills", "0", "--cache-dir", str(tmp_path / "cache"), "batch_tokens=1024",
                            "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    printed = [float(m) for m in re.findall(r"epoch \d+ done: response NLL ([\d.]+) \(mean of its \d+ batches\)",
                                            r.stderr)]  # fmt: skip
    recorded = read_manifest(runs / "warmstart" / "latest").metrics["train/epoch_response_nll"]
    assert len(printed) == 2 and printed == [round(x, 3) for x in recorded], (printed, recorded)
