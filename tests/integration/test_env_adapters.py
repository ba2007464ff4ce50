"""The ecosystem adapters (issue 56 §2) on their real libraries: TextArena's single-player games, reasoning-gym's
procedural tasks, and an OpenEnv server built with OpenEnv's own classes (`tests/openenv_game.py`) served by the
adapter with uvicorn and played through OpenEnv's client (two env workers share the server). Each goes through collect
→ annotate (rules) → sft → rl → eval with a tiny model (in process, CPU); bad game, dataset and option names are one
line, exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from seedcli.envs import get_env
from seedcli.envs.base import Task
from seedcli.envs.pool import EnvPool
from seedcli.errors import UserError
from tests.helpers_cli import seed_cli
from tests.helpers_envs import check_runs, every_stage

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

GAMES = "GuessTheNumber-v0,TowerOfHanoi-v0,Mastermind-v0"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from seedcli.engines.tiny import build_tiny_model
    from seedcli.envs import tokenizer_texts

    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", preset="tiny", seed=0, corpus=tokenizer_texts())


def one_line_error(*args: str) -> str:
    proc = seed_cli(*args, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    return lines[0]


# -- TextArena --------------------------------------------------------------------------------------------------------


def test_textarena_games_play_by_their_own_rules():
    pytest.importorskip("textarena")
    env = get_env("textarena", game=GAMES, test_size=4)
    tasks = env.list_tasks("test")
    assert {t.category for t in tasks} == set(GAMES.split(","))
    for task in tasks:  # the experts win; Mastermind has none
        plan = env.expert_plan(task)
        if task.category == "Mastermind-v0":
            assert plan == []
            continue
        assert plan and plan[-1][1].won and plan[-1][1].done and plan[-1][1].reward == 1.0
        assert task.category != "TowerOfHanoi-v0" or len(plan) == 7  # three disks: the optimal 2^3 − 1 moves
    game = env.new_game()
    first = game.reset(next(t for t in tasks if t.category == "TowerOfHanoi-v0"))
    assert "Tower of Hanoi" in first.task and "A: [3, 2, 1]" in first.observation
    moved = game.step("[A C]")
    assert "You moved disk 1 from A to C" in moved.observation and not moved.done
    # two unreadable moves in a row end TextArena's game, with the game's own verdict and reward
    assert "invalid move" in game.step("no move").observation
    over = game.step("still no move")
    assert over.done and not over.won and over.reward == 0.0 and "Game over" in over.observation

    # a seed replays exactly, whatever else runs in the process between two of its steps
    mastermind = next(t for t in tasks if t.category == "Mastermind-v0")
    alone, interleaved, other = env.new_game(), env.new_game(), env.new_game()
    alone.reset(mastermind)
    interleaved.reset(mastermind)
    for guess in ("[1 2 3 4]", "[2 3 4 5]", "[3 4 5 6]"):
        other.reset(tasks[0])
        assert alone.step(guess).observation == interleaved.step(guess).observation


def test_textarena_through_every_stage(tmp_path, model):
    pytest.importorskip("textarena")
    out = every_stage(tmp_path / "runs", model, "textarena", {"game": GAMES, "test_size": 2})
    trajectories = check_runs(out, "textarena", set(GAMES.split(",")))
    assert any("You are playing Tower of Hanoi" in t.task for t in trajectories) or any(
        "Guess The Number" in t.task or "Mastermind" in t.task for t in trajectories
    )


def test_textarena_refuses_bad_games_in_one_line(tmp_path):
    pytest.importorskip("textarena")
    line = one_line_error("eval", "--env", "textarena", "--policy", "random", "--runs-dir", str(tmp_path),
                          "--env-options", "{game: Chess-v0}")  # fmt: skip
    assert "not a single-player game" in line and "GuessTheNumber-v0" in line
    with pytest.raises(UserError, match="no TextArena game 'TowerOfHanoy'; did you mean TowerOfHanoi-v0"):
        get_env("textarena", game="TowerOfHanoy")
    with pytest.raises(UserError, match="unknown TextArena option 'games'"):
        get_env("textarena", games="Wordle")
    with pytest.raises(UserError, match="test_size"):
        get_env("textarena", test_size=0)


def test_a_textarena_game_without_an_expert_says_so_in_one_line(tmp_path):
    """Issue 62 §1: Mastermind has no expert; expert play (an empty action every turn, ending complete at 0%) and the
    oracle's plan (plain GRPO) are refused before anything plays."""
    pytest.importorskip("textarena")
    from seedcli.config import RLConfig
    from seedcli.stages.rl import resolve_plan

    line = one_line_error("eval", "--env", "textarena", "--env-options", "{game: Mastermind-v0}", "--policy",
                          "expert", "--runs-dir", str(tmp_path))  # fmt: skip
    assert line == (
        "error: TextArena's Mastermind-v0 has no expert (only GuessTheNumber and TowerOfHanoi have one); play it with "
        "the model or the random policy"
    )
    assert not list(tmp_path.glob("eval/*"))  # no run left behind
    with pytest.raises(UserError, match="--analyzer oracle: TextArena's Mastermind-v0 has no expert"):
        resolve_plan(RLConfig(env="textarena", env_options={"game": "GuessTheNumber-v0,Mastermind-v0"},
                              analyzer="oracle"))  # fmt: skip
    assert resolve_plan(RLConfig(env="textarena", env_options={"game": "TowerOfHanoi"}, analyzer="oracle")).teacher


# -- reasoning-gym ----------------------------------------------------------------------------------------------------


def test_reasoning_gym_scores_with_the_datasets_own_scorer_and_gives_another_try():
    reasoning_gym = pytest.importorskip("reasoning_gym")
    env = get_env("reasoning_gym", dataset="basic_arithmetic,leg_counting", tries=2, test_size=3)
    tasks = env.list_tasks("test")
    assert len(tasks) == 6 and {t.category for t in tasks} == {"basic_arithmetic", "leg_counting"}
    task = tasks[0]
    entry = reasoning_gym.create_dataset("basic_arithmetic", seed=0, size=1_000_003)[int(task.task_id.split("/")[1])]
    game = env.new_game(expert=True)
    first = game.reset(task)
    assert first.task == entry["question"] and first.expert_action == entry["answer"]
    wrong = game.step("not the answer")
    assert (
        not wrong.done
        and "scored 0 of 1 by the task's scorer" in wrong.observation
        and "1 try left" in wrong.observation
    )
    right = game.step(entry["answer"])
    assert right.done and right.won and right.reward == 1.0 and right.score == 1.0
    # the reply is read as reasoning-gym reads it: the last <answer> </answer>
    assert env.parse_action("<think>3+4</think><answer>2</answer> no, <answer> 7 </answer>") == ("7", True)
    assert env.parse_action("7") == ("", False)
    # every expert answer scores 1.0 by the dataset's scorer
    assert all(env.expert_plan(t)[-1][1].won for t in tasks)


def test_reasoning_gym_through_every_stage(tmp_path, model):
    pytest.importorskip("reasoning_gym")
    options = {"dataset": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 2}, "tries": 2, "test_size": 2}
    out = every_stage(tmp_path / "runs", model, "reasoning_gym", options)
    trajectories = check_runs(out, "reasoning_gym", {"basic_arithmetic"})
    assert all(t.task.startswith("Calculate ") for t in trajectories)
    assert "<answer>answer here</answer>" in trajectories[0].turns[0].prompt  # reasoning-gym's own system prompt


def test_reasoning_gym_refuses_bad_datasets_and_configs_in_one_line(tmp_path):
    pytest.importorskip("reasoning_gym")
    line = one_line_error("eval", "--env", "reasoning_gym", "--policy", "random", "--runs-dir", str(tmp_path),
                          "--env-options", "{dataset: basic_arithmetik}")  # fmt: skip
    assert "no dataset 'basic_arithmetik'" in line and "did you mean basic_arithmetic" in line
    with pytest.raises(UserError, match="basic_arithmetic refuses config .* max_terms must be >= min_terms"):
        get_env("reasoning_gym", config={"max_terms": 1, "min_terms": 3})
    with pytest.raises(UserError, match="seed come from the seed, train_size and test_size options"):
        get_env("reasoning_gym", config={"seed": 3})


def test_reasoning_gym_skills_that_hold_the_answer_leak():
    pytest.importorskip("reasoning_gym")
    env = get_env("reasoning_gym", test_size=1)
    task = env.list_tasks("test")[0]
    answer = env.new_game(expert=True).reset(task).expert_action
    traj = type("T", (), {"task_id": task.task_id})()
    skill = f"Compute carefully; the result was {answer} last time."
    assert env.leaks(traj, skill) == [(skill.index(answer), skill.index(answer) + len(answer))]
    assert env.leaks(traj, "Work left to right and check the sign of every product.") == []


# -- OpenEnv ----------------------------------------------------------------------------------------------------------

OPENENV = {"app": "tests.openenv_game:app", "test_size": 4}


def test_openenv_plays_a_server_through_openenvs_client():
    pytest.importorskip("openenv.core")
    env = get_env("openenv", **OPENENV)
    tasks = env.list_tasks("test")
    with EnvPool(env, 2) as pool:  # two worker processes, one server (the parent's)
        first = pool.reset_many(list(enumerate(tasks)))
        assert {r.task for r in first} == {"find the secret number from 1 to 16 in at most 5 guesses"}
        after = pool.step_many([(i, "8") for i in range(len(tasks))])
    assert all(r.observation.startswith("8 is ") for r in after)
    # the same seed, the same secret, in this process: a binary search through the hints finds it
    game = env.new_game()
    result, low, high = game.reset(tasks[0]), 1, 16
    while not result.done:
        guess = (low + high) // 2
        result = game.step(str(guess))
        low, high = (guess + 1, high) if "higher" in result.observation else (low, guess - 1)
    assert result.won and result.reward == 1.0 and result.score == 1.0
    assert after[0].observation.startswith("8 is right") == (guess == 8)
    game.close()


def test_openenv_through_every_stage(tmp_path, model):
    pytest.importorskip("openenv.core")
    out = every_stage(tmp_path / "runs", model, "openenv", OPENENV)  # the pool test above has the workers
    trajectories = check_runs(out, "openenv", {"all"})
    assert all(t.turns[0].observation.startswith("Guess the secret number") for t in trajectories)


def test_openenv_refuses_what_it_cannot_reach_in_one_line(tmp_path):
    pytest.importorskip("openenv.core")
    line = one_line_error("eval", "--env", "openenv", "--policy", "random", "--runs-dir", str(tmp_path),
                          "--env-options", "{url: x}")  # fmt: skip
    assert "give the server's address as http://host:port" in line
    with pytest.raises(UserError, match="openenv needs a server"):
        get_env("openenv").spec()
    with pytest.raises(UserError, match='did not start: .*Could not import module "tests.no_such_module"'):
        get_env("openenv", app="tests.no_such_module:app").spec()
    with pytest.raises(UserError, match="OpenEnv server at http://127.0.0.1:9 did not answer GET /metadata"):
        get_env("openenv", url="http://127.0.0.1:9").new_game().reset(Task("1000000", "all", "test"))
