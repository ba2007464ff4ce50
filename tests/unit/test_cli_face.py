"""The CLI's face (issue 20): help that speaks of every environment, `seed envs`, typo hints, one-line errors,
Ctrl-C leaving a run `interrupted`, and `--from` a run of another environment refused. In-process (typer's runner)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedcli.artifacts import open_run, read_manifest, run_state
from seedcli.cli import app, check_from_env
from seedcli.config import CollectConfig, EvalConfig, RLConfig, SFTConfig
from seedcli.envs import ENV_NAMES, env_class, env_names
from seedcli.errors import UserError

runner = CliRunner()


def _invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "400", "NO_COLOR": "1"})


def _flat(text: str) -> str:
    """Help text without rich's box drawing and line wraps."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def test_help_speaks_of_every_environment() -> None:
    top = _flat(_invoke("--help").output)
    assert all(env_class(n).title in top for n in ENV_NAMES) and "seed envs" in top
    for stage in ("collect", "eval", "rl"):
        text = _flat(_invoke(stage, "--help").output)
        assert "PydanticUndefined" not in text
        for n in ENV_NAMES:  # one statement of the env-dependent defaults, with each env's own numbers
            cls = env_class(n)
            assert f"{n} {cls.max_steps}" in text and f"{n} {cls.history}" in text
            assert all(opt in text for opt, *_ in cls.option_specs())  # --env-options names every option
        for flag in ("--max-steps", "--history"):  # no second, contradicting default after the per-env ones
            assert "(default: " not in text.split(flag, 1)[1].split(" --", 1)[0].replace("(default: the env", "")
    eval_help = _flat(_invoke("eval", "--help").output)
    for n in ENV_NAMES:  # every eval split (or its alias) is named
        cls = env_class(n)
        aliases = {s: [a for a, c in cls.splits.items() if c == s] for s in cls.eval_splits}
        assert all(any(re.search(rf"\b{a}\b", eval_help) for a in names) for names in aliases.values()), n
    assert "JSONL file of questions" in eval_help
    collect = _flat(_invoke("collect", "--help").output)
    assert "six task types" not in collect.replace("its six task types", "")
    assert "product categories" in collect and "data sources" in collect and "JSONL file" in collect


def test_envs_lists_every_environment_with_counts(monkeypatch) -> None:
    out = _invoke("envs", "--json")
    assert out.exit_code == 0, out.output
    described = {d["name"]: d for d in json.loads(out.output)}
    assert list(described)[: len(ENV_NAMES)] == list(ENV_NAMES) and list(described) == list(env_names())
    assert {d["origin"] for n, d in described.items() if n in ENV_NAMES} == {"built in"}
    alf = described["alfworld"]
    if alf["data_root"] is None:
        pytest.skip(alf["data_missing"])
    splits = {s["name"]: s for s in alf["splits"]}
    assert splits["valid_seen"]["tasks"] == 140 and splits["valid_unseen"]["tasks"] == 134
    assert (
        sum(splits["valid_unseen"]["categories"].values()) == 134 and "eval default" in splits["valid_unseen"]["roles"]
    )
    assert alf["options"] == [] and alf["observation_modes"] == ["text"]
    search = described["search"]
    assert {o["name"]: (o["type"], o["default"]) for o in search["options"]}["topk"] == ("int", 3)
    if search["data_root"]:
        test = {s["name"]: s for s in search["splits"]}["test"]
        assert set(test["categories"]) == {"nq", "hotpotqa", "2wiki", "musique", "bamboogle"}
        assert sum(test["categories"].values()) == test["tasks"]
    text = _invoke("envs").output
    assert "split valid_unseen (also: unseen) [eval default]: 134 games" in text


def test_envs_with_data_missing_is_one_line_per_missing_thing(tmp_path, monkeypatch) -> None:
    for var in ("ALFWORLD_DATA", "WEBSHOP_DATA", "SEARCH_DATA", "SOKOBAN_DATA", "EZPOINTS_DATA"):
        monkeypatch.setenv(var, str(tmp_path / "nowhere"))
    out = _invoke("envs")
    assert out.exit_code == 0, out.output
    blocks = {b.split(" ", 1)[0]: b for b in re.split(r"\n(?=\S)", out.output)}  # one block per environment
    for name in ENV_NAMES:
        lines = blocks[name].splitlines()
        assert sum(line.startswith("  data: missing: ") for line in lines) == 1, name
        assert sum(line.startswith("  splits (no data to count): ") for line in lines) == 1, name
    assert "ALFWORLD_DATA" in out.output and "Traceback" not in out.output
    assert _invoke("envs", "--data-root", str(tmp_path)).exit_code == 2  # one data root is one environment's


def test_env_typo_suggests_the_name_and_bad_options_stop_the_stage(tmp_path) -> None:
    out = _invoke("eval", "--env", "webshp", "--policy", "expert")
    assert out.exit_code == 2 and "did you mean 'webshop'?" in out.output
    out = _invoke(
        "eval", "--env", "search", "--policy", "expert", "--runs-dir", str(tmp_path), "--env-options", "{topk: 0}"
    )
    assert out.exit_code == 2 and "topk=0: input should be greater than or equal to 1" in out.output
    out = _invoke(
        "eval", "--env", "search", "--policy", "expert", "--runs-dir", str(tmp_path), "--env-options", "{topk: 5"
    )
    assert out.exit_code == 2 and "is not a YAML mapping" in out.output and "unexpected" not in out.output
    assert len(out.output.strip().splitlines()) == 1
    assert not (tmp_path / "eval").exists()  # refused before any run directory


def test_retriever_serve_errors_are_one_line(tmp_path) -> None:
    out = _invoke("retriever", "serve", "--corpus", str(tmp_path), "--port", "99999")
    assert out.exit_code == 2 and "--port 99999: a TCP port is 1-65535" in out.output
    out = _invoke("retriever", "serve", "--corpus", str(tmp_path), "--port", "0")
    assert out.exit_code == 2
    out = _invoke("retriever", "serve", "--corpus", str(tmp_path))
    assert out.exit_code == 2 and f"corpus {tmp_path} is a directory; give the JSONL file" in out.output


def test_ctrl_c_leaves_the_run_interrupted(tmp_path, monkeypatch) -> None:
    import seedcli.stages.eval as eval_stage

    def interrupted(label, specs, policy, cfg, meta, out, **kw):
        out.write_text('{"partial": true}\n')  # one episode landed, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(eval_stage, "play_to_file", interrupted)
    args = ("eval", "--policy", "expert", "--split", "seen", "--limit", "2", "--runs-dir", str(tmp_path))
    out = _invoke(*args)
    if out.exit_code == 2:
        pytest.skip(out.output)  # no ALFWorld data
    assert out.exit_code == 130 and "interrupted; continue with `seed eval --resume" in out.output
    run_dir = next((tmp_path / "eval").glob("2*"))
    assert run_state(run_dir, read_manifest(run_dir)) == "interrupted"
    assert "interrupted" in _invoke("runs", "--runs-dir", str(tmp_path)).output
    # a run that raised anything else is still failed
    with pytest.raises(RuntimeError), open_run("eval", EvalConfig(runs_dir=str(tmp_path), limit=5), argv=[]) as run:
        run.file("episodes.jsonl").write_text("{}\n")
        raise RuntimeError("boom")
    assert read_manifest(run.path).status == "failed"


def _complete(stage: str, cfg, tmp: Path, inputs: tuple[tuple[str, Path], ...] = ()) -> Path:
    with open_run(stage, cfg, argv=[]) as run:
        for s, p in inputs:
            run.add_input(s, p)
        run.file("out.txt").write_text("x")
        run.complete({"out.txt": None})
    return run.path


def test_from_a_run_of_another_environment_is_refused(tmp_path) -> None:
    runs = str(tmp_path)
    collect = _complete("collect", CollectConfig(runs_dir=runs, env="alfworld", tasks=2), tmp_path)
    sft = _complete("sft", SFTConfig(runs_dir=runs, from_run=str(collect)), tmp_path, (("collect", collect),))
    rl = _complete("rl", RLConfig(runs_dir=runs, env="webshop", from_run=str(sft)), tmp_path)
    with pytest.raises(UserError, match=r"--env webshop, but --from .* played alfworld: .*drop --env"):
        check_from_env("rl", RLConfig(runs_dir=runs, env="webshop", from_run=str(sft)))
    with pytest.raises(UserError, match=r"--env search, but the newest sft run .* played alfworld"):  # rl's default
        check_from_env("rl", RLConfig(runs_dir=runs, env="search"))
    with pytest.raises(UserError, match=r"--env alfworld, but --from .* played webshop"):
        check_from_env("eval", EvalConfig(runs_dir=runs, from_run=str(rl / "checkpoints" / "step_000001")))
    check_from_env("rl", RLConfig(runs_dir=runs, env="alfworld", from_run=str(sft)))  # same env: fine
    check_from_env("rl", RLConfig(runs_dir=runs, env="webshop", model=str(tmp_path)))  # --model: on purpose
    out = _invoke("rl", "--env", "webshop", "--from", str(sft), "--runs-dir", runs)
    assert out.exit_code == 2 and len(out.output.strip().splitlines()) == 1
    assert "--env webshop" in out.output and "played alfworld" in out.output
    assert "--model" not in out.output  # the sft run holds no model/ to suggest
