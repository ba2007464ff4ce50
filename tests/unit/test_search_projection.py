"""Parsing replies as verl-agent's search projection, and the text the agent reads (templates, history, results)."""

import json

from seedcli.envs.search.projection import parse_reply
from seedcli.envs.search.prompt import (
    SEARCH_TEMPLATE,
    build_prompt,
    history_text,
    information_text,
    passages_to_string,
)


def test_parse_search_and_answer() -> None:
    a = parse_reply("<think>I need facts.</think>\n<search>  who wrote hamlet </search>")
    assert (a.kind, a.content, a.valid, a.text) == (
        "search",
        "who wrote hamlet",
        True,
        "<search>who wrote hamlet</search>",
    )
    a = parse_reply("<think>done</think><answer> Shakespeare </answer>")
    assert (a.kind, a.content, a.valid) == ("answer", "Shakespeare", True)
    # <think> is asked for but not required for validity
    assert parse_reply("<answer>x</answer>").valid
    # tags are matched case-insensitively, and the stored action uses lower-case tags
    assert parse_reply("<SEARCH>q</SEARCH>").text == "<search>q</search>"


def test_parse_invalid_replies() -> None:
    a = parse_reply("I think the answer is Paris.")
    assert (a.kind, a.content, a.valid, a.text) == (None, "", False, "")
    # both tags: cut after the first </search>, the search is extracted but the turn is invalid
    a = parse_reply("<search>capital of france</search> <answer>Paris</answer>")
    assert (a.kind, a.content, a.valid) == ("search", "capital of france", False)
    # a repeated tag: the first block is the action, the turn is invalid
    a = parse_reply("<search>a</search><search>b</search>")
    assert (a.kind, a.content, a.valid) == ("search", "a", False)
    a = parse_reply("<answer>x</answer><answer>y</answer>")
    assert (a.kind, a.content, a.valid) == ("answer", "x", False)
    # an unclosed search tag next to a closed answer: the answer is extracted, both tags make it invalid
    a = parse_reply("<search>oops <answer>Paris</answer>")
    assert (a.kind, a.content, a.valid) == ("answer", "Paris", False)


HITS = [
    {"document": {"id": "d1", "contents": '"Hamlet"\nHamlet is a tragedy by William Shakespeare.'}, "score": 9.5},
    {"document": {"id": "d2", "contents": '"Ophélie"\nA character. '}, "score": 3.0},
]


def test_information_text_as_verl_agent() -> None:
    docs = passages_to_string(HITS)
    assert docs == 'Doc 1: "Hamlet"\nHamlet is a tragedy by William Shakespeare.\nDoc 2: "Ophélie"\nA character.\n'
    info = information_text(HITS)
    # json.dumps with its defaults: quotes and newlines escaped, non-ASCII as \u escapes
    assert info == (
        '<information>{"result": "Doc 1: \\"Hamlet\\"\\nHamlet is a tragedy by William Shakespeare.\\n'
        'Doc 2: \\"Oph\\u00e9lie\\"\\nA character.\\n"}</information>'
    )
    assert json.loads(info[len("<information>") : -len("</information>")])["result"] == docs
    assert information_text([]) == '<information>{"result": ""}</information>'


def test_history_and_prompt() -> None:
    steps = [("<search>a</search>", "<information>A</information>"), ("", ""), ("<search>c</search>", "C")]
    # verl-agent's SearchMemory: "Step n:<action> <obs>\n", joined by "\n", numbered from the true step
    assert history_text(steps, 2) == "Step 2: \n\nStep 3:<search>c</search> C\n"
    first = build_prompt("Who wrote Hamlet?", [], 4)
    assert "Your question: Who wrote Hamlet?\n" in first and "History:" not in first
    later = build_prompt("Who wrote Hamlet?", steps, 2)
    assert later == SEARCH_TEMPLATE.format(
        task_description="Who wrote Hamlet?", step_count=3, memory_context=history_text(steps, 2)
    )
    assert "you have already taken 3 step(s)" in later
