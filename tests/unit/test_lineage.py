"""Lineage that is checked all the way (issue 55 §2): `seed runs` tells a modified run from a complete one, a stage
checks the whole chain of runs its input names, and a model inside a run directory is verified against that run's
manifest, while a plain model directory is hashed into the new run's manifest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedcli.artifacts import open_run, read_manifest, verify_run
from seedcli.cli import app
from seedcli.config import AnnotateConfig, CollectConfig, WarmStartConfig
from seedcli.engines.tiny import model_hash
from seedcli.errors import UserError
from tests.helpers_models import build_test_model
from tests.helpers_runs import flip_byte

TRAJECTORIES = "".join(json.dumps({"episode_id": f"g{i}", "won": i % 2 == 0}) + "\n" for i in range(4))


def _collect(runs: Path, tasks: int) -> Path:
    """A complete collect run (its trajectories file written by hand), made by the stages' own run machinery."""
    with open_run("collect", CollectConfig(runs_dir=str(runs), tasks=tasks), argv=[]) as run:
        run.file("trajectories.jsonl").write_text(TRAJECTORIES)
        run.complete({"trajectories.jsonl": 4})
    return run.path


def _annotate(runs: Path, collect: Path) -> Path:
    """A complete annotate run chained to `collect`."""
    with open_run(
        "annotate", AnnotateConfig(runs_dir=str(runs), from_run=str(collect), analyzer="rules"), argv=[]
    ) as run:
        run.add_input("collect", collect)
        run.file("skills.jsonl").write_text('{"episode_id": "g0"}\n')
        run.complete({"skills.jsonl": 1})
    return run.path


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    text = result.output.strip()
    assert len(text.splitlines()) == 1 and text.startswith("error:") and "Traceback" not in text, text
    return text


def _row(stdout: str, run: Path) -> str:
    return next(line for line in stdout.splitlines() if run.name in line)


# ------------------------------------------------------------------------------------------------ seed runs


def test_seed_runs_lists_changed_broken_and_deleted_files_as_modified(tmp_path):
    runs = tmp_path / "runs"
    intact, flipped, broken, deleted = (_collect(runs, tasks) for tasks in (1, 2, 3, 4))
    flip_byte(flipped / "trajectories.jsonl", offset=3)  # the same size: only its sha256 tells
    (broken / "trajectories.jsonl").write_text(TRAJECTORIES[:-7])  # JSON cut mid-record
    (deleted / "trajectories.jsonl").unlink()

    plain = CliRunner().invoke(app, ["runs", "--runs-dir", str(runs), "--all"])
    assert plain.exit_code == 0, plain.output
    assert "complete" in _row(plain.stdout, intact) and "sizes ok" in _row(plain.stdout, intact)
    assert "modified" in _row(plain.stdout, broken) and "complete" not in _row(plain.stdout, broken)
    assert "modified" in _row(plain.stdout, deleted) and "output" in _row(plain.stdout, deleted)
    # a same-size change is not seen by size, and the listing says its hashes were not checked
    assert "sizes ok" in _row(plain.stdout, flipped)
    assert "sha256 not checked; `seed runs --verify` checks every byte" in plain.stdout

    verified = CliRunner().invoke(app, ["runs", "--runs-dir", str(runs), "--verify"])
    assert verified.exit_code == 0, verified.output
    assert "modified" in _row(verified.stdout, flipped) and "sha256" in _row(verified.stdout, flipped)
    assert "sha256 ok" in _row(verified.stdout, intact) and "complete" in _row(verified.stdout, intact)
    assert "sha256 not checked" not in verified.stdout


def test_seed_runs_marks_a_run_whose_input_changed_after_it_read_it(tmp_path):
    from seedcli.artifacts import run_problems

    runs = tmp_path / "runs"
    collect = _collect(runs, 1)
    annotate = _annotate(runs, collect)
    assert run_problems(annotate, read_manifest(annotate), str(runs)) == []
    manifest = read_manifest(collect)
    manifest.metrics["success_rate"] = 1.0  # the input's record rewritten after annotate read it
    (collect / "manifest.json").write_text(manifest.model_dump_json(indent=2))
    assert run_problems(annotate, read_manifest(annotate), str(runs)) == [
        f"input collect/{collect.name} changed after this run read it"
    ]
    listed = CliRunner().invoke(app, ["runs", "--runs-dir", str(runs)])
    assert "modified" in _row(listed.stdout, annotate)


# ------------------------------------------------------------------------------------------ the whole chain


def test_sft_refuses_an_annotate_run_whose_collect_changed(tmp_path):
    # the probe: annotate refused the changed trajectories, sft --from ANNOTATE accepted them
    runs = tmp_path / "runs"
    collect = _collect(runs, 1)
    annotate = _annotate(runs, collect)
    flip_byte(collect / "trajectories.jsonl", offset=3)
    with pytest.raises(UserError, match="trajectories.jsonl does not match its sha256"):
        verify_run(collect, "collect")  # what annotate checks
    text = _one_line_error(CliRunner().invoke(app, ["sft", "--from", str(annotate), "--runs-dir", str(runs)]))
    assert f"{collect}: trajectories.jsonl does not match its sha256 in the manifest" in text
    # a change of size is seen on the chain itself, by whatever reads the annotate run
    (collect / "trajectories.jsonl").write_text(TRAJECTORIES + TRAJECTORIES)
    with pytest.raises(UserError, match=rf"its input collect run {collect}: trajectories.jsonl is \d+ bytes"):
        verify_run(annotate, "annotate")
    assert not (runs / "sft").exists() or not any((runs / "sft").iterdir())  # no run left behind


def test_the_chain_refuses_an_edited_input_manifest_and_skips_a_pruned_one(tmp_path):
    runs = tmp_path / "runs"
    collect = _collect(runs, 1)
    annotate = _annotate(runs, collect)
    assert verify_run(annotate, "annotate").inputs[0].run_id == collect.name
    original = (collect / "manifest.json").read_text()
    (collect / "manifest.json").write_text(original.replace('"tasks": 1', '"tasks": 9'))
    with pytest.raises(UserError, match=rf"its input collect run {collect} changed after {annotate.name} read it"):
        verify_run(annotate, "annotate")
    (collect / "manifest.json").write_text(original[: len(original) // 2])
    with pytest.raises(UserError, match=rf"its input {collect} is damaged \(not valid JSON"):
        verify_run(annotate, "annotate")
    shutil.rmtree(collect)  # pruned: nothing left to read, nothing to check
    assert verify_run(annotate, "annotate").stage == "annotate"


# ------------------------------------------------------------------------------------------------- models


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """A plain tiny model and a warm start's run holding a copy of it as model/ (its manifest hashes every file)."""
    root = tmp_path_factory.mktemp("lineage_models")
    plain = build_test_model(root / "tiny")
    runs = root / "runs"
    with open_run("warmstart", WarmStartConfig(runs_dir=str(runs), model=str(plain), env="sokoban"), argv=[]) as run:
        shutil.copytree(plain, run.file("model"))
        run.file("games.jsonl").write_text("{}\n")
        run.complete({"model": None, "games.jsonl": 1})
    return {"plain": plain, "warmstart": run.path, "runs": runs}


def _tampered_warmstart(models: dict[str, Path], tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "warmstart" / models["warmstart"].name
    shutil.copytree(models["warmstart"], run)
    flip_byte(run / "model" / "model.safetensors")  # the last byte of the weights: the header still parses
    return run


@pytest.mark.parametrize(
    "stage",
    [
        ["collect", "--tasks", "1", "--rollouts", "1"],
        ["eval", "--limit", "1"],
        ["rl", "--steps", "1", "--group", "2", "--batch-tasks", "1"],
    ],
    ids=lambda s: s[0],
)
def test_a_flipped_byte_in_a_runs_model_is_refused_by_every_stage(models, tmp_path, stage):
    # the probe: collect, rl and eval took runs/warmstart/<id>/model with a flipped byte and recorded that run
    run = _tampered_warmstart(models, tmp_path)
    runs = tmp_path / "out"
    common = ["--env", "sokoban", "--runs-dir", str(runs), "--workers", "0"]
    text = _one_line_error(CliRunner().invoke(app, [*stage, *common, "--model", str(run / "model")]))
    assert f"--model {run / 'model'}: the model of run {run}, checked against its manifest" in text
    assert "model/model.safetensors does not match its sha256 in the manifest" in text
    assert not (runs / stage[0]).exists() or not any((runs / stage[0]).iterdir())  # nothing recorded
    if stage[0] == "eval":  # `--from` the same run says the same
        from_run = CliRunner().invoke(app, [*stage, *common, "--from", str(run)])
        assert "model/model.safetensors does not match its sha256" in _one_line_error(from_run)


def test_a_runs_model_is_chained_and_a_plain_model_is_hashed_into_the_manifest(models, tmp_path):
    runs = tmp_path / "runs"
    args = ["eval", "--env", "sokoban", "--runs-dir", str(runs), "--limit", "1", "--workers", "0", "--json"]
    args += ["--max-steps", "1", "--max-new-tokens", "4"]
    chained = CliRunner().invoke(app, [*args, "--model", str(models["warmstart"] / "model")])
    assert chained.exit_code == 0, chained.output
    manifest = read_manifest(runs / "eval" / json.loads(chained.stdout.strip().splitlines()[-1])["run_id"])
    assert [(i.stage, i.run_id) for i in manifest.inputs] == [("warmstart", models["warmstart"].name)]
    assert "inputs/model_hash" not in manifest.metrics  # the warm start's manifest vouches for the files

    plain = CliRunner().invoke(app, [*args, "--model", str(models["plain"]), "--seed", "1"])
    assert plain.exit_code == 0, plain.output
    manifest = read_manifest(runs / "eval" / json.loads(plain.stdout.strip().splitlines()[-1])["run_id"])
    assert manifest.inputs == []
    assert manifest.metrics["inputs/model"] == str(models["plain"].absolute())
    assert manifest.metrics["inputs/model_hash"] == model_hash(models["plain"])


def test_a_resumed_run_refuses_a_plain_model_whose_weights_changed(models, tmp_path):
    from seedcli.stages.common import chain_model

    model = tmp_path / "model"
    shutil.copytree(models["plain"], model)
    cfg = CollectConfig(runs_dir=str(tmp_path / "runs"), model=str(model))
    with pytest.raises(KeyboardInterrupt), open_run("collect", cfg, argv=[]) as run:
        chain_model(run, model, None)
        run.file("trajectories.jsonl").write_text(TRAJECTORIES)
        raise KeyboardInterrupt
    before = read_manifest(run.path).metrics["inputs/model_hash"]
    assert before == model_hash(model)
    flip_byte(model / "model.safetensors")
    with pytest.raises(
        UserError, match=rf"the model's weights changed since this run started .*recorded {before[:12]}"
    ):
        with open_run("collect", cfg.model_copy(update={"resume": str(run.path)}), argv=[]) as again:
            chain_model(again, model, None)
