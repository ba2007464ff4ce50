"""`seed probe` end to end (CLI in subprocesses, CPU, the tiny model): on an expert-played eval run of every
environment it re-scores the replies under each context, with the skill block in the teacher's prompt; `--play N`
plays the tasks again with the skill in every turn's prompt; bad inputs are one line and exit 2; on vLLM too."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import orjson
import pytest

from tests.helpers_cli import seed_cli, summary

SMALL = ["--max-steps", "3", "--max-new-tokens", "12"]
SPLIT = {"alfworld": "unseen", "webshop": "test", "search": "test", "sokoban": "test", "ezpoints": "test"}


@pytest.fixture(scope="module")
def model(tiny_model) -> Path:
    return tiny_model  # the tiny preset, built once per test run (tests/conftest.py)


def expert_run(runs: Path, env: str, limit: int = 3) -> Path:
    extra = ["--datasets", "nq"] if env == "search" else []
    out = seed_cli("eval", "--env", env, "--split", SPLIT[env], "--policy", "expert", "--limit", str(limit),
                   "--runs-dir", str(runs), "--json", *extra)  # fmt: skip
    return runs / "eval" / summary(out)["run_id"]


def probe(runs: Path, env: str, src: Path, model: Path, *args: str) -> tuple[dict, Path]:
    out = seed_cli("probe", "--env", env, "--from", str(src), "--model", str(model), "--runs-dir", str(runs),
                   *SMALL, "--json", *args)  # fmt: skip
    run = runs / "probe" / summary(out)["run_id"]
    return json.loads((run / "probe.json").read_text()), run


# make test probes EZPoints; the four other environments run in make test-all (slow)
@pytest.mark.parametrize("env", [e if e == "ezpoints" else pytest.param(e, marks=pytest.mark.slow) for e in SPLIT])
def test_probe_rescores_an_expert_run_under_every_context(model, tmp_path, env):
    src = expert_run(tmp_path, env)
    result, run = probe(tmp_path, env, src, model, "--skills", "rules")
    ctx = result["contexts"]
    assert {"null", "own", "oracle", "oracle_shuffled"} <= set(ctx)  # shuffled needs differing own skills
    episodes = result["episodes"]
    for name in ("null", "own", "oracle"):
        assert ctx[name]["episodes"] == episodes
        assert ctx[name]["action"]["all"]["tokens"] > 0  # the expert's action was found in its replies
        assert ctx[name]["other"]["all"]["tokens"] > 0
    # the tiny model is random, but its log-probs do depend on the prompt: every skill moves some tokens
    assert ctx["oracle"]["all"]["all"]["reply_absmax_mean"] > 0
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "complete" and {i["stage"] for i in manifest["inputs"]} == {"eval"}
    assert (run / "probe.png").stat().st_size > 0
    skills = [orjson.loads(x) for x in (run / "skills.jsonl").read_bytes().splitlines()]
    assert len(skills) == episodes and all(s["skill"] for s in skills)


@pytest.mark.slow
def test_play_puts_the_skill_in_every_turn_and_pairs_the_tasks(model, tmp_path):
    src = expert_run(tmp_path, "ezpoints", limit=4)
    result, run = probe(tmp_path, "ezpoints", src, model, "--skills", "rules", "--play", "3")
    none = [orjson.loads(x) for x in (run / "play_none.jsonl").read_bytes().splitlines()]
    oracle = [orjson.loads(x) for x in (run / "play_oracle.jsonl").read_bytes().splitlines()]
    assert len(none) == len(oracle) == 3 and [e["task_id"] for e in none] == [e["task_id"] for e in oracle]
    assert all("Privileged (oracle)" in t["prompt"] for e in oracle for t in e["turns"])
    assert not any("Privileged (oracle)" in t["prompt"] for e in none for t in e["turns"])
    gap = result["play"]["oracle"]
    assert gap["tasks"] == 3 and gap["success"] == sum(e["won"] for e in oracle) / 3


def test_bad_inputs_are_one_line(model, tmp_path):
    src = expert_run(tmp_path, "ezpoints", limit=2)
    for args, says in (
        (["--env", "sokoban", "--from", str(src)], "drop --env (the run's ezpoints is used)"),
        (["--env", "ezpoints"], "needs --from RUN"),
        (["--env", "ezpoints", "--from", str(tmp_path / "nope")], "no such directory"),
        (["--env", "ezpoints", "--from", str(src), "--skills", str(tmp_path)], "manifest"),
    ):
        proc = seed_cli("probe", "--model", str(model), "--runs-dir", str(tmp_path), *args, check=False)
        assert proc.returncode == 2, proc.stderr
        assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
@pytest.mark.slow
def test_probe_on_the_vllm_engine(model, tmp_path):
    src = expert_run(tmp_path, "ezpoints", limit=2)
    result, _ = probe(tmp_path, "ezpoints", src, model, "--skills", "self", "--engine", "vllm", "--play", "2",
                      "analyzer_max_new_tokens=16")  # fmt: skip
    assert result["contexts"]["oracle"]["episodes"] == 2 and result["play"]["oracle"]["tasks"] == 2
