"""Search-QA's part of `--analyzer hindsight` (seedcli/envs/hindsight.py): the episode replayed against the expert.

The expert searches the question's own text and answers with the golden answer its passages hold. A lost episode's
turn is the answer given although a passage it had retrieved states the golden answer (or the turn after that
passage arrived, when it never answered), else its first search (its passages do not hold the answer; the expert's
search of the question, `expert_plan`, is what it is compared with), else the answer given without any search. The
skill says what was searched and answered there, which passage ("Doc 2 ('Title')") states the golden answer and what
the expert searched or answered. A won episode's turn is the search whose passage gave the answer. The skill names
the golden answer, which search's leak rule flags (`reward.answer_spans`): the audit counts it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from seedcli.envs.hindsight import Replayed, generic_skill, quote
from seedcli.envs.search.projection import parse_reply
from seedcli.envs.search.reward import answer_in_text

HINDSIGHT_VERSION = "search-hindsight-v1"  # bump when the generated text changes
_DOC = re.compile(r"Doc (\d+): ")


@dataclass
class Retrieved:
    """A search and what its passages hold."""

    query: str
    titles: list[str]  # each passage's title, in rank order
    holds: tuple[int, str, str] | None  # (1-based passage number, its title, the golden answer it states), if any


def passages(observation: str) -> list[str]:
    """The passages of an `<information>` observation, in rank order ([] for anything else)."""
    text = observation.strip()
    if not (text.startswith("<information>") and text.endswith("</information>")):
        return []
    body = text[len("<information>") : -len("</information>")]
    try:
        body = str(json.loads(body).get("result", ""))
    except (json.JSONDecodeError, AttributeError):
        pass
    return [p.strip() for p in _DOC.split(body)[2::2]]


def retrieved(query: str, observation: str, answers: list[str]) -> Retrieved:
    """What a search for `query` brought back (`observation`), and the first passage stating one of `answers`."""
    found = passages(observation)
    titles = [quote(p.split("\n", 1)[0].strip().strip('"'), 50) for p in found]
    holds = next(
        ((i + 1, titles[i], a) for i, p in enumerate(found) if (a := answer_in_text(answers, p)) is not None), None
    )
    return Retrieved(query, titles, holds)


def _doc(r: Retrieved) -> str:
    return f"Doc {r.holds[0]} ('{r.holds[1]}')" if r.holds else "no passage"


def _lost(steps: list[Replayed], answers: list[str], question: str, expert_search: Retrieved | None):
    """(the turn, what happened there, what the expert did instead, the rule) of a lost episode."""
    searches = [(s, retrieved(parse_reply(s.action).content, s.after.observation, answers)) for s in steps]
    searches = [(s, r) for s, r in searches if parse_reply(s.action).kind == "search"]
    answered = next((s for s in steps if parse_reply(s.action).kind == "answer"), None)
    found = next(((s, r) for s, r in searches if r.holds), None)
    golden = answers[0]
    if found is not None:
        at, r = found
        where = f"{_doc(r)}, retrieved by its search '{quote(r.query, 60)}' at turn {at.step}, states '{r.holds[2]}'"
        if answered is not None and answered.index > at.index:
            return (
                answered,
                f"answered '{quote(parse_reply(answered.action).content, 60)}', although {where}",
                f"the expert answered '{r.holds[2]}' there",
                "before answering, find the passage that names exactly what the question asks for and answer with "
                "that name; a name from another passage or from memory is wrong",
            )
        turn = steps[at.index + 1] if at.index + 1 < len(steps) else at
        return (
            turn,
            f"did '{quote(turn.action, 60) or 'nothing readable'}' and never answered, although {where}",
            f"the expert answered '{r.holds[2]}' as soon as that passage arrived",
            "answer as soon as a passage states the answer: the turns are few",
        )
    if expert_search is not None and expert_search.holds:
        expert = (
            f"the expert searched the question itself, and {_doc(expert_search)} of its results states "
            f"'{expert_search.holds[2]}'"
        )
        rule = "search with the question's own key words first; they retrieve the passage that answers it"
    else:
        expert = f"the expert's search of the question does not retrieve the answer either; it is '{golden}'"
        rule = (
            "when the passages do not name the answer, search again with the entity the question hinges on before "
            "answering, and never answer with a name no passage states"
        )
    if searches:
        turn, r = searches[0]
        return (
            turn,
            f"searched '{quote(r.query, 60)}', whose passages ({'; '.join(r.titles) or 'none'}) do not state the answer",
            expert,
            rule,
        )
    if answered is not None:
        return (
            answered,
            f"answered '{quote(parse_reply(answered.action).content, 60)}' without searching",
            expert,
            "search before answering: answer only with a name a retrieved passage states",
        )
    return (
        steps[0],
        "wrote no usable <search> or <answer> block in any reply",
        f"the expert searched '{quote(question, 80)}'",
        "every reply needs <think>…</think> and then exactly one <search> query </search> or <answer> name </answer>",
    )


def hindsight_skill(
    trajectory, steps: list[Replayed], answers: list[str], expert_search: Retrieved | None, title: str = "Search-QA"
) -> tuple[str, str]:
    """(episode_summary, episode_skill) of one search episode from its replay, the question's golden `answers` and
    what the expert's own search retrieved (`expert_search`)."""
    if not steps or not answers:
        return generic_skill(title, trajectory, steps)
    question = trajectory.task.strip()
    n = len(steps)
    if trajectory.won:
        last = steps[-1]
        answer = parse_reply(last.action).content
        searches = [
            (s, retrieved(parse_reply(s.action).content, s.after.observation, [answer]))
            for s in steps
            if parse_reply(s.action).kind == "search"
        ]
        found = next(((s, r) for s, r in searches if r.holds), None)
        if found is None:
            summary = f"The agent answered '{answer}' at turn {last.step} and was right, with no passage stating it."
            skill = (
                f"For '{quote(question, 100)}' the agent answered '{answer}' at turn {last.step} without a passage "
                "to back it; the expert would first search the question. Confirm an answer with one search of the "
                "question's key entity, then answer with the exact name."
            )
            return summary, skill
        at, r = found
        summary = (
            f"The agent won in {n} turn(s): its search '{quote(r.query, 60)}' at turn {at.step} retrieved {_doc(r)}, "
            f"and it answered '{answer}' at turn {last.step}."
        )
        skill = (
            f"For '{quote(question, 100)}': at turn {at.step} the search '{quote(r.query, 60)}' retrieved {_doc(r)}, "
            f"which states '{answer}', and the agent answered exactly that, as the expert does. Search the entity the "
            "question asks about, find the passage that names the answer and answer with exactly that name."
        )
        return summary, skill
    turn, did, instead, rule = _lost(steps, answers, question, expert_search)
    summary = f"The agent lost after {n} turn(s). At turn {turn.step} it {did}; {instead}."
    skill = f"For '{quote(question, 100)}': at turn {turn.step} the agent {did}; {instead}. Rule: {rule}."
    return summary, skill
