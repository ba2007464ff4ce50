"""The warm start as a stage (issue 28): its config model, its `warmstart:` section in a YAML, `seed warmstart`'s
face (help, --print-config, one-line errors) and `seed model init --warm-start` refusing bad values before it builds
anything. In-process (typer's runner); nothing here trains."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedcli.artifacts import model_run, open_run, read_manifest
from seedcli.cli import app
from seedcli.cli.model import _warm_start_config
from seedcli.config import STAGE_CONFIGS, WarmStartConfig, build_config
from seedcli.errors import UserError

runner = CliRunner()


def _invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "400", "NO_COLOR": "1"})


def _flat(text: str) -> str:
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def test_the_config_is_a_stage_config_with_every_field_described():
    assert STAGE_CONFIGS["warmstart"] is WarmStartConfig
    assert all(f.description for f in WarmStartConfig.model_fields.values())
    cfg = WarmStartConfig()
    # the defaults of the warm start before it was a stage (tasks 240, epochs 4, lr 1e-3, ...), shape kept
    assert (cfg.tasks, cfg.epochs, cfg.noise, cfg.lr) == (240, 4, 0.2, 1e-3)
    assert (cfg.prompt_weight, cfg.batch_tokens) == (0.5, 4096)
    assert (cfg.analysis_max_chars, cfg.check_turns, cfg.check_skills, cfg.skill_writing) == (6000, 64, 8, True)
    assert cfg.shape == "keep" and cfg.env == "alfworld" and cfg.max_steps is None and cfg.history is None
    # workers, threads and the cache do not change what is computed: left out of the hash
    assert cfg.config_hash() == WarmStartConfig(workers=0, threads=3, cache_dir="/tmp/x").config_hash()
    assert cfg.config_hash() != WarmStartConfig(tasks=12).config_hash()
    assert WarmStartConfig(games=12).config_hash() == WarmStartConfig(tasks=12).config_hash()  # the old name
    assert WarmStartConfig(env=" Sokoban ").env == "sokoban"


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("tasks=0", "field 'tasks': Input should be greater than or equal to 1"),
        ("noise=1.0", "field 'noise': Input should be less than 1"),
        ("env=sokobn", "unknown environment 'sokobn'; did you mean 'sokoban'?"),
        ("shape=big", "field 'shape'"),
        ("taskz=3", "field 'taskz' is not a warmstart key; did you mean 'tasks'?"),
    ],
)
def test_bad_values_are_one_line_user_errors(override, says):
    with pytest.raises(UserError) as err:
        build_config("warmstart", None, {}, [override])
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_config_file_section_and_overrides(tmp_path):
    path = tmp_path / "ws.yaml"
    path.write_text("seed: 3\nenv: sokoban\nwarmstart:\n  games: 12\n  epochs: 2\nsft:\n  epochs: 1\n")
    cfg = build_config("warmstart", str(path), {"lr": 5e-5}, ["prompt_weight=0"])
    assert (cfg.seed, cfg.env, cfg.tasks, cfg.epochs, cfg.lr, cfg.prompt_weight) == (3, "sokoban", 12, 2, 5e-5, 0.0)
    path.write_text("warmstart:\n  tsks: 12\n")
    with pytest.raises(UserError, match=r"unknown key 'warmstart.tsks'; did you mean 'tasks'\?"):
        build_config("warmstart", str(path))


def test_help_print_config_and_a_bad_config_on_the_command_line(tmp_path):
    help_text = _flat(_invoke("warmstart", "--help").output)
    for option in ("--model", "--env", "--tasks", "--noise", "--shape", "--print-config", "--json", "--config"):
        assert option in help_text
    assert "share of turns that play a random admissible action" in help_text
    shown = _invoke("warmstart", "--env", "sokoban", "--print-config", "tasks=7")
    assert shown.exit_code == 0 and "tasks: 7" in shown.stdout and "env: sokoban" in shown.stdout
    bad = _invoke("warmstart", "--runs-dir", str(tmp_path / "runs"), "epochs=0")
    assert bad.exit_code == 2 and "field 'epochs'" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    missing = _invoke("warmstart", "--runs-dir", str(tmp_path / "runs"), "--model", str(tmp_path / "nope"))
    assert missing.exit_code == 2 and "no such directory" in missing.stderr
    no_model = _invoke("warmstart", "--runs-dir", str(tmp_path / "runs"))
    assert no_model.exit_code == 2 and "no model given: pass --model DIR" in no_model.stderr
    assert not (tmp_path / "runs").exists()  # nothing was written


def test_model_init_refuses_bad_warm_start_values_before_building(tmp_path):
    out = tmp_path / "m"
    bad = _invoke("model", "init", "--out", str(out), "--warm-start", "expert", "--tasks", "0")
    assert bad.exit_code == 2 and "field 'tasks'" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_model_init_maps_its_options_onto_the_config(tmp_path):
    opts = {"env": "sokoban", "tasks": 4, "epochs": 1, "noise": 0.2, "skill_writing": True}
    scratch = _warm_start_config("expert", tmp_path, 5, False, opts, None, "auto")
    assert (scratch.shape, scratch.lr, scratch.prompt_weight, scratch.seed) == ("agent", 1e-3, 0.5, 5)
    pretrained = _warm_start_config("expert", tmp_path, 0, True, opts, None, "auto")
    assert (pretrained.shape, pretrained.lr, pretrained.prompt_weight) == ("keep", 5e-5, 0.0)
    assert _warm_start_config("expert", tmp_path, 0, True, opts, 1e-4, "auto").lr == 1e-4


def test_a_runs_model_dir_names_the_run_to_chain(tmp_path):
    cfg = WarmStartConfig(runs_dir=str(tmp_path / "runs"))
    with open_run("warmstart", cfg, argv=[]) as run:
        (run.file("model")).mkdir()
        (run.file("model") / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
        with pytest.raises(
            UserError, match=r"--model .*/model: the model of run .*: the warmstart run is still running"
        ):
            model_run(run.file("model"))  # not complete yet: nothing to check it against
        run.complete({"model": None})
    found = model_run(run.path / "model")
    assert found is not None and found[0] == run.path.resolve() and found[1].stage == "warmstart"
    assert read_manifest(run.path).outputs[0].path == "model/config.json"
    assert model_run(tmp_path) is None and model_run(Path(tmp_path / "elsewhere" / "model")) is None


def test_one_gpu_world_check_for_sft_and_rl(monkeypatch):
    import torch

    from seedcli.config import RLConfig, SFTConfig
    from seedcli.stages.rl import world_size
    from seedcli.stages.sft import _resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match=r"--gpus 2: no CUDA GPU is visible; use --gpus 0 to train on the CPU"):
        _resolve_device(SFTConfig(gpus=2))
    with pytest.raises(UserError, match=r"--gpus 2: no CUDA GPU is visible; on CPU use --nproc N"):
        world_size(RLConfig(gpus=2))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for call in (lambda: _resolve_device(SFTConfig(gpus=2)), lambda: world_size(RLConfig(gpus=2))):
        with pytest.raises(UserError, match=r"--gpus 2: only 1 GPU\(s\) visible"):
            call()
    assert world_size(RLConfig(gpus=2, torchrun_args="--nnodes 2")) == 2  # other nodes hold the rest


def test_device_picks_the_gpu_only_when_one_is_there(monkeypatch):
    import torch

    from seedcli.stages.warmstart import _device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _device(WarmStartConfig()) == "cpu" and _device(WarmStartConfig(device="cpu")) == "cpu"
    with pytest.raises(UserError, match="no CUDA GPU is visible"):
        _device(WarmStartConfig(device="cuda"))
    with pytest.raises(UserError, match="use auto, cpu or cuda"):
        _device(WarmStartConfig(device="tpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _device(WarmStartConfig()) == "cuda" and _device(WarmStartConfig(device="cpu")) == "cpu"
    with pytest.raises(UserError, match="CPU ranks"):
        _device(WarmStartConfig(nproc=2))
    assert _device(WarmStartConfig(nproc=2, device="cpu")) == "cpu"
    # where it trains does not change what is computed: left out of the hash
    assert WarmStartConfig(device="cpu").config_hash() == WarmStartConfig().config_hash()


def test_model_init_refuses_a_gpu_it_does_not_have(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "m"
    r = _invoke("model", "init", "--out", str(out), "--warm-start", "expert", "--env", "ezpoints", "--tasks", "1",
                "--device", "cuda")  # fmt: skip
    assert r.exit_code == 2 and "GPU is visible" in _flat(r.output)
    assert not out.exists()  # refused before the model was built
