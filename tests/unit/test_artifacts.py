import json
import os

import pytest

from seedcli.artifacts import find_resumable, open_run, read_manifest, resolve_input, verify_run
from seedcli.config import CollectConfig, EvalConfig
from seedcli.errors import UserError


def _complete_run(tmp_path, **kw):
    cfg = CollectConfig(runs_dir=str(tmp_path), tasks=2, **kw)
    with open_run("collect", cfg, argv=["seed", "collect"]) as run:
        run.file("trajectories.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
        run.complete({"trajectories.jsonl": 2}, {"success_rate": 0.5})
    return run


def test_complete_run_has_hashed_outputs_and_latest_pointer(tmp_path):
    run = _complete_run(tmp_path)
    m = read_manifest(run.path)
    assert m.status == "complete" and m.stage == "collect"
    assert run.path.name.endswith(CollectConfig(runs_dir=str(tmp_path), tasks=2).config_hash()[:8])
    assert [o.path for o in m.outputs] == ["trajectories.jsonl"] and m.outputs[0].records == 2
    assert m.versions["torch"] and m.versions["seedcli"]
    assert os.readlink(tmp_path / "collect" / "latest") == run.path.name
    assert (run.path / "config.yaml").read_text().startswith("runs_dir:")


def test_config_hash_ignores_resume_and_workers_but_not_sampling():
    a = CollectConfig(tasks=2)
    assert a.config_hash() == CollectConfig(tasks=2, workers=7, resume="auto").config_hash()
    assert a.config_hash() != CollectConfig(tasks=2, temperature=0.9).config_hash()


def test_failed_body_marks_run_failed_and_latest_untouched(tmp_path):
    cfg = CollectConfig(runs_dir=str(tmp_path))
    with pytest.raises(RuntimeError):
        with open_run("collect", cfg, argv=[]) as run:
            run.file("trajectories.jsonl").write_text('{"a": 1}\n')  # it started: the failed run is kept
            raise RuntimeError("boom")
    m = read_manifest(run.path)
    assert m.status == "failed" and "boom" in m.error
    assert not (tmp_path / "collect" / "latest").exists()
    assert find_resumable(tmp_path / "collect", cfg.config_hash()) == run.path


def test_resolve_input_refuses_tampered_incomplete_and_wrong_stage(tmp_path):
    run = _complete_run(tmp_path)
    path, m = resolve_input("collect", None, str(tmp_path))
    assert path == run.path and m.run_id == run.id
    with pytest.raises(UserError, match="a collect run, but a sft run is needed"):
        verify_run(run.path, "sft")
    (run.path / "trajectories.jsonl").write_text('{"a": 1}\n{"a": 3}\n')
    with pytest.raises(UserError, match="does not match its sha256"):
        resolve_input("collect", str(run.path), str(tmp_path))
    with pytest.raises(UserError, match="no complete eval run"):
        resolve_input("eval", None, str(tmp_path))


def test_newer_schema_and_running_runs_are_refused(tmp_path):
    run = _complete_run(tmp_path)
    data = json.loads((run.path / "manifest.json").read_text())
    data["status"] = "running"
    (run.path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="is interrupted, not complete"):  # running, but no live writer
        verify_run(run.path, "collect")
    data["schema_version"] = 99
    (run.path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="newer than this seedcli"):
        read_manifest(run.path)


def test_resume_reopens_the_same_directory_and_refuses_other_configs(tmp_path):
    cfg = EvalConfig(runs_dir=str(tmp_path), limit=3)
    with pytest.raises(KeyboardInterrupt):
        with open_run("eval", cfg, argv=[]) as first:
            first.file("episodes.jsonl").write_text('{"a": 1}\n')
            raise KeyboardInterrupt
    with open_run("eval", cfg.model_copy(update={"resume": "auto"}), argv=[]) as again:
        assert again.path == first.path and again.manifest.resumed == 1
    with pytest.raises(UserError, match="no incomplete eval run"):
        with open_run("eval", EvalConfig(runs_dir=str(tmp_path), limit=4, resume="auto"), argv=[]):
            pass
