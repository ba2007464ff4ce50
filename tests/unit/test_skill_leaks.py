"""The skill-leak audit: each environment's `leaks` rule on hand-made trajectories (a leaking and a clean skill, the
spans checked character by character), and the counting in `seedcli.skill_leaks`."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from seedcli.envs import get_env
from seedcli.envs.base import Environment
from seedcli.envs.search.reward import answer_spans, normalize_answer
from seedcli.errors import UserError
from seedcli.records import Trajectory, Turn
from seedcli.skill_leaks import find_leaks, leak_fraction, leak_metrics


def trajectory(env: str, task: str, steps: list[tuple[str, str]], task_id: str = "t0", split: str = "train",
               category: str = "c", won: bool = True) -> Trajectory:  # fmt: skip
    """An episode of `env` whose turns are (observation, action) pairs."""
    turns = [
        Turn(step=i + 1, observation=obs, admissible=[], prompt="p", response="r", action=act, valid=True)
        for i, (obs, act) in enumerate(steps)
    ]
    return Trajectory(
        episode_id=f"{task_id}-r00", group_id=task_id, env=env, task_id=task_id, split=split, category=category,
        task=task, turns=turns, won=won, score=float(won), reward=10.0 * won, length=len(turns), engine="hf",
        model_id="m", model_hash="h", sampling={}, prompt_version="v", seed=0,
    )  # fmt: skip


def texts(skill: str, spans: list[tuple[int, int]]) -> list[str]:
    return [skill[a:b] for a, b in spans]


def test_the_default_rule_finds_no_leak():
    traj = trajectory("alfworld", "t", [("You see a drawer 3.", "go to drawer 3")])
    assert Environment.leaks(get_env("alfworld"), traj, "Open drawer 3 and answer Stephen King.") == []


# ------------------------------------------------------------------------------------------------------------ search


def test_search_finds_the_golden_answer_normalised_as_exact_match(tmp_path):
    questions = tmp_path / "questions.jsonl"
    rows = [{"id": "q1", "question": "Who wrote Carrie?", "golden_answers": ["Stephen King", "King"],
             "data_source": "nq"}]  # fmt: skip
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = get_env("search")
    traj = trajectory("search", "Who wrote Carrie?", [("Who wrote Carrie?", "<answer>Stephen King</answer>")],
                      task_id="q1", split=str(questions), category="nq")  # fmt: skip
    leaking = "Search the novel's title; the answer is STEPHEN   king, the horror author."
    spans = env.leaks(traj, leaking)
    # "stephen king" and "king" overlap: one span, from the "S" of STEPHEN to the "g" of king (spaces kept)
    assert spans == [(40, 54)] and texts(leaking, spans) == ["STEPHEN   king"]
    assert env.leaks(traj, "Answer: the Stephen-King.") == []  # "stephenking" is one word after normalisation
    clean = "Search the key entity of the question, then answer with the exact name a passage states (kingdom)."
    assert env.leaks(traj, clean) == []


def test_search_spans_map_back_through_dropped_articles_and_punctuation():
    skill = 'Write "The Beatles"! Not "the  beatles," with 1990 in it.'
    assert normalize_answer(skill) == "write beatles not beatles with 1990 in it"
    spans = answer_spans(["The Beatles"], skill)
    assert texts(skill, spans) == ["Beatles", "beatles"]  # the article and the quotes are left out
    assert answer_spans(["1"], skill) == []  # whole words: "1" is not found in "1990"
    assert answer_spans(["", "..."], skill) == []  # answers that normalise to nothing never count
    # context-dependent lower-casing (a Greek final sigma): the match stands, the span is the whole skill
    assert answer_spans(["ΟΔΟΣ"], "ΟΔΟΣ x") == [(0, 6)]


def test_search_needs_its_question(tmp_path):
    traj = trajectory("search", "q", [], task_id="nope", split=str(tmp_path / "missing.jsonl"))
    with pytest.raises(UserError, match="not found"):
        get_env("search").leaks(traj, "any skill at all")


# ----------------------------------------------------------------------------------------------------------- webshop


def test_webshop_finds_the_goal_asin_or_title():
    env = get_env("webshop")
    goals = [{"asin": "B000000000", "name": "x"}, {"asin": "B07ABC1234", "name": "Acme Noise  Cancelling Headphones"}]
    env.shop = lambda: SimpleNamespace(goals=goals)  # no product data needed: the goal list is all the rule reads
    traj = trajectory("webshop", "i need headphones", [("'Search'", "search[headphones]")], task_id="goal-1")
    leaking = "Click b07abc1234 at once: it is the acme noise cancelling\nheadphones."
    spans = env.leaks(traj, leaking)
    assert texts(leaking, spans) == ["b07abc1234", "acme noise cancelling\nheadphones"]
    assert spans == [(6, 16), (36, 68)]
    clean = "Search with the goal's key attributes, open the best match, pick every option, then buy (B07ABC12345)."
    assert env.leaks(traj, clean) == []  # an ASIN inside a longer code is not it


# ---------------------------------------------------------------------------------------------------------- alfworld


def test_alfworld_finds_numbered_instances_the_episode_saw():
    env = get_env("alfworld")
    traj = trajectory(
        "alfworld",
        "put a clean mug in coffeemachine.",
        [
            (
                "You are in the middle of a room. You see a drawer 3, a sinkbasin 1, a coffeemachine 1.",
                "go to drawer 3",
            ),
            ("You arrive at drawer 3. On the drawer 3, you see a mug 1.", "take mug 1 from drawer 3"),
        ],
        category="clean",
    )
    leaking = "The Mug 1 is in drawer 3; take it, clean it in sinkbasin 1. Skip drawer 4 and cabinet 2."
    spans = env.leaks(traj, leaking)
    assert texts(leaking, spans) == ["Mug 1", "drawer 3", "sinkbasin 1"]  # drawer 4, cabinet 2: not in this episode
    assert spans[0] == (4, 9)
    clean = "Search drawers and cabinets for the mug, take it, clean it with the sinkbasin, then put it in place."
    assert env.leaks(traj, clean) == []


# ----------------------------------------------------------------------------------------------- sokoban and ezpoints


def test_sokoban_finds_four_consecutive_moves_of_the_episode():
    env = get_env("sokoban")
    moves = ["up", "still", "up", "left", "down", "right", "up"]  # "still" moved nothing: not part of the sequence
    traj = trajectory("sokoban", "push all the boxes", [("grid", m) for m in moves], category="sokoban")
    leaking = "Solve it with Up -> up, left then DOWN, and right. Never: up, up, up, up."
    spans = env.leaks(traj, leaking)
    assert texts(leaking, spans) == ["Up -> up, left then DOWN, and right"] and spans == [(14, 49)]
    assert env.leaks(traj, "Push up, up, left. Then down, right.") == []  # the sentence break splits the run: 3 + 2
    clean = "Walk behind the box first, then push it toward the target; the admissible moves are up, down, left, right."
    assert env.leaks(traj, clean) == []
    played = trajectory("sokoban", "push all the boxes", [("grid", m) for m in ("up", "down", "left", "right", "up")])
    assert env.leaks(played, clean) == []  # the prompt's own list of the moves is not counted, even when played
    assert texts("Play up down left right up.", env.leaks(played, "Play up down left right up.")) == [
        "up down left right up"  # five moves of the episode are
    ]


def test_ezpoints_finds_the_cards_or_both_values():
    env = get_env("ezpoints")
    traj = trajectory("ezpoints", "5 of Spades and King of Diamonds", [("", "10"), ("10", "+")], category="ezpoints")
    # King counts 10: the pair is 5 and 10 (hypothetical game: 5 + 10 is not 12, the rule reads only the cards)
    leaking = "With the king of  diamonds out, append 10 + 5 and '='."
    spans = env.leaks(traj, leaking)
    assert texts(leaking, spans) == ["king of  diamonds", "10 + 5"]
    assert spans == [(9, 26)] + [(39, 45)]
    clean = "Face cards count 10 and an ace 1; number cards (2-10) their value: try the sum, then the product, of 12."
    assert env.leaks(traj, clean) == []
    assert env.leaks(traj, "Use 5 then 15 or 105 and 10.5.") == []  # other numbers, not both card values


# ------------------------------------------------------------------------------------------------------ the counting


class _MarkedEnv:
    """An environment whose rule is: the word LEAK leaks, twice overlapping spans per occurrence."""

    def leaks(self, trajectory, skill):
        k = skill.find("LEAK")
        return [] if k < 0 else [(k + 2, k + 4), (k, k + 3)]


def test_fraction_counts_kept_skills_overall_and_per_category():
    trajs = [trajectory("alfworld", "t", [], task_id=f"t{i}", category=c) for i, c in enumerate("aabbbc")]
    skills = ["LEAK here", "clean", "LEAK", None, "  ", "clean too"]
    assert find_leaks(_MarkedEnv(), trajs, skills) == [[(0, 4)], [], [(0, 4)], None, None, []]
    frac, per_category = leak_fraction(_MarkedEnv(), trajs, skills)
    assert frac == pytest.approx(2 / 4)  # None and blank skills are not counted
    assert per_category == {"a": 0.5, "b": 1.0, "c": 0.0}
    assert leak_metrics(_MarkedEnv(), trajs, skills) == {
        "skills/leak_frac": 0.5, "skills/leak_frac/a": 0.5, "skills/leak_frac/b": 1.0, "skills/leak_frac/c": 0.0,
    }  # fmt: skip
    assert leak_fraction(_MarkedEnv(), trajs[:1], [None]) == (0.0, {})
