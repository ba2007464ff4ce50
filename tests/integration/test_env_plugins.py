"""An environment from outside seedcli (issue 56 §1), the way a user adds one: docs/environments.md's complete example,
read from the page itself, saved as a module outside the repository and run through collect → annotate (rules) → sft
→ rl → eval by `--env my_games:Doubling` with a tiny model (in process, CPU, env workers rebuilding it by its module
path); an installed package's entry point makes `seed envs` list it and `seed eval --env NAME` play it; and plug-ins
that do not load are one line naming the package and what is missing, exit 2 (CLI in subprocesses)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers_cli import ENV, REPO, seed_cli, summary
from tests.helpers_envs import check_runs, every_stage

DOC = REPO / "docs" / "environments.md"
ENV_NAME = "my_games:Doubling"


def doc_example() -> str:
    """The code block of docs/environments.md that starts with `# my_games.py`."""
    blocks = re.findall(r"```python\n(# my_games\.py\n.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)
    assert len(blocks) == 1, "docs/environments.md holds one complete example"
    return blocks[0]


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("plugin")
    (folder / "my_games.py").write_text(doc_example(), encoding="utf-8")
    return folder


def cli(folder: Path, *args: str, check: bool = True):
    """`seed ARGS` with the plug-in's folder on PYTHONPATH, as a user who installed nothing."""
    return seed_cli(*args, check=check, env={**ENV, "PYTHONPATH": str(folder)})


def test_the_docs_example_is_short_and_complete():
    code = doc_example()
    assert len(code.strip().splitlines()) <= 40
    assert "def tasks" in code and "def reset" in code and "def step" in code


def test_the_docs_example_runs_through_every_stage(plugin_dir, tmp_path, monkeypatch):
    from seedcli.engines.tiny import build_tiny_model
    from seedcli.envs import tokenizer_texts

    model = build_tiny_model(tmp_path / "tiny", preset="tiny", seed=0, corpus=tokenizer_texts())
    # importable as a user's module is: from PYTHONPATH, here and in the env workers (two a stage), which rebuild the
    # class by its module path
    monkeypatch.syspath_prepend(str(plugin_dir))
    monkeypatch.setenv("PYTHONPATH", str(plugin_dir))
    out = every_stage(tmp_path / "runs", model, ENV_NAME, {}, workers=2)
    trajectories = check_runs(out, ENV_NAME, {"all"})
    prompt = trajectories[0].turns[0].prompt
    assert "You are an agent playing Doubling." in prompt and "Your task: reach exactly " in prompt
    assert "Admissible actions: add 1, double" in prompt and "<action> </action>" in prompt
    skills = [json.loads(x) for x in (out["annotate"] / "skills.jsonl").read_text().splitlines()]
    assert {s["model"] for s in skills} == {"text-rules-v1"}  # the generic rules analyzer, versioned


def _install_entry_point(site: Path, value: str, name: str = "doubling") -> None:
    """An installed distribution as importlib.metadata finds it: a .dist-info folder with its entry points."""
    info = site / "my_games-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-games\nVersion: 1.0\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(f"[seedcli.envs]\n{name} = {value}\n", encoding="utf-8")


def test_an_entry_point_names_the_environment(plugin_dir, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "my_games.py").write_text(doc_example(), encoding="utf-8")
    _install_entry_point(site, "my_games:Doubling")
    listed = cli(site, "envs").stdout
    assert "doubling (Doubling; entry point (package my-games))" in listed
    for adapter in ("textarena", "openenv", "reasoning_gym"):  # every environment, the adapters included
        assert re.search(rf"^{adapter} \(\w.*; built in \(extra: [\w-]+\)\)", listed, re.MULTILINE), adapter
    described = json.loads(cli(site, "envs", "--env", "doubling", "--json").stdout)
    assert described[0]["origin"] == "entry point (package my-games)" and described[0]["name"] == "doubling"
    # the expert the example defines wins every game it plays (two env workers find the name's class)
    ev = summary(cli(site, "eval", "--env", "doubling", "--policy", "expert", "--limit", "6", "--runs-dir",
                     str(tmp_path / "runs"), "--json"))  # fmt: skip
    assert ev["metrics"]["env"] == "doubling" and ev["metrics"]["micro_success"] == 1.0 and ev["metrics"]["games"] == 6


BROKEN = {
    "an import that fails": ("import not_a_real_package\n", "importing broken_games failed (No module named"),
    "no step": (
        "from seedcli.envs import TextEnv\nclass Game(TextEnv):\n    def tasks(self, split): return [1]\n"
        "    def reset(self, task): return ''\n",
        "Game does not define step",
    ),  # fmt: skip
    "not an environment": ("class Game:\n    pass\n", "is not a subclass of seedcli.envs.TextEnv"),
    "a name that is not there": ("x = 1\n", "module broken_games has no attribute 'Game'"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_plugin_that_does_not_load_is_one_line(tmp_path, case):
    source, expected = BROKEN[case]
    (tmp_path / "broken_games.py").write_text(source, encoding="utf-8")
    for args in (("envs", "--env", "broken_games:Game"), ("eval", "--env", "broken_games:Game", "--policy", "random")):
        proc = (
            cli(tmp_path, *args, "--runs-dir", str(tmp_path / "runs"), check=False)
            if args[0] == "eval"
            else cli(tmp_path, *args, check=False)
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert "(package broken_games)" in lines[0] and expected in lines[0], lines[0]


def test_a_broken_entry_point_is_one_line_naming_its_package(tmp_path):
    _install_entry_point(tmp_path, "gone_module:Game", name="gone")
    proc = cli(tmp_path, "envs", "--env", "gone", check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "entry point (package my-games)" in lines[0] and "No module named 'gone_module'" in lines[0]


# -- a user's environment fault is the user's, in one line --------------------------------------------

FAULTY = """from seedcli.envs import TextEnv


class Game(TextEnv):
    def tasks(self, split):
        if split == "train":
            raise FileNotFoundError("train.json")
        return ["a", "b"]

    def reset(self, task):
        self.task, self.n = task, 0
        return "start"

    def step(self, action):
        self.n += 1
        if self.task == "b" and self.n == 2:
            raise ValueError("the board broke")
        return "going", 0.0, self.n >= 2


class TwoTuple(Game):
    def step(self, action):
        return "going", 0.0
"""


def test_an_environment_fault_is_one_line_and_the_run_fails_with_it(tmp_path):
    """Task b's second step raises in an env worker: one line naming the class, the method, the task and the step
    (exit 2, not the "please report it" crash), the run `failed` with it and the traceback in the run's log."""
    (tmp_path / "faulty_games.py").write_text(FAULTY, encoding="utf-8")
    runs = tmp_path / "runs"
    # one episode at a time: task a's is written before task b's fails, so the run is kept (failed), not removed
    proc = cli(tmp_path, "eval", "--env", "faulty_games:Game", "--policy", "random", "--workers", "2",
               "--runs-dir", str(runs), "gen_batch=1", check=False)  # fmt: skip
    line = proc.stderr.strip().splitlines()[-1]
    [run_dir] = (runs / "eval").iterdir()
    [log] = run_dir.glob("error-*.log")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "unexpected" not in proc.stderr, proc.stderr
    fault = (
        "Game.step raised ValueError: the board broke (environment faulty_games:Game, task b, step 2); see "
        "docs/environments.md#when-it-breaks-the-protocol"
    )
    assert line == f"error: {fault} (traceback in {log})"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["error"] == f"EnvFault: {fault}"
    assert 'raise ValueError("the board broke")' in log.read_text()  # the worker's traceback, the user's own line
    # `seed envs` describes the class, and the split whose tasks() raises says so (it was the crash path)
    listed = cli(tmp_path, "envs", "--env", "faulty_games:Game")
    assert "Game.tasks('train') raised FileNotFoundError: train.json" in listed.stdout
    assert (
        listed.stderr == "" and "split test (also: eval, valid) [eval default, rl validation]: 2 tasks" in listed.stdout
    )


def test_a_class_of_the_wrong_shape_fails_before_a_model_loads(tmp_path, monkeypatch):
    """A step that returns a 2-tuple is found by one step played when the stage starts, not after the model loads
    (here: before the missing model is even looked at)."""
    from seedcli.config import CollectConfig
    from seedcli.errors import EnvFault
    from seedcli.stages import collect

    (tmp_path / "shape_games.py").write_text(FAULTY, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = CollectConfig(env="shape_games:TwoTuple", split="test", model=str(tmp_path / "no_model"),
                        runs_dir=str(tmp_path / "runs"))  # fmt: skip
    with pytest.raises(EnvFault, match=r"^TwoTuple.step returned a 2-tuple, not \(observation, reward, done\[, info\]\) "
                                       r"\(environment shape_games:TwoTuple, task a, step 1\)"):  # fmt: skip
        collect.run(cfg)
    assert not (tmp_path / "runs").exists()
