"""The search environment on the protocol: a hand-made corpus and question file, the expert, the random floor,
the prompt's history, the skill insertion, and the rules analyzer's outcomes."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from seedcli.envs.search.env import SearchEnv
from seedcli.envs.search.prompt import build_prompt, information_text
from seedcli.envs.search.rules import classify, rules_skill
from seedcli.errors import UserError
from seedcli.prompts import SKILL_HEADING

PASSAGES = [
    {"id": "p0", "contents": '"Hamlet"\nHamlet is a tragedy written by William Shakespeare around 1600.'},
    {"id": "p1", "contents": '"Macbeth"\nMacbeth is a tragedy by William Shakespeare about a Scottish king.'},
    {"id": "p2", "contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"id": "p3", "contents": '"Moon"\nThe Moon is the only natural satellite of Earth.'},
]
QUESTIONS = [
    {"id": "q0", "question": "Who wrote the tragedy Hamlet?", "golden_answers": ["William Shakespeare", "Shakespeare"],
     "data_source": "toy"},
    {"id": "q1", "question": "What is the capital of France?", "golden_answers": ["Paris"], "data_source": "toy"},
    {"id": "q2", "question": "Who painted the Mona Lisa?", "golden_answers": ["Leonardo da Vinci"],
     "data_source": "art"},
]  # fmt: skip


@pytest.fixture
def toy(tmp_path: Path) -> tuple[SearchEnv, str]:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    qfile = tmp_path / "toy.jsonl"
    qfile.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return SearchEnv(corpus=str(corpus)), str(qfile)


def play(env: SearchEnv, task, policy) -> list:
    game = env.new_game(expert=True)
    results = [game.reset(task)]
    for _ in range(env.max_steps):
        if results[-1].done:
            break
        results.append(game.step(env.parse_action(policy(results[-1]))[0]))
    return results


def test_tasks_from_a_user_split_file(toy) -> None:
    env, qfile = toy
    tasks = env.list_tasks(qfile)
    assert [(t.task_id, t.category) for t in tasks] == [("q0", "toy"), ("q1", "toy"), ("q2", "art")]
    assert env.resolve_split("valid") == "dev"
    with pytest.raises(UserError, match="unknown Search-QA split 'seen'"):
        env.resolve_split("seen")
    assert len(SearchEnv(limit=1).list_tasks(qfile)) == 2  # one per data source
    assert env.resolve_split(qfile) in env.eval_splits  # a question file can be evaluated
    assert qfile not in SearchEnv.eval_splits  # ... by this instance only
    assert [t.task_id for t in SearchEnv(datasets="art").list_tasks(qfile)] == ["q2"]


def test_expert_answers_only_with_evidence(toy) -> None:
    env, qfile = toy
    q0, q1, q2 = env.list_tasks(qfile)
    r = play(env, q0, env.expert_response)
    assert r[0].expert_action == "<search>Who wrote the tragedy Hamlet?</search>" and r[0].admissible is None
    assert r[1].observation.startswith('<information>{"result": "Doc 1: \\"Hamlet\\"')
    assert r[1].info["doc_ids"][0] == "p0" and r[1].expert_action == "<answer>William Shakespeare</answer>"
    assert (r[2].done, r[2].won, r[2].reward, r[2].score) == (True, True, 1.0, 1.0)
    assert play(env, q1, env.expert_response)[-1].won
    # no passage names Leonardo: the expert says "unknown" and scores 0
    last = play(env, q2, env.expert_response)[-1]
    assert (last.done, last.won, last.score, last.info["answer"]) == (True, False, 0.0, "unknown")


def test_invalid_turns_and_wrong_answers(toy) -> None:
    env, qfile = toy
    game = env.new_game()
    first = game.reset(env.list_tasks(qfile)[1])
    assert first.expert_action is None and first.task == "What is the capital of France?"
    action, valid = env.parse_action("I think it is Paris.")
    assert (action, valid) == ("", False)
    r = game.step(action)
    assert (r.observation, r.done, r.won) == ("", False, False)  # nothing happens, the episode goes on
    r = game.step(env.parse_action("<think>hm</think><answer>Lyon</answer>")[0])
    assert (r.done, r.won, r.score, r.info["exact_match"]) == (True, False, 0.0, 0.0)
    assert game.step("<answer>Paris</answer>") is r  # a finished episode stays finished


def test_random_policy_is_the_floor(toy) -> None:
    env, qfile = toy
    rng = random.Random(0)
    tasks = env.list_tasks(qfile)
    wins = 0
    for i in range(30):
        results = play(env, tasks[i % 3], lambda res: env.random_response(res, rng))
        wins += results[-1].won
        assert all(env.parse_action(env.random_response(results[0], rng))[1] for _ in range(5))
    assert wins <= 3  # its answers are words of the question, never the answer here (but "Paris" stays possible)


def test_prompt_history_is_verl_agents(toy) -> None:
    env, qfile = toy
    task = env.list_tasks(qfile)[1]
    r = play(env, task, lambda res: env.format_response("t", "<search>capital of France</search>"))
    info = r[1].observation
    question = r[0].task
    # the protocol's history: (observation shown, action taken); verl-agent's: (action, information it brought)
    history = [(r[0].observation, "<search>capital of France</search>"), (info, "")]
    prompt = env.render_prompt(question, "", None, 3, history, 4)
    assert prompt == build_prompt(question, [("<search>capital of France</search>", info), ("", "")], 4)
    assert "Step 1:<search>capital of France</search> <information>" in prompt and "Step 2: \n" in prompt
    first = env.render_prompt(question, r[0].observation, None, 1, [], 4)
    assert "History:" not in first
    skilled = env.insert_skill(first, "Search the capital's country.")
    line = f"Your question: {question}\n"
    assert skilled.index(SKILL_HEADING) == skilled.index(line) + len(line) + len("\n## ")
    assert env.parse_action(env.format_response("x", "<answer>Paris</answer>")) == ("<answer>Paris</answer>", True)


def test_options_and_spec(toy) -> None:
    env, _ = toy
    spec = json.loads(json.dumps(env.spec()))
    assert SearchEnv(**spec).options == env.options
    with pytest.raises(UserError, match="unknown Search-QA option .corpuss. in env_options; did you mean .corpus.?"):
        SearchEnv(corpuss="x")


def _traj(steps: list[tuple[str, str]], won: bool):
    """`steps` = (action, observation it produced); turn i shows the observation of step i-1."""
    turns, obs = [], "question"
    for action, result in steps:
        turns.append(SimpleNamespace(observation=obs, action=action, response=action, valid=bool(action)))
        obs = result
    return SimpleNamespace(turns=turns, won=won, category="toy", score=float(won))


def test_rules_analyzer_outcomes() -> None:
    hamlet = information_text([{"document": PASSAGES[0], "score": 1.0}])
    paris = information_text([{"document": PASSAGES[2], "score": 1.0}])
    win = _traj([("<search>hamlet author</search>", hamlet), ("<answer>William Shakespeare</answer>", "")], True)
    outcome, searches, answer = classify(win)
    assert (outcome, searches[0][0], answer) == ("success", "hamlet author", "William Shakespeare")
    summary, skill = rules_skill(win, "Toy")
    assert "'hamlet author'" in summary and "'hamlet author'" in skill and len(skill.split()) >= 5
    assert classify(_traj([("<answer>Marlowe</answer>", "")], False))[0] == "no_search"
    assert classify(_traj([("", ""), ("", "")], False))[0] == "no_search"
    # no usable block at all: the rule is about the reply format, not about answering from memory
    assert "exactly one block" in rules_skill(_traj([("", ""), ("", "")], False))[1]
    assert "from memory" in rules_skill(_traj([("<answer>Marlowe</answer>", "")], False))[1]
    assert classify(_traj([("<search>a</search>", hamlet)] * 4, False))[0] == "out_of_turns"
    assert (
        classify(_traj([("<search>a</search>", hamlet), ("<answer>Marlowe</answer>", "")], False))[0] == "no_evidence"
    )
    # the passages named Paris and the agent said Paris, but the question wanted something else: a bad query
    assert classify(_traj([("<search>city</search>", paris), ("<answer>Paris</answer>", "")], False))[0] == "bad_query"
    for traj in (_traj([("<answer>x</answer>", "")], False), _traj([("<search>a</search>", paris)] * 4, False)):
        s, k = rules_skill(traj)
        assert s and len(k.split()) >= 5
