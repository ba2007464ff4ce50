"""The offline rules analyzer on hand-made ALFWorld trajectories (observation texts as the real game writes them)."""

import json

import pytest

from seedcli.analyzers.parse import parse_skill
from seedcli.analyzers.rules import RulesAnalyzer, rules_skill
from seedcli.envs.alfworld.projection import format_response
from seedcli.envs.alfworld.rules import abstract, classify, decisive_steps, parse_goal
from seedcli.records import Trajectory, Turn

ROOM = (
    "You are in the middle of a room. Looking quickly around you, you see a bathtubbasin 1, a cabinet 1, "
    "a cabinet 2, a countertop 1, a garbagecan 1, a sinkbasin 1, and a toilet 1."
)


def make_traj(task: str, steps: list[tuple[str, str]], won: bool, max_steps: int = 30, invalid: set[int] = frozenset()):
    """`steps` = (action, observation that action produced). Turn i shows the observation of step i-1."""
    turns = []
    obs = ROOM
    for i, (action, result) in enumerate(steps):
        valid = i not in invalid
        response = format_response("thinking", action) if valid else f"I will {action}"
        turns.append(
            Turn(
                step=i + 1,
                observation=obs,
                admissible=[],
                prompt="",
                response=response,
                action=action if valid else "",
                valid=valid,
            )
        )
        obs = result
    return Trajectory(
        episode_id="e0",
        group_id="g0",
        game_file="x/game.tw-pddl",
        split="train",
        task_type="t",
        task=task,
        turns=turns,
        won=won,
        reward=10.0 if won else 0.0,
        length=len(turns),
        engine="test",
        model_id="m",
        model_hash="h",
        sampling={"max_steps": max_steps},
        prompt_version="v",
        seed=0,
    )


CLOTH_SUCCESS = [
    (
        "go to countertop 1",
        "You arrive at countertop 1. On the countertop 1, you see a soapbar 1, and a spraybottle 1.",
    ),
    ("go to cabinet 1", "You arrive at cabinet 1. The cabinet 1 is closed."),
    ("open cabinet 1", "You open the cabinet 1. The cabinet 1 is open. In it, you see a cloth 1."),
    ("take cloth 1 from cabinet 1", "You pick up the cloth 1 from the cabinet 1."),
    ("examine cloth 1", "There's nothing special about cloth 1."),
    ("go to sinkbasin 1", "You arrive at sinkbasin 1. On the sinkbasin 1, you see nothing."),
    ("clean cloth 1 with sinkbasin 1", "You clean the cloth 1 using the sinkbasin 1."),
    ("go to bathtubbasin 1", "You arrive at bathtubbasin 1. On the bathtubbasin 1, you see nothing."),
    ("move cloth 1 to bathtubbasin 1", ""),  # the winning action: no later observation
]


@pytest.mark.parametrize(
    "task, kind, obj, recep",
    [
        ("put a clean cloth in bathtubbasin.", "clean", "cloth", "bathtubbasin"),
        ("put some spraybottle on toilet.", "pick", "spraybottle", "toilet"),
        ("put a hot potato in fridge.", "heat", "potato", "fridge"),
        ("heat some egg and put it in garbagecan.", "heat", "egg", "garbagecan"),
        ("put a cool mug in cabinet.", "cool", "mug", "cabinet"),
        ("cool some bread and put it in countertop.", "cool", "bread", "countertop"),
        ("clean some soapbar and put it in toilet.", "clean", "soapbar", "toilet"),
        ("put two cellphone in sofa.", "two", "cellphone", "sofa"),
        ("find two pillow and put them in armchair.", "two", "pillow", "armchair"),
        ("look at alarmclock under the desklamp.", "look", "alarmclock", "desklamp"),
        ("examine the book with the floorlamp.", "look", "book", "floorlamp"),
        ("Your task is to: put a clean cloth in bathtubbasin.", "clean", "cloth", "bathtubbasin"),
    ],
)
def test_goal_from_every_task_template(task, kind, obj, recep):
    goal = parse_goal(task)
    assert (goal.kind, goal.obj, goal.recep) == (kind, obj, recep)


def test_object_numbers_are_abstracted():
    assert abstract("go to countertop 1") == "go to the countertop"
    assert abstract("take apple 1 from countertop 12") == "take the apple from the countertop"
    assert abstract("clean cloth 2 with sinkbasin 1") == "clean the cloth with the sinkbasin"
    assert classify("move cloth 1 to bathtubbasin 1") == ("move", "cloth", "bathtubbasin")
    assert classify("put mug 1 in/on coffeemachine 1") == ("move", "mug", "coffeemachine")
    assert classify("use desklamp 1") == ("use", "desklamp", None)
    assert classify("inventory")[0] == "other"


def test_success_is_the_ordered_workflow_without_detours():
    traj = make_traj("put a clean cloth in bathtubbasin.", CLOTH_SUCCESS, won=True)
    summary, skill = rules_skill(traj)
    assert skill == (
        "To put a clean cloth in bathtubbasin, follow this order: go to the cabinet, then open the cabinet, "
        "then take the cloth from the cabinet, then go to the sinkbasin, then clean the cloth with the sinkbasin, "
        "then go to the bathtubbasin, then move the cloth to the bathtubbasin."
    )
    assert "countertop" not in skill and "examine" not in skill  # the detours
    assert "9 step(s)" in summary and "7 of them" in summary


def test_object_put_down_elsewhere_and_picked_up_again_is_a_detour():
    steps = [
        ("go to cabinet 1", "You arrive at cabinet 1. On the cabinet 1, you see a cloth 1."),
        ("take cloth 1 from cabinet 1", "You pick up the cloth 1 from the cabinet 1."),
        ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see nothing."),
        ("move cloth 1 to countertop 1", "You move the cloth 1 to the countertop 1."),
        ("take cloth 1 from countertop 1", "You pick up the cloth 1 from the countertop 1."),
        ("go to sinkbasin 1", "You arrive at sinkbasin 1. On the sinkbasin 1, you see nothing."),
        ("clean cloth 1 with sinkbasin 1", "You clean the cloth 1 using the sinkbasin 1."),
        ("go to bathtubbasin 1", "You arrive at bathtubbasin 1. On the bathtubbasin 1, you see nothing."),
        ("move cloth 1 to bathtubbasin 1", ""),
    ]
    traj = make_traj("put a clean cloth in bathtubbasin.", steps, won=True)
    kept = [abstract(s.action) for s in decisive_steps(traj)]
    assert kept == [
        "go to the cabinet",
        "take the cloth from the cabinet",
        "go to the sinkbasin",
        "clean the cloth with the sinkbasin",
        "go to the bathtubbasin",
        "move the cloth to the bathtubbasin",
    ]


def test_look_task_keeps_the_lamp():
    steps = [
        ("go to desk 1", "You arrive at desk 1. On the desk 1, you see a alarmclock 1, and a desklamp 1."),
        ("take alarmclock 1 from desk 1", "You pick up the alarmclock 1 from the desk 1."),
        ("use desklamp 1", ""),
    ]
    _, skill = rules_skill(make_traj("look at alarmclock under the desklamp.", steps, won=True))
    assert skill.endswith("go to the desk, then take the alarmclock from the desk, then use the desklamp.")


def test_failure_with_nothing_happens_names_object_and_receptacle():
    steps = [
        ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a potato 1."),
        ("heat potato 1 with microwave 1", "Nothing happens."),
        ("heat potato 1 with microwave 1", "Nothing happens."),
        ("take potato 1 from countertop 1", "You pick up the potato 1 from the countertop 1."),
        ("go to fridge 1", "You arrive at fridge 1. The fridge 1 is closed."),
        ("open fridge 1", "You open the fridge 1. The fridge 1 is open. In it, you see nothing."),
    ]
    summary, skill = rules_skill(make_traj("put a hot potato in fridge.", steps, won=False, max_steps=6))
    assert "'heat the potato with the microwave' got 'Nothing happens.' 2 time(s)" in skill
    assert "Instead, go to the microwave and heat the potato with it before going to the fridge." in skill
    assert "never managed to heat it" in summary and "ran out of steps" in summary


def test_failure_loop_without_finding_the_object():
    steps = [
        ("go to cabinet 1", "You arrive at cabinet 1. The cabinet 1 is closed."),
        ("go to cabinet 2", "You arrive at cabinet 2. The cabinet 2 is closed."),
    ] * 3
    summary, skill = rules_skill(make_traj("put a clean cloth in bathtubbasin.", steps, won=False, max_steps=6))
    assert "repeating 'go to the cabinet' (3 times)" in skill
    assert "search receptacles you have not visited or opened yet for the cloth" in skill
    assert "bathtubbasin" in skill and "never found the cloth" in summary


def test_failure_from_format_errors():
    steps = [("go to cabinet 1", "Nothing happens.")] * 4
    traj = make_traj("put some spraybottle on toilet.", steps, won=False, invalid={0, 1, 2})
    _, skill = rules_skill(traj)
    assert "<think>" in skill and "3 of 4 steps" in skill
    assert "spraybottle" in skill and "toilet" in skill


def test_failure_out_of_steps_after_taking_the_object():
    steps = [
        ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a spraybottle 1."),
        ("take spraybottle 1 from countertop 1", "You pick up the spraybottle 1 from the countertop 1."),
        ("go to cabinet 1", "You arrive at cabinet 1. The cabinet 1 is closed."),
    ]
    _, skill = rules_skill(make_traj("put some spraybottle on toilet.", steps, won=False, max_steps=3))
    assert skill == (
        "When you must put some spraybottle on toilet, avoid spending all 3 steps without finishing; warning sign: "
        "half the step budget used without the spraybottle in hand. Instead, go to the toilet and move the "
        "spraybottle to it."
    )


def test_analyzer_answers_json_that_the_shared_parser_keeps():
    for traj in (
        make_traj("put a clean cloth in bathtubbasin.", CLOTH_SUCCESS, won=True),
        make_traj("put a clean cloth in bathtubbasin.", CLOTH_SUCCESS[:3], won=False),
        make_traj("do something odd.", [], won=False),
    ):
        resp = RulesAnalyzer().analyze([{"role": "user", "content": "ignored"}], traj)
        assert set(json.loads(resp.text)) == {"episode_summary", "episode_skill"}
        assert parse_skill(resp.text).kept, resp.text
        assert resp.prompt_tokens == 0 and resp.completion_tokens == 0
    with pytest.raises(ValueError):
        RulesAnalyzer().analyze([{"role": "user", "content": "x"}])
