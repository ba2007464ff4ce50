"""`seed <stage> --resume DIR` from any working directory: relative paths in the saved config (model, from_run) mean
what they meant where the run was started, the config hash is unchanged; sft finds its collect run after a move."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seedcli.artifacts import open_run, read_manifest
from seedcli.config import AnnotateConfig, CollectConfig, SFTConfig, build_config
from seedcli.stages.sft import _base_model, _collect_run


def _model_dir(root: Path) -> Path:
    d = root / "models" / "tiny"
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    return d


def _interrupted(cfg, stage: str = "collect") -> Path:
    with pytest.raises(KeyboardInterrupt), open_run(stage, cfg, argv=[]) as run:
        run.file("out.jsonl").write_text('{"a": 1}\n')
        raise KeyboardInterrupt
    return run.path.absolute()


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A project directory holding a model, where the runs are started with relative paths."""
    proj = tmp_path / "project"
    proj.mkdir()
    _model_dir(proj)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(proj)
    return proj


def test_resume_from_another_directory_finds_the_relative_model(project, tmp_path, monkeypatch):
    path = _interrupted(CollectConfig(runs_dir="runs", model="models/tiny", tasks=2))
    monkeypatch.chdir(tmp_path / "elsewhere")  # `cd /tmp && seed collect --resume /abs/run`
    cfg = build_config("collect", None, {"resume": str(path)})
    assert cfg.model == "models/tiny"  # the config as saved ...
    assert cfg.config_hash() == read_manifest(path).config_hash  # ... so the same hash
    assert (Path(cfg.model) / "config.json").is_file()  # and the model is found (before: "no config.json")
    assert Path(cfg.runs_dir) == project / "runs" and Path(cfg.resume) == path
    with open_run("collect", cfg, argv=[]) as run:
        assert run.path.resolve() == path.resolve() and run.manifest.resumed == 1
    assert read_manifest(path).workdir == str(project)  # recorded at the start, kept on resume


def test_a_run_without_a_recorded_workdir_infers_it_from_its_relative_runs_dir(project, tmp_path, monkeypatch):
    path = _interrupted(CollectConfig(runs_dir="runs", model="models/tiny", tasks=2))
    manifest = json.loads((path / "manifest.json").read_text())
    manifest.pop("workdir", None)  # as written before the working directory was recorded
    (path / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.chdir(tmp_path / "elsewhere")
    cfg = build_config("collect", None, {"resume": str(path)})
    assert (Path(cfg.model) / "config.json").is_file() and Path.cwd() == project


def test_resume_finds_a_relative_from_run(project, tmp_path, monkeypatch):
    with open_run("collect", CollectConfig(runs_dir="runs", tasks=2), argv=[]) as collect:
        pass
    from_run = str(collect.path)  # "runs/collect/<id>", relative, as resolve_input gives it
    assert not Path(from_run).is_absolute()
    path = _interrupted(AnnotateConfig(runs_dir="runs", from_run=from_run, analyzer="rules"), "annotate")
    monkeypatch.chdir(tmp_path / "elsewhere")
    cfg = build_config("annotate", None, {"resume": str(path), "from_run": from_run})  # given again: same string
    assert cfg.config_hash() == read_manifest(path).config_hash
    assert (Path(cfg.from_run) / "manifest.json").is_file()


def test_sft_finds_the_collect_run_and_its_model_after_the_runs_tree_moved(project, tmp_path, monkeypatch):
    with open_run("collect", CollectConfig(runs_dir="runs", model="models/tiny", tasks=2), argv=[]) as collect:
        pass
    with open_run("annotate", AnnotateConfig(runs_dir="runs", analyzer="rules"), argv=[]) as annotate:
        annotate.add_input("collect", collect.path)
    moved = tmp_path / "moved"
    (project / "runs").rename(moved)
    annotate_dir = moved / "annotate" / annotate.id
    found = _collect_run(read_manifest(annotate_dir), annotate_dir, str(moved))
    assert found == (moved / "collect" / collect.id).resolve()  # before: None (the recorded path is gone)
    monkeypatch.chdir(tmp_path / "elsewhere")
    base, value = _base_model(SFTConfig(runs_dir=str(moved)), annotate_dir, found)
    assert base == project / "models" / "tiny" and value == "models/tiny"  # found, and kept as recorded


def test_a_project_moved_with_its_runs_resumes_from_its_new_place(project, tmp_path, monkeypatch):
    path = _interrupted(CollectConfig(runs_dir="runs", model="models/tiny", tasks=2))
    monkeypatch.chdir(tmp_path)
    moved = tmp_path / "renamed"
    project.rename(moved)  # the recorded workdir is gone; the relative runs_dir still places the project
    cfg = build_config("collect", None, {"resume": str(moved / path.relative_to(project))})
    assert Path.cwd() == moved and (Path(cfg.model) / "config.json").is_file()
