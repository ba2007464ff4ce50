"""Probes of the CPU build run as a new user would, which once ended with a result that was wrong without saying so:
a text-only model on image observations played blind and ended `complete`; Ctrl-C before anything was written
removed the run and still said `--resume`. (The third, annotate reusing another endpoint's answers, is in
test_annotate.py.)"""

from __future__ import annotations

import pytest

from seedcli.envs import get_env
from seedcli.errors import UserError
from seedcli.stages.common import check_model_sees
from tests.helpers_cli import seed_cli
from tests.helpers_models import build_test_model

IMAGE = "{observation: image}"


@pytest.fixture(scope="module")
def tiny_text(tmp_path_factory):
    return build_test_model(tmp_path_factory.mktemp("m") / "tiny")


@pytest.mark.parametrize("stage", ["eval", "collect"])
def test_a_text_model_on_image_observations_is_refused_in_one_line(tmp_path, tiny_text, stage):
    runs = tmp_path / "runs"
    extra = ["--limit", "2"] if stage == "eval" else ["--tasks", "1", "--rollouts", "1"]
    proc = seed_cli(stage, "--env", "sokoban", "--model", str(tiny_text), "--env-options", IMAGE, *extra,
                    "--runs-dir", str(runs), check=False)  # fmt: skip
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "text-only model (no vision tower) cannot see Sokoban's image observations" in lines[0]
    assert "tiny-vl" in lines[0] and "{observation: text}" in lines[0]  # how to fix it
    assert not (runs / stage).exists() or not any((runs / stage).iterdir())  # nothing was started


def test_a_vision_model_or_text_observations_pass_the_check(tmp_path, tiny_text):
    from seedcli.engines.vision import vl_parts

    tokenizer, config, processor = vl_parts("tiny-vl", ["<think>up</think>"])
    config.save_pretrained(tmp_path / "vl")  # the check reads the config: a vision tower is there
    check_model_sees(get_env("sokoban", observation="image"), tmp_path / "vl")
    check_model_sees(get_env("sokoban"), tiny_text)
    with pytest.raises(UserError, match="--from .*text-only model"):
        check_model_sees(get_env("ezpoints", observation="image"), tiny_text, "--from")


def _interrupted_collect(monkeypatch, tmp_path, tiny_text, write_first: bool):
    """`seed collect` whose body is stopped by Ctrl-C, after writing an episode or before writing anything."""
    from typer.testing import CliRunner

    from seedcli.artifacts import open_run
    from seedcli.cli import app
    from seedcli.stages import collect

    def stopped(cfg):
        with open_run("collect", cfg) as run:
            if write_first:
                run.file("trajectories.jsonl").write_text('{"episode_id": "g0000-r00"}\n')
            raise KeyboardInterrupt

    monkeypatch.setattr(collect, "run", stopped)
    runs = tmp_path / "runs"
    result = CliRunner().invoke(app, ["collect", "--model", str(tiny_text), "--runs-dir", str(runs)])
    dirs = [p for p in (runs / "collect").iterdir() if p.is_dir() and not p.is_symlink()]
    return result, dirs


def test_ctrl_c_before_anything_was_written_says_nothing_was_kept(monkeypatch, tmp_path, tiny_text):
    result, dirs = _interrupted_collect(monkeypatch, tmp_path, tiny_text, write_first=False)
    said = " ".join(result.output.split())  # the console wraps long lines
    assert result.exit_code == 130 and dirs == []  # the empty run was removed
    assert "nothing was kept" in said and "start `seed collect` again" in said and "--resume" not in said


def test_ctrl_c_after_an_episode_was_written_names_the_run_to_resume(monkeypatch, tmp_path, tiny_text):
    result, dirs = _interrupted_collect(monkeypatch, tmp_path, tiny_text, write_first=True)
    assert result.exit_code == 130 and len(dirs) == 1
    squeezed = "".join(result.output.split())  # the console wraps long lines, even inside the path
    assert f"continuewith`seedcollect--resume{dirs[0]}`" in squeezed
