"""The warm start's template thoughts: holding / seeing / looking for the task's object, from what the prompt shows."""

from __future__ import annotations

from seedcli.records import Trajectory, Turn
from seedcli.stages.demos import THINK, demo_thinks


def _traj(task: str, observations: list[str]) -> Trajectory:
    turns = [
        Turn(step=i, observation=o, admissible=["look"], prompt="p", response="r", action="look", valid=True)
        for i, o in enumerate(observations, start=1)
    ]
    return Trajectory(
        episode_id="e", group_id="g", game_file="f", split="train", task_type="pick_two", task=task, turns=turns,
        won=False, reward=0.0, length=len(turns), engine="none", model_id="m", model_hash="", sampling={},
        prompt_version="v", seed=0,
    )  # fmt: skip


def test_thoughts_follow_the_object_through_the_episode():
    traj = _traj(
        "put two cellphone in bed.",
        [
            "You are in the middle of a room. Looking quickly around you, you see a bed 1, a desk 1.",
            "You arrive at desk 1. On the desk 1, you see a cellphone 2, and a pen 1.",
            "You pick up the cellphone 2 from the desk 1.",
            "You arrive at bed 1. On the bed 1, you see a pillow 1.",  # still holding: the bed shows no cellphone
            "You move the cellphone 2 to the bed 1.",  # placed: no longer held (and it is here, on the bed)
            "You arrive at desk 1. On the desk 1, you see a pen 1.",
            "You arrive at drawer 1. On the drawer 1, you see a cellphones 3.",  # another word: not the object
        ],
    )
    assert demo_thinks(traj) == [
        "I look for the cellphone.",
        "I see the cellphone here.",
        "I have the cellphone.",
        "I have the cellphone.",
        "I see the cellphone here.",
        "I look for the cellphone.",
        "I look for the cellphone.",
    ]


def test_a_task_without_an_object_gets_the_plain_thought():
    assert demo_thinks(_traj("", ["You arrive at desk 1."])) == [THINK]


def test_the_noisy_expert_plays_a_free_text_environment_without_swapping_a_turn():
    """Search lists no admissible actions (`admissible` None): the DART noise has nothing to draw from, so every turn
    is the expert's (the warm start on search crashed with "'NoneType' object is not iterable")."""
    from types import SimpleNamespace as NS

    from seedcli.stages.demos import NoisyExpertPolicy

    policy = NoisyExpertPolicy(noise=1.0, seed=0, respond=lambda think, action: action)
    last = NS(expert_action="<answer>Paris</answer>", admissible=None)
    ep = NS(last=last, turns=[object()], spec=NS(episode_id="e0"))  # a later turn: noise would apply
    (out,) = policy.act(["prompt"], [ep], 1)
    assert out.text == "<answer>Paris</answer>"
    listed = NS(last=NS(expert_action="north", admissible=["north", "south"]), turns=[object()], spec=NS(episode_id="e1"))
    (swapped,) = policy.act(["prompt"], [listed], 1)
    assert swapped.text == "south"  # noise 1.0 with a list to draw from: the other action


def test_a_free_text_environments_expert_labels_are_cloned():
    """Search's turns list no admissible actions; its expert's actions are still labels to clone (before, `usable`
    asked `label in turn.admissible` and the warm start on search found "none of the 96 demonstration games won")."""
    from types import SimpleNamespace as NS

    from seedcli.stages.demos import usable

    assert usable("<search>who wrote it</search>", NS(admissible=None))
    assert usable("<answer>Paris</answer>", NS(admissible=[]))
    assert usable("go to desk 1", NS(admissible=["go to desk 1", "look"]))
    assert not usable("go to desk 9", NS(admissible=["go to desk 1"]))  # a listed turn still checks membership
    assert not usable("look", NS(admissible=None)) and not usable(None, NS(admissible=None))


def test_the_greedy_check_reads_a_free_text_environments_turns():
    """The warm start's greedy check after training counts admissible replies; a search turn lists none (None), and
    `action in None` crashed the run after the weights were saved. A free-text reply that parses is admissible."""
    from types import SimpleNamespace as NS

    from seedcli.envs import get_env
    from seedcli.stages.demos import DemoEpisode
    from seedcli.stages.warmstart import greedy_check

    env = get_env("search")
    reply = env.format_response("I search.", "<search>who wrote it</search>")
    turn = NS(prompt="Q?", admissible=None)
    demo = DemoEpisode.model_construct(trajectory=NS(won=True, turns=[turn]), labels=["<search>who wrote it</search>"])

    class Engine:
        def render(self, messages):
            return [1, 2, 3]

        def generate(self, prompts, **kw):
            return [NS(text=reply) for _ in prompts]

    check = greedy_check(Engine(), [demo], turns=4, seed=0, env=env)
    assert check["turns"] == 1 and check["valid_rate"] == 1.0 and check["admissible_rate"] == 1.0
    assert check["expert_action_rate"] == 1.0  # the expert's own action at that state
