"""The stages remember (issue 62 §4): a stage that reads an earlier run plays its environment, env options and data
root (an `--env` that differs is one line naming both; the model likewise where the stage infers it), one name for one
idea across stages with the old spelling warned, a move the game refuses counted invalid, report.md's paper section
only where the paper ran, reports that never overwrite one another, and `seed runs` naming an rl run's method. CLI in
process (typer's runner); the runs are made with `open_run`, no model needed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedcli.artifacts import open_run
from seedcli.cli import app
from seedcli.config import AnnotateConfig, CollectConfig, EvalConfig, RLConfig, SFTConfig, WarmStartConfig, build_config
from seedcli.errors import UserError

runner = CliRunner()

GAME = '''
from seedcli.envs import TextEnv


class Steps(TextEnv):
    """Walk to the end of a short corridor; waiting is a move the game refuses."""

    max_steps = 4

    def tasks(self, split):
        return [{"id": f"t{i}", "length": 2} for i in range(6)]

    def reset(self, task):
        self.left = task["length"]
        return f"{self.left} steps to the end."

    def step(self, action):
        if action != "walk":
            return "You cannot do that here.", 0.0, False, {"invalid": True}
        self.left -= 1
        return ("The end.", 1.0, True) if self.left == 0 else (f"{self.left} steps to the end.", 0.0, False)

    def admissible(self):
        return ["walk", "wait"]

    def expert(self):
        return "walk"
'''


@pytest.fixture
def game(tmp_path, monkeypatch) -> str:
    folder = tmp_path / "plugin"
    folder.mkdir()
    (folder / "corridor.py").write_text(GAME)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(folder), os.environ.get("PYTHONPATH")))))
    monkeypatch.setattr("seedcli.artifacts.CURRENT_RUN", None)
    return "corridor:Steps"


def _invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "400", "NO_COLOR": "1"})


def _complete(stage: str, cfg, inputs=(), files=("out.txt",)) -> Path:
    with open_run(stage, cfg, argv=[]) as run:
        for s, p in inputs:
            run.add_input(s, p)
        for name in files:
            run.file(name).parent.mkdir(parents=True, exist_ok=True)
            run.file(name).write_text("{}")
        run.complete({name.split("/")[0]: None for name in files})
    return run.path


@pytest.fixture
def lineage(tmp_path) -> dict[str, Path]:
    """collect (EZPoints, text observations, a data root) → annotate → sft (with model/) → rl, as manifests."""
    runs = str(tmp_path / "runs")
    data = tmp_path / "ezpoints-data"
    data.mkdir()
    played = {"env": "ezpoints", "env_options": {"observation": "text"}, "data_root": str(data)}
    collect = _complete("collect", CollectConfig(runs_dir=runs, tasks=2, **played))
    annotate = _complete("annotate", AnnotateConfig(runs_dir=runs, from_run=str(collect)), (("collect", collect),))
    sft = _complete(
        "sft", SFTConfig(runs_dir=runs, from_run=str(annotate)), (("annotate", annotate),), ("model/config.json",)
    )
    rl = _complete("rl", RLConfig(runs_dir=runs, from_run=str(sft), **played), (("sft", sft),), ("model/config.json",))
    return {"runs": Path(runs), "data": data, "collect": collect, "annotate": annotate, "sft": sft, "rl": rl}


def _printed(*args: str) -> dict:
    import yaml

    out = _invoke(*args, "--print-config")
    assert out.exit_code == 0, out.output
    return yaml.safe_load(out.stdout)


# ------------------------------------------------------------------------------------------- the run's environment


def test_a_stage_reading_a_run_plays_its_environment_options_and_data(lineage):
    runs = str(lineage["runs"])
    for stage, given in (("eval", lineage["rl"]), ("rl", lineage["sft"])):
        cfg = _printed(stage, "--from", str(given), "--runs-dir", runs)  # no --env: the run's
        assert cfg["env"] == "ezpoints" and cfg["env_options"] == {"observation": "text"}
        assert cfg["data_root"] == str(lineage["data"])
        assert cfg["max_steps"] == 8  # and the environment's defaults follow it (EZPoints: 8 steps)
    assert _printed("rl", "--runs-dir", runs)["env"] == "ezpoints"  # rl's default input: the newest sft run
    checkpoint = lineage["rl"] / "checkpoints" / "step_000001"
    assert _printed("eval", "--from", str(checkpoint), "--runs-dir", runs)["env"] == "ezpoints"
    # what the command names wins over the run's: options and data root given stay as given
    cfg = _printed("eval", "--from", str(lineage["rl"]), "--env-options", "{observation: image}", "--data-root", "x")
    assert cfg["env_options"] == {"observation": "image"} and cfg["data_root"] == "x"
    assert _printed("eval", "--env", "EZPoints", "--from", str(lineage["rl"]))["env"] == "ezpoints"  # the same env


def test_an_env_given_that_differs_names_both(lineage):
    out = _invoke("eval", "--env", "sokoban", "--from", str(lineage["rl"]), "--runs-dir", str(lineage["runs"]))
    assert out.exit_code == 2 and out.stderr.count("\n") == 1
    assert "--env sokoban, but --from" in out.stderr and "played ezpoints" in out.stderr
    assert f"--model {lineage['rl'] / 'model'}" in out.stderr  # the run holds a model: the way round on purpose
    out = _invoke("rl", "--env", "sokoban", "--runs-dir", str(lineage["runs"]))
    assert out.exit_code == 2 and "the newest sft run" in out.stderr and "played ezpoints" in out.stderr
    # a config built in code is as given: the stage's own check still refuses it
    with pytest.raises(UserError, match=r"--env alfworld, but --from .* played ezpoints"):
        from seedcli.cli import check_from_env

        check_from_env("eval", EvalConfig(runs_dir=str(lineage["runs"]), from_run=str(lineage["rl"])))


def test_eval_from_a_run_and_another_model_names_both(lineage, tmp_path, monkeypatch):
    from seedcli.stages import eval as eval_stage

    monkeypatch.setattr(eval_stage, "check_model_dir", lambda model, *a: Path(model))
    monkeypatch.setattr(eval_stage, "verify_run", lambda run_dir, *a, **k: eval_stage.read_manifest(run_dir))
    other = tmp_path / "other"
    cfg = build_config("eval", cli={"from_run": str(lineage["rl"]), "model": str(other), "env": "ezpoints"})
    with pytest.raises(UserError, match=r"--model .*other, but --from .* evaluates the run's own model"):
        eval_stage.resolve_model(cfg)
    same = cfg.model_copy(update={"model": str(lineage["rl"] / "model")})
    assert eval_stage.resolve_model(same)[0] == lineage["rl"] / "model"


def test_sft_fine_tunes_the_policy_that_played(tmp_path):
    from seedcli.stages.sft import _same_policy

    runs = str(tmp_path / "runs")
    played, other = tmp_path / "played", tmp_path / "other"
    played.mkdir()
    other.mkdir()
    collect = _complete("collect", CollectConfig(runs_dir=runs, tasks=2, model=str(played)))
    annotate = _complete("annotate", AnnotateConfig(runs_dir=runs, from_run=str(collect)), (("collect", collect),))
    _same_policy(played, str(played), annotate, collect)  # the same model: fine
    with pytest.raises(UserError) as err:
        _same_policy(other, str(other), annotate, collect)
    assert f"--model {other}, but collect run {collect}" in str(err.value) and f"played {played}" in str(err.value)
    expert = _complete("collect", CollectConfig(runs_dir=runs, tasks=3))  # an expert-played run records no model
    _same_policy(other, str(other), annotate, expert)


# ------------------------------------------------------------------------------------------------ one name


@pytest.mark.parametrize(
    ("stage", "old", "new", "value"),
    [
        ("collect", "task_types", "categories", "pick,look"),
        ("eval", "datasets", "categories", "pick,look"),
        ("rl", "val_games", "val_tasks", "3"),
        ("warmstart", "games", "tasks", "3"),
    ],
)
def test_one_name_per_idea_and_the_old_one_warns(stage, old, new, value, tmp_path):
    cls = build_config(stage).__class__
    by_new = build_config(stage, overrides=[f"{new}={value}"])
    by_old = build_config(stage, overrides=[f"{old}={value}"])
    assert by_old == by_new and by_old.config_hash() == by_new.config_hash()
    assert old in by_new.hashed() and new not in by_new.hashed()  # hashed by its old name: no run's hash moved
    out = _invoke(stage, f"--{old.replace('_', '-')}", value, "--print-config")  # the old option, hidden
    assert out.exit_code == 0 and f"{new}:" in out.stdout and f"warning: '{old}' is now '{new}'" in out.stderr
    help_text = _invoke(stage, "--help").output
    assert f"--{new.replace('_', '-')}" in help_text and f"--{old.replace('_', '-')} " not in help_text
    preset = tmp_path / "old.yaml"
    preset.write_text(f"{stage}:\n  {old}: {value if ',' not in value else '[' + value + ']'}\n")
    assert build_config(stage, str(preset)) == by_new  # a preset written with the old name still works
    with pytest.raises(UserError, match=rf"'{old}' is the old name of '{new}'; give one"):
        build_config(stage, overrides=[f"{old}={value}", f"{new}={value}"])
    assert cls.old_names == {old: new}


def test_a_run_saved_with_the_old_name_resumes(tmp_path):
    runs = str(tmp_path / "runs")
    old = WarmStartConfig(runs_dir=runs, games=5)
    with pytest.raises(RuntimeError), open_run("warmstart", old, argv=[]) as run:
        run.file("games.jsonl").write_text("{}\n")
        raise RuntimeError("stopped")
    saved = (run.path / "config.yaml").read_text().replace("tasks: 5", "games: 5")  # as an older seedcli saved it
    (run.path / "config.yaml").write_text(saved)
    again = build_config("warmstart", cli={"resume": str(run.path)})
    assert again.tasks == 5 and again.config_hash() == old.config_hash()


# ---------------------------------------------------------------------------------------- a refused move


def test_a_move_the_game_refuses_is_an_invalid_turn(game):
    from seedcli.envs import get_env
    from seedcli.envs.pool import EnvPool
    from seedcli.report.results import summarize_episodes
    from seedcli.rollout import EpisodeSpec, RolloutSettings, episode_metrics, play_episodes
    from seedcli.rollout.episode import Generated

    class WaitThenWalk:
        name = "scripted"

        def act(self, prompts, episodes, call):
            return [Generated("<think>go</think>\n<action>" + ("wait" if call == 0 else "walk") + "</action>")
                    for _ in episodes]  # fmt: skip

    env = get_env(game)
    specs = [EpisodeSpec(episode_id=f"e{i}", group_id=f"e{i}", task=t) for i, t in enumerate(env.list_tasks("test"))]
    played = []
    settings = RolloutSettings(max_steps=4, history=2, rollout="lockstep")
    with EnvPool(env, 0) as pool:
        play_episodes(specs[:2], WaitThenWalk(), pool, settings, {"policy": "model"}, played.append)
    assert [[t.valid for t in ep.turns] for ep in played] == [[False, True, True]] * 2  # the reply was readable
    assert all(ep.won for ep in played) and played[0].invalid_turns == 1
    results = summarize_episodes(played, split="test", partial=False, expected_games=2, wall_time_s=0.0, env=game)
    assert results["invalid_action_rate"] == pytest.approx(1 / 3) and results["invalid_turns"] == 2
    assert episode_metrics(played)["invalid_rate"] == pytest.approx(1 / 3)  # what collect and rl log


# -------------------------------------------------------------------------------------------------- reports


def _eval_run(runs: Path, game: str) -> Path:
    from seedcli.stages import eval as eval_stage

    cfg = build_config("eval", cli={"env": game, "policy": "expert", "runs_dir": str(runs), "workers": 0})
    return runs / "eval" / eval_stage.run(cfg).run_id


def test_reports_show_the_paper_only_where_it_ran_and_never_overwrite(game, tmp_path, monkeypatch):
    from seedcli.report.commands import report_command
    from seedcli.report.markdown import render_report

    run = _eval_run(tmp_path / "runs", game)
    report = (run / "report.md").read_text()
    assert "## Paper" not in report and "The paper reports no" not in report and "## Episodes" in report
    results = json.loads((run / "results.json").read_text())
    ezpoints = render_report({**results, "env": "ezpoints"}, title="t", model_desc="m", run_id="r")
    assert "## Paper (Qwen2.5-VL-3B" in ezpoints  # an environment the paper ran keeps its section
    monkeypatch.chdir(tmp_path)
    first = report_command([run], None)["compare_md"].parent
    second = report_command([run], None)["compare_md"].parent
    assert first != second and first.parent == second.parent == Path("reports")  # a new directory per report
    assert (first / "report.md").is_file() and (second / "report.md").is_file()
    with pytest.raises(UserError, match=r"--out .* holds an earlier report \(compare.md\)"):
        report_command([run], first)
    out = _invoke("report", str(run), "--out", str(first))
    assert out.exit_code == 2 and "holds an earlier report" in out.stderr


def test_seed_runs_names_an_rl_runs_algorithm_and_analyzer(tmp_path):
    runs = str(tmp_path)
    _complete("rl", RLConfig(runs_dir=runs, algo="grpo", analyzer="none"))
    _complete("rl", RLConfig(runs_dir=runs, algo="seed", analyzer="rules"))
    listed = _invoke("runs", "--runs-dir", runs).output
    assert "algo=grpo" in listed and "algo=seed, analyzer=rules" in listed
    assert "analyzer=none" not in listed  # GRPO has no analyzer to name
