"""Sokoban and EZPoints on the environment protocol: verl-agent's prompts and reply projections (quirks included),
the splits, the rules skills, and image observations stored once per run and accounted for in the manifest."""

from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import pytest

from seedcli.envs import get_env
from seedcli.envs.base import Task
from seedcli.envs.ezpoints.projection import gym_projection
from seedcli.envs.ezpoints.prompt import EZPOINTS_TEMPLATE, EZPOINTS_TEXT_TEMPLATE, card_numbers
from seedcli.envs.ezpoints.rules import classify as ez_classify
from seedcli.envs.sokoban.game import Sokoban
from seedcli.envs.sokoban.projection import sokoban_projection
from seedcli.envs.sokoban.prompt import SOKOBAN_TEMPLATE, SOKOBAN_VISUAL_TEMPLATE, render_history
from seedcli.envs.sokoban.rules import classify as sok_classify
from seedcli.envs.sokoban.rules import parse_grid
from seedcli.errors import UserError
from seedcli.images import ImageStore, check_images, decode_png
from seedcli.records import Trajectory, Turn

# sha256 of verl-agent's templates (agent_system/environments/prompts/{sokoban,gym_cards}.py at d0b9724), taken from
# the original files: a changed character here is a changed prompt.
TEMPLATE_SHA = {
    "SOKOBAN_TEMPLATE_NO_HIS": "29a44f99c7414b4f8ee0eeb8549a04f3cd2ac392257d45b74dad1db804e8cd56",
    "SOKOBAN_TEMPLATE": "8d5f4c9c909e797f3fbc723e109d45f09f26479502f3a9343dea07dbf367ffb7",
    "SOKOBAN_VISUAL_TEMPLATE": "33bd35adaf727ef6092312f3847b7b5e8aaed21f568f9a5c1732b9397c3f2001",
    "EZPOINTS_TEMPLATE": "a2624e223d8541c088b27d93533da0a552eb8fce77ec181afbfbb5f179ab94bd",  # GYM_CARDS_EZPOINTS_TEMPLATE
}


@pytest.mark.parametrize("name", sorted(TEMPLATE_SHA))
def test_templates_are_the_originals_character_for_character(name):
    from seedcli.envs.ezpoints import prompt as ezpoints_prompt
    from seedcli.envs.sokoban import prompt as sokoban_prompt

    text = getattr(sokoban_prompt, name, None) or getattr(ezpoints_prompt, name)
    assert hashlib.sha256(text.encode()).hexdigest() == TEMPLATE_SHA[name]


@pytest.mark.parametrize(
    "reply,want",
    [
        ("<think>go</think><action>up</action>", ("up", True)),
        ("<think>go</think><action> Move LEFT </action>", ("left", True)),  # a name inside the text counts
        ("<think>go</think><action>upright</action>", ("up", True)),  # the pool's order decides: up before right
        ("<think>go</think><action>still</action>", ("still", True)),  # valid, and moves nothing
        ("<think>go</think><action>jump</action>", ("still", False)),
        ("<action>down</action>", ("down", False)),  # no think: invalid, yet the move is played
        ("<think>x</think> down", ("still", False)),
        ("<think>x</think><action>down", ("still", False)),  # an unclosed tag is no action block
    ],
)
def test_sokoban_projection_as_verl_agent(reply, want):
    assert sokoban_projection(reply) == want


@pytest.mark.parametrize(
    "reply,want",
    [
        ('{"thoughts": "5 and 7 add up", "action": "5"}', ("5", True)),
        ('{"thoughts": "x", "action": "10"}', ("10", True)),  # "10" taken first, not also "1"
        ('{"thoughts": "x", "action": "+"}', ("+", True)),
        ('{"action": "=", "thoughts": "5+7 is 12"}', ("", False)),  # everything after "action": is searched
        ('{"thoughts": "x", "action": "5 or 7"}', ("", False)),  # two names: no action
        ("I append 7", ("7", True)),  # no "action": only the last character is searched
        ("I append 7.", ("", False)),
        ('{"thoughts": "x", "action": "9"}', ("9", True)),  # a number not on the cards is still a valid reply
    ],
)
def test_gym_projection_as_verl_agent(reply, want):
    assert gym_projection(reply) == want


def test_sokoban_prompts_are_verl_agents():
    env = get_env("sokoban")
    room = Sokoban(0).text()
    first = env.render_prompt("push all the boxes", room, None, 1, [], 2)
    assert first.startswith("\nYou are an expert agent operating in the Sokoban environment.\n")
    assert f"Your current observation is:\n{room}\nYour admissible actions" in first
    history = [(room, "up"), (room, "still"), (room, "left")]
    later = env.render_prompt("push all the boxes", room, None, 4, history, 2)
    text, shown = render_history(history, 2)
    assert (
        shown == 2
        and text == f"[Observation 2: '{room}', Action 2: 'Still']\n[Observation 3: '{room}', Action 3: 'Left']"
    )
    assert later == SOKOBAN_TEMPLATE.format(
        step_count=3, history_length=2, action_history=text, current_step=4, current_observation=room
    )
    visual = get_env("sokoban", observation="image")
    assert visual.render_prompt("push all the boxes", room, None, 4, history, 2) == SOKOBAN_VISUAL_TEMPLATE
    assert SOKOBAN_VISUAL_TEMPLATE.count("<image>") == 1
    # the skill block goes under the goal line in both modes
    for e, prompt in ((env, later), (visual, SOKOBAN_VISUAL_TEMPLATE)):
        with_skill = e.insert_skill(prompt, "Push from behind.")
        goal_line = next(
            line for line in prompt.split("\n") if line.startswith(e.task_line_prefix) or "Your goal" in line
        )
        assert with_skill.index("Push from behind.") > with_skill.index(goal_line)


def test_ezpoints_prompts_are_verl_agents_and_the_text_variant_names_the_cards():
    image_env = get_env("ezpoints", observation="image")
    prompt = image_env.render_prompt("5 of Spades and 7 of Diamonds", "5+", None, 3, [], 0)
    assert prompt == EZPOINTS_TEMPLATE.format(text_formula="5+") and prompt.startswith("\n<image>You are an expert")
    text_env = get_env("ezpoints")
    prompt = text_env.render_prompt("5 of Spades and 7 of Diamonds", "5+", None, 3, [], 0)
    assert "<image>" not in prompt and "image" not in prompt.lower()
    assert "1. The two playing cards are: 5 of Spades and 7 of Diamonds." in prompt
    assert "the current formula is: '5+'" in prompt
    # outside the edited sentences the text variant is the original, line for line
    same = [line for line in EZPOINTS_TEXT_TEMPLATE.split("\n") if line in EZPOINTS_TEMPLATE.split("\n")]
    assert len(same) >= len(EZPOINTS_TEMPLATE.split("\n")) - 4


def test_splits_and_selection():
    for name in ("sokoban", "ezpoints"):
        env = get_env(name)
        test = env.list_tasks("test")
        assert len(test) == 512 and all(2**16 <= int(t.task_id) < 2**32 for t in test)
        assert env.select_tasks(test, 7, seed=3) == test[:7]  # `--limit` plays a prefix of the fixed list
        train = env.list_tasks("train")
        assert len(train) == 2**16 - 1
        picked = env.select_tasks(train, 5, seed=0)
        assert [t.task_id for t in picked] == [str(s) for s in np.random.RandomState(0).randint(0, 2**16 - 1, 5)]
        assert env.select_tasks(train, 5, seed=0) == picked
        with pytest.raises(UserError, match="unknown"):
            env.select_tasks(train, 5, seed=0, categories=["nope"])


def _turn(step: int, observation: str, action: str, valid: bool = True) -> Turn:
    return Turn(step=step, observation=observation, admissible=[], prompt="", response="", action=action, valid=valid)


def _trajectory(env: str, task: str, turns: list[Turn], won: bool) -> Trajectory:
    return Trajectory(
        episode_id="e0", group_id="e0", env=env, task_id="0", split="train", category=env, task=task, turns=turns,
        won=won, reward=10.0 * won, length=len(turns), engine="none", model_id="", model_hash="", sampling={},
        prompt_version="v", seed=0,
    )  # fmt: skip


def test_sokoban_rules_read_the_grids():
    g = Sokoban(42)  # P X _ O in row 1: two pushes right solve it
    grids = [g.text()]
    g.step(4)
    grids.append(g.text())
    assert parse_grid(grids[1]).tolist() == g.state().tolist()
    won = _trajectory("sokoban", "t", [_turn(1, grids[0], "right"), _turn(2, grids[1], "right")], won=True)
    assert sok_classify(won) == ("success", ["right", "right"])
    # the same room, box pushed down into the bottom-right corner of the open area: a dead lock
    corner = "\n".join(
        " " + " \t ".join(row) + " \t"
        for row in [list("######"), list("#__O_#"), list("#___P#"), list("#___X#"), list("######"), list("######")]
    )
    start = "\n".join(
        " " + " \t ".join(row) + " \t"
        for row in [list("######"), list("#__OP#"), list("#___X#"), list("#____#"), list("######"), list("######")]
    )
    lost = _trajectory("sokoban", "t", [_turn(1, start, "down"), _turn(2, corner, "left")], won=False)
    assert sok_classify(lost)[0] == "dead_lock"
    walked = _trajectory("sokoban", "t", [_turn(1, start, "left"), _turn(2, start, "left")], won=False)
    assert sok_classify(walked)[0] == "no_push"
    garbled = _trajectory("sokoban", "t", [_turn(1, start, "still", False), _turn(2, start, "still", False)], won=False)
    assert sok_classify(garbled)[0] == "invalid_format"
    summary, skill = get_env("sokoban").rules_skill(lost)
    assert "corner" in summary and len(skill.split()) >= 5


def test_ezpoints_rules():
    task = "5 of Spades and King of Diamonds"
    assert card_numbers(task) == [5, 10] and card_numbers("Ace of Hearts and Jack of Clubs") == [1, 10]
    turns = [_turn(1, "", "5"), _turn(2, "5", "+"), _turn(3, "5+", "7"), _turn(4, "5+", "=")]
    assert ez_classify(_trajectory("ezpoints", task, turns, won=False))[0] == "wrong_number"
    turns = [_turn(1, "", "5"), _turn(2, "5", "+"), _turn(3, "5+", "10"), _turn(4, "5+10", "=")]
    assert ez_classify(_trajectory("ezpoints", task, turns, won=False)) == ("wrong_value", "5+10")
    assert ez_classify(_trajectory("ezpoints", task, turns[:3], won=False))[0] == "out_of_steps"


@pytest.mark.parametrize("name", ["sokoban", "ezpoints"])
def test_image_observations_travel_as_png(name):
    env = get_env(name, observation="image")
    task = env.list_tasks("test")[0]
    game = env.new_game(expert=True)
    first = game.reset(task)
    pixels = decode_png(first.image)
    assert pixels.dtype == np.uint8 and pixels.shape == ((96, 96, 3) if name == "sokoban" else (300, 300, 3))
    engine_game = Sokoban(int(task.task_id)) if name == "sokoban" else None
    if engine_game is not None:
        assert np.array_equal(pixels, engine_game.image())  # lossless: the PNG holds gym-sokoban's pixels
    after = game.step(first.expert_action)
    assert after.image != first.image  # the picture follows the game
    assert get_env(name).new_game().reset(task).image is None  # text mode sends no image


def test_unknown_observation_mode_is_one_line():
    with pytest.raises(UserError, match="observation"):
        get_env("sokoban", observation="video")


def test_image_store_names_by_sha_and_refuses_changes(tmp_path):
    store = ImageStore(tmp_path / "images")
    png = get_env("sokoban", observation="image").new_game().reset(Task("42", "sokoban", "train")).image
    sha = store.put(png)
    assert sha == hashlib.sha256(png).hexdigest() and store.put(png) == sha
    assert (tmp_path / "images" / f"{sha}.png").read_bytes() == png
    traj = _trajectory("sokoban", "t", [_turn(1, "x", "up").model_copy(update={"image": sha})], won=False)
    assert check_images(tmp_path, [traj]) == 1
    (tmp_path / "images" / f"{sha}.png").write_bytes(png[:-1] + b"\0")
    with pytest.raises(UserError, match="does not match its sha256"):
        check_images(tmp_path, [traj])
    (tmp_path / "images" / f"{sha}.png").unlink()
    with pytest.raises(UserError, match="missing"):
        check_images(tmp_path, [traj])
    memory = ImageStore(None)
    assert memory.load(memory.put(png)) == png


def test_random_and_expert_replies_parse_back():
    for name in ("sokoban", "ezpoints"):
        env = get_env(name)
        result = env.new_game(expert=True).reset(env.list_tasks("test")[1])
        assert env.parse_action(env.expert_response(result)) == (result.expert_action, True)
        action, valid = env.parse_action(env.random_response(result, random.Random(0)))
        assert valid and action in result.admissible
        if name == "ezpoints":
            assert json.loads(env.format_response("t", "10")) == {"thoughts": "t", "action": "10"}
