"""`TextEnv`'s documented defaults (seedcli/envs/text.py) and the one registry `--env` resolves through
(seedcli/envs/registry.py): a small class written in the test plays, prompts, parses, scores and analyses as the module
docstring says; a class that lacks what the protocol needs is named in one line."""

from __future__ import annotations

import math
import random
import sys

import numpy as np
import pytest

from seedcli.envs import Observation, TextEnv, entry, env_class, env_names, get_env
from seedcli.envs.base import Task
from seedcli.envs.pool import EnvPool
from seedcli.envs.registry import protocol_problem
from seedcli.envs.text import generic_rules_skill
from seedcli.errors import EnvFault, UserError
from seedcli.prompts import SKILL_HEADING, STEP_SKILL_HEADING
from seedcli.records import Trajectory, Turn


class Countdown(TextEnv):
    """Count down from a number to zero, one step at a time.

    More words that are not the task line."""

    instructions = "Say 'down' to count down.\nSay anything else to wait."
    max_steps = 6

    def tasks(self, split):
        return [3, 2] if split == "train" else ["five", {"id": "x", "start": 1, "category": "short"}, {"start": 4}]

    def reset(self, task):
        self.left = task.get("start", 1) if isinstance(task, dict) else (task if isinstance(task, int) else 5)
        return f"{self.left} to go."

    def step(self, action):
        self.left -= action == "down"
        if self.left <= 0:
            return "Zero!", 2.5, True, {"note": "done"}
        return f"{self.left} to go.", 0.0, False

    def admissible(self):
        return ["down", "wait"]

    def expert(self):
        return "down"


class NoExpert(TextEnv):
    def tasks(self, split):
        return ["a", "b"]

    def reset(self, task):
        return ""

    def step(self, action):
        return "again", -1.0, action == "stop"


def test_defaults_are_filled_from_the_class():
    assert (Countdown.title, Countdown.name, Countdown.max_steps, Countdown.history) == ("Countdown", "countdown", 6, 3)
    assert Countdown.expert_modes == (False, True) and NoExpert.expert_modes == (False,)
    assert Countdown.analysis_description.startswith("You are an expert analyst of agents playing Countdown")
    assert Countdown.categories == () and Countdown.eval_splits == ("test",) and Countdown.val_split == "test"
    assert (Countdown.success_reward, Countdown.invalid_penalty, Countdown.advantage_norm) == (10.0, 0.1, "mean_std")
    assert protocol_problem(Countdown) == ""


def test_tasks_are_named_and_grouped_as_documented():
    env = Countdown()
    assert [(t.task_id, t.category) for t in env.list_tasks("train")] == [("3", "all"), ("2", "all")]
    assert [(t.task_id, t.category) for t in env.list_tasks("eval")] == [("five", "all"), ("x", "short"), ("2", "all")]
    assert env.task_value(Task("x", "short", "test")) == {"id": "x", "start": 1, "category": "short"}
    with pytest.raises(UserError, match="no task 'nope' in split 'test'; tasks\\(split\\) must return the same"):
        env.task_value(Task("nope", "all", "test"))
    assert env.canonical_category("SHORT") == "short" and env.canonical_category("long") is None

    class Twice(NoExpert):
        def tasks(self, split):
            return ["a", "a"]

    with pytest.raises(UserError, match="two tasks of split 'train' share the id 'a'"):
        Twice().list_tasks("train")


def test_a_game_plays_one_instance_per_slot_with_the_documented_outcome():
    env = Countdown()
    short, long_ = env.list_tasks("test")[1], env.list_tasks("test")[2]
    one, two = env.new_game(expert=True), env.new_game()
    first = one.reset(long_)
    assert first.task == "Count down from a number to zero, one step at a time."  # the docstring's first paragraph
    assert first.observation == "4 to go." and first.admissible == ["down", "wait"] and first.expert_action == "down"
    assert two.reset(short).expert_action is None  # not an expert game
    end = two.step("down")  # the other slot's state is its own
    assert (
        end.won and end.done and end.reward == 2.5 and end.score == 1.0 and end.info == {"note": "done", "return": 2.5}
    )
    assert end.admissible is None and end.expert_action is None
    assert one.step("wait").observation == "4 to go."
    plan = env.expert_plan(long_)
    assert [a for a, _ in plan] == ["down"] * 4 and plan[-1][1].won

    lost = NoExpert().new_game()
    lost.reset(Task("a", "all", "train"))
    over = lost.step("stop")
    assert over.done and not over.won and over.score == 0.0 and over.info["return"] == -1.0

    class Broken(NoExpert):
        def step(self, action):
            return "only an observation"

    game = Broken().new_game()
    game.reset(Task("a", "all", "train"))
    with pytest.raises(EnvFault, match="Broken.step returned a str, not \\(observation, reward, done\\[, info\\]\\)"):
        game.step("x")


def test_an_environment_without_an_expert_refuses_expert_play_in_one_line():
    with pytest.raises(UserError, match="NoExpert has no expert"):
        EnvPool(NoExpert(), 0, expert=True)


def test_the_prompt_its_skill_blocks_and_the_reply_format():
    env = Countdown()
    prompt = env.render_prompt("count down\nfrom four", "2 to go.", ["down", "wait"], 3, [("4 to go.", "down")] * 2, 1)
    lines = prompt.splitlines()
    assert lines[:6] == [
        "You are an agent playing Countdown.",
        "Say 'down' to count down.",
        "Say anything else to wait.",
        "Your task: count down",
        "from four",
        "",
    ]
    assert "Your last 1 step(s) of 2:\nObservation: 4 to go.\nAction: down\n" in prompt
    assert "Current observation (step 3):\n2 to go.\nAdmissible actions: down, wait\n" in prompt
    assert lines[-1].startswith("Now it's your turn") and "<action> </action>" in lines[-1]
    # the skill block goes after the whole task, the step-skill block before the turn line
    skilled = env.insert_skill(prompt, "Say down four times.")
    assert skilled.index("from four") < skilled.index(SKILL_HEADING) < skilled.index("Your last 1 step")
    stepped = env.insert_step_skill(prompt, "Say down now.")
    assert stepped.index("Admissible actions") < stepped.index(STEP_SKILL_HEADING) < stepped.index("Now it's your turn")
    assert "Current observation (step 1):\n(nothing yet)" in env.render_prompt("t", "", None, 1, [], 3)

    assert env.parse_action("<think>go</think>\n<action> down </action>") == ("down", True)
    assert env.parse_action("<action>wait</action> then <action>down</action>") == ("down", False)  # no think
    assert env.parse_action("I think down\ndown") == ("down", False)
    assert env.parse_action(env.format_response("why", "wait")) == ("wait", True)
    rng = random.Random(0)
    assert env.parse_action(env.random_response(env.new_game().reset(env.list_tasks("train")[0]), rng))[0] in (
        "down",
        "wait",
    )


def test_image_observations_travel_as_png_and_the_prompt_places_them():
    class Squares(NoExpert):
        image_size = (8, 6)

        def reset(self, task):
            return Observation("a square", image=np.full((8, 6, 3), 200, np.uint8))

    env = Squares()
    assert env.frame_size() == (8, 6) and Squares.observation_modes == ("image",)
    first = env.new_game().reset(Task("a", "all", "train"))
    assert first.image[:8] == b"\x89PNG\r\n\x1a\n" and first.observation == "a square"
    assert "Current observation (step 1):\n<image>\na square" in env.render_prompt("t", "a square", None, 1, [], 0)


def _trajectory(won: bool, actions: list[str], valid: list[bool]) -> Trajectory:
    turns = [
        Turn(step=i + 1, observation="o", admissible=[], prompt="p", response="r", action=a, valid=v)
        for i, (a, v) in enumerate(zip(actions, valid, strict=True))
    ]
    return Trajectory(episode_id="e", group_id="g", env="countdown", task_id="3", split="train", category="all",
                      task="t", turns=turns, won=won, reward=10.0 * won, length=len(turns), engine="hf", model_id="m",
                      model_hash="h", sampling={}, prompt_version="text-v1", seed=0)  # fmt: skip


def test_the_generic_rules_skill_reads_the_outcome():
    cases = {
        (True, ("down",), (True,)): "completed the Countdown task in 1 step(s)",
        (False, ("a", "b", "c"), (False, False, True)): "2 of its 3 replies did not follow the reply format",
        (False, ("x", "x", "x", "y"), (True,) * 4): "sent the same action 3 times in 4 steps",
        (False, ("x", "y"), (True, True)): "the 2 steps ran out",
    }
    skills = set()
    for (won, actions, valid), summary in cases.items():
        got_summary, skill = generic_rules_skill(_trajectory(won, list(actions), list(valid)), "Countdown")
        assert summary in got_summary and len(skill.split()) >= 5
        skills.add(skill)
    assert len(skills) == 4
    assert Countdown().rules_skill(_trajectory(True, ["down"], [True]))[1] in skills


def test_the_oracle_is_the_experts_plan_and_none_without_one():
    traj = _trajectory(False, ["wait"], [True])
    assert (
        Countdown().oracle_skill(traj)
        == "Privileged (oracle): the expert's plan for this task: 1. down; 2. down; 3. down."
    )
    assert NoExpert().oracle_skill(_trajectory(False, ["x"], [True]).model_copy(update={"task_id": "a"})) is None


def test_the_registry_resolves_module_paths_and_names_what_a_class_lacks(tmp_path, monkeypatch):
    assert {"alfworld", "ezpoints", "textarena", "openenv", "reasoning_gym"} <= set(env_names())
    assert entry("SOKOBAN").origin == "built in" and entry("textarena").origin == "built in (extra: textarena)"
    with pytest.raises(UserError, match="unknown environment 'sokoben'; did you mean 'sokoban'\\?"):
        entry("sokoben")
    # a module in the working directory, as `python -m` would import it; the class carries its registry name
    (tmp_path / "cwd_games.py").write_text(
        "from tests.unit.test_text_env import Countdown\nclass Game(Countdown):\n    name = 'game'\n", encoding="utf-8"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    cls = env_class("cwd_games:Game")
    assert cls.name == "cwd_games:Game" and cls.title == "Countdown" and cls is env_class("cwd_games:Game")
    assert get_env("cwd_games:Game").name == "cwd_games:Game" and cls.__bases__[0].__qualname__ == "Game"
    assert entry("cwd_games:Game").origin == "module path"

    class Partial(TextEnv):
        def tasks(self, split):
            return []

    assert protocol_problem(Partial) == "Partial does not define reset, step"
    assert protocol_problem(int) == "class int is not a subclass of seedcli.envs.TextEnv (or seedcli.envs.Environment)"


# -- issue 62 §1-§2: a class that breaks the protocol is one line naming the class, the method, the task and the step


class Faulty(NoExpert):  # it and its subclasses keep the registry name `noexpert`
    """Plays two steps; what its second step returns is the class attribute `second` (a fault under test)."""

    second: tuple = ("fine", 0.0, True)

    def reset(self, task):
        self.n = 0
        return "start"

    def step(self, action):
        self.n += 1
        return self.second if self.n == 2 else ("going", 0.0, False)


def _second_step(second: tuple):
    game = type("Game", (Faulty,), {"second": second})().new_game()
    game.reset(Task("b", "all", "train"))
    game.step("x")
    return game.step("x")


@pytest.mark.parametrize(
    ("reward", "says"),
    [
        (math.nan, "the reward nan, not a finite number"),  # was stored as null and counted as a loss
        (-math.inf, "the reward -inf, not a finite number"),
        (math.inf, "the reward inf, not a finite number"),  # was counted as a win
        ("1", "the reward '1' (str), not a number"),  # was float('1'): a win
        (None, "the reward None (NoneType), not a number"),
    ],
)
def test_a_reward_that_is_not_a_finite_number_is_an_environment_fault(reward, says):
    with pytest.raises(EnvFault) as fault:
        _second_step(("obs", reward, True))
    line = str(fault.value)
    assert line.startswith(f"Game.step returned {says} (environment noexpert, task b, step 2); ") and "\n" not in line


def test_an_observation_as_bytes_is_an_environment_fault():
    with pytest.raises(EnvFault, match=r"Game.step returned an observation as bytes \(environment noexpert, task b, "
                                       r"step 2\); decode it to a str"):  # fmt: skip
        _second_step((b"\xff\xfe", 0.0, False))  # was the text "b'\\xff\\xfe'"
    assert _second_step(("ünïcode ✓", 1.0, True)).observation == "ünïcode ✓"


def test_an_observation_holding_a_lone_surrogate_is_an_environment_fault():
    with pytest.raises(EnvFault, match=r"Game.step returned an observation holding the lone surrogate '\\udcff' at "
                                       r"character 1, not text \(environment noexpert, task b, step 2\)"):  # fmt: skip
        _second_step(("x\udcff", 0.0, False))  # crashed later, when the episode was written


def test_a_method_that_raises_or_returns_the_wrong_shape_is_an_environment_fault_with_its_traceback():
    class Raises(Faulty):
        def step(self, action):
            raise KeyError("the board")

    game = Raises().new_game()
    game.reset(Task("a", "all", "train"))
    with pytest.raises(EnvFault) as fault:
        game.step("x")
    assert str(fault.value).startswith(
        "Raises.step raised KeyError: 'the board' (environment noexpert, task a, step 1)"
    )
    assert "Traceback" in fault.value.detail and 'raise KeyError("the board")' in fault.value.detail

    class ResetRaises(Faulty):
        def reset(self, task):
            return 1 / 0

    with pytest.raises(EnvFault, match=r"ResetRaises.reset raised ZeroDivisionError: division by zero \(environment "
                                       r"noexpert, task a, at reset\)"):  # fmt: skip
        ResetRaises().new_game().reset(Task("a", "all", "train"))
    with pytest.raises(EnvFault, match=r"Game.step returned a 2-tuple, not \(observation, reward, done\[, info\]\)"):
        _second_step(("obs", 1.0))


def test_an_empty_split_is_refused():
    class Empty(NoExpert):
        def tasks(self, split):
            return [] if split == "test" else ["a"]

    with pytest.raises(UserError, match=r"Empty.tasks\('test'\) returned no tasks \(environment noexpert\)"):
        Empty().list_tasks("test")  # was a complete eval over 0 episodes
    assert [t.task_id for t in Empty().list_tasks("train")] == ["a"]


def test_tasks_that_raise_are_an_environment_fault():
    class NoFile(NoExpert):
        def tasks(self, split):
            raise FileNotFoundError("tasks.json")

    with pytest.raises(EnvFault, match=r"NoFile.tasks\('train'\) raised FileNotFoundError: tasks.json"):
        NoFile().list_tasks("train")


def test_check_plays_finds_a_step_of_the_wrong_shape():
    class TwoTuple(Faulty):
        def step(self, action):
            return "obs", 0.0

    with pytest.raises(EnvFault, match=r"TwoTuple.step returned a 2-tuple, .*\(environment noexpert, task a, step 1\)"):
        TwoTuple().check_plays("train")
    Countdown().check_plays("test")  # a class that keeps the protocol passes


def test_a_turn_limit_above_max_steps_is_refused_when_the_class_loads():
    class Forever(Countdown):
        max_steps = 10**9

    assert protocol_problem(Forever) == (
        "Forever.max_steps = 1000000000: the turn limit must be a whole number from 1 to 1000 (an episode that never "
        "ends would show no progress)"
    )
    from seedcli.config import EvalConfig

    with pytest.raises(ValueError, match="less than or equal to 1000"):
        EvalConfig(env="ezpoints", max_steps=10**9)
