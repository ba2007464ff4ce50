"""The search expert: an oracle that searches the question itself, then answers with the first golden answer the
passages contain ("unknown" when they hold none). It is the ceiling the retriever allows: it wins a question exactly
when one search for its text retrieves a passage with the answer.
"""

from __future__ import annotations

from seedcli.envs.search.projection import format_response, parse_reply

UNKNOWN = "unknown"  # the expert's answer when the passages hold no golden answer


def first_action(question: str) -> str:
    """The expert's first action: a search for the question's text."""
    return f"<search>{question}</search>"


def answer_action(found: str | None) -> str:
    """The expert's action after a search: the golden answer `found` in the passages, or UNKNOWN."""
    return f"<answer>{found if found is not None else UNKNOWN}</answer>"


def expert_response(expert_action: str | None) -> str:
    """The expert's reply for its action (an answer of UNKNOWN when it has none), with a thought that says why."""
    action = expert_action or f"<answer>{UNKNOWN}</answer>"
    parsed = parse_reply(action)
    if parsed.kind == "search":
        think = "I need evidence, so I search for the question itself."
    elif parsed.content == UNKNOWN:
        think = "The retrieved passages do not contain the answer."
    else:
        think = f"The retrieved passages state the answer: {parsed.content}."
    return format_response(think, action)
