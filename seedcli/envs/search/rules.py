"""Search-QA's part of the offline `rules` analyzer: a hindsight skill read off the episode itself.

A success yields the query that found the answer and how the answer was given; a failure an avoidance rule for what
went wrong: no search (answered from memory or never produced a valid search), ran out of turns (no answer),
answered without evidence (the answer is in none of the retrieved passages), or a bad query (the passages the
queries found supported a wrong answer). A baseline so the pipeline runs offline, not the paper's analyzer.
"""

from __future__ import annotations

import json

from seedcli.envs.search.projection import parse_reply
from seedcli.envs.search.reward import answer_in_text

RULES_VERSION = "search-rules-v1"


def _information(observation: str) -> str:
    """The passages inside an `<information>` observation, un-escaped ('' for anything else)."""
    text = observation.strip()
    if not (text.startswith("<information>") and text.endswith("</information>")):
        return ""
    body = text[len("<information>") : -len("</information>")]
    try:
        return str(json.loads(body).get("result", ""))
    except (json.JSONDecodeError, AttributeError):
        return body


def classify(trajectory) -> tuple[str, list[tuple[str, str]], str | None]:
    """(outcome, [(query, passages it retrieved)], answer) where outcome is success | no_search | out_of_turns |
    no_evidence | bad_query."""
    turns = list(trajectory.turns)
    searches: list[tuple[str, str]] = []
    answer: str | None = None
    for i, turn in enumerate(turns):
        parsed = parse_reply(turn.action or "")
        if parsed.kind == "search":
            passages = _information(turns[i + 1].observation) if i + 1 < len(turns) else ""
            searches.append((parsed.content, passages))
        elif parsed.kind == "answer":
            answer = parsed.content
            break
    if trajectory.won:
        return "success", searches, answer
    if not searches:
        return "no_search", searches, answer
    if answer is None:
        return "out_of_turns", searches, answer
    if any(answer_in_text([answer], passages) for _, passages in searches):
        return "bad_query", searches, answer
    return "no_evidence", searches, answer


def rules_skill(trajectory, category_name: str = "") -> tuple[str, str]:
    """(episode_summary, episode_skill) for one search episode."""
    outcome, searches, answer = classify(trajectory)
    kind = f"{category_name} question" if category_name else "question"
    queries = ", ".join(f"'{q}'" for q, _ in searches) or "none"
    n_turns = len(trajectory.turns)
    invalid = sum(not t.valid for t in trajectory.turns)
    if outcome == "success":
        finding = next((q for q, passages in searches if answer and answer_in_text([answer], passages)), None)
        if finding is not None:
            summary = (
                f"The agent searched {queries}; the search '{finding}' retrieved a passage stating '{answer}', "
                "and it answered that exactly."
            )
            skill = (
                f"For a {kind} like this, search the key entities in the question (e.g. '{finding}'), read which "
                "passage names the answer, and give exactly that name in <answer></answer> with no extra words."
            )
        else:
            summary = f"The agent searched {queries} and answered '{answer}', which matched a golden answer."
            skill = (
                f"For a {kind} like this, answer only with the short exact name the question asks for, inside "
                "<answer></answer>, and confirm it with one <search> for the question's key entity first."
            )
        return summary, skill
    if outcome == "no_search":
        what = f"answered '{answer}'" if answer is not None else f"wrote {invalid} invalid turn(s)"
        summary = f"The agent {what} without any valid search in {n_turns} turn(s) and was wrong."
        if answer is None:  # it never wrote a usable block: the format is the failure
            skill = (
                "Every reply must hold <think>…</think> and then exactly one block: <search> query </search> naming "
                "the question's key entity first, and <answer> name </answer> once the passages state it."
            )
        else:
            skill = (
                "Never answer from memory: first write <think>…</think> and one <search> query </search> naming "
                "the question's key entity, then answer only with a name the retrieved passages state."
            )
    elif outcome == "out_of_turns":
        summary = f"The agent searched {queries} but used all {n_turns} turns without giving an answer."
        skill = (
            "Answer before the turns run out: after two searches, give the best-supported name from the passages "
            "in <answer></answer>, and never repeat a near-identical query."
        )
    elif outcome == "no_evidence":
        summary = (
            f"The agent searched {queries} and answered '{answer}', which none of the retrieved passages contains; "
            "it was wrong."
        )
        skill = (
            "Do not answer with a name the passages never mention: when the results miss the answer, search again "
            "with the entity the question hinges on (the bridge entity for a two-hop question) before answering."
        )
    else:
        summary = (
            f"The agent searched {queries}; the passages it found mention '{answer}', which it answered, but that "
            "is not the right answer: the query retrieved the wrong passages."
        )
        skill = (
            "Check that a retrieved passage is about the exact entity the question asks for before answering; if "
            "it is about a similar name, search again with the question's distinguishing details."
        )
    return summary, skill
