"""Reading the agent's reply, as verl-agent's search projection (`env_package/search/projection.py`) does.

The reply is cut after the first closing `</search>` (else `</answer>`); the first complete `<search>…</search>`
block is the action, else the first `<answer>…</answer>`. Validity is judged on the whole, uncut reply: it is
invalid with neither block, with both tags, or with a repeated tag. An extracted block is still executed when the
reply is invalid (verl-agent sends it to the environment and only flags the turn)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

_SEARCH_BLOCK = re.compile(r"<search>(.*?)</search>", re.IGNORECASE | re.DOTALL)
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_SEARCH_TAG = re.compile(r"<search>", re.IGNORECASE)
_ANSWER_TAG = re.compile(r"<answer>", re.IGNORECASE)


@dataclass(frozen=True)
class SearchAction:
    """What one reply asks for: `kind` search/answer (None: nothing usable), its stripped `content`, validity."""

    kind: Literal["search", "answer"] | None
    content: str
    valid: bool

    @property
    def text(self) -> str:
        """The action as verl-agent stores it in the history: `<search>q</search>`, `<answer>a</answer>` or ''."""
        return f"<{self.kind}>{self.content}</{self.kind}>" if self.kind else ""


def _cut(reply: str) -> str:
    # guards against several concatenated snippets: everything after the first closing tag is dropped
    if "</search>" in reply:
        return reply.split("</search>", 1)[0] + "</search>"
    if "</answer>" in reply:
        return reply.split("</answer>", 1)[0] + "</answer>"
    return reply


def parse_reply(reply: str) -> SearchAction:
    """verl-agent's `search_projection` for one reply."""
    trimmed = _cut(reply)
    kind: Literal["search", "answer"] | None = None
    content = ""
    if m := _SEARCH_BLOCK.search(trimmed):
        kind, content = "search", m.group(1).strip()
    elif m := _ANSWER_BLOCK.search(trimmed):
        kind, content = "answer", m.group(1).strip()
    n_search = len(_SEARCH_TAG.findall(reply))
    n_answer = len(_ANSWER_TAG.findall(reply))
    valid = kind is not None and not (n_search and n_answer) and n_search <= 1 and n_answer <= 1
    return SearchAction(kind, content, valid)


def format_response(think: str, action: str) -> str:
    """A well-formed reply that `parse_reply` reads back as `action`: `action` is what a parse returns
    (`<search>q</search>` or `<answer>a</answer>`); bare text is taken as a search query."""
    if not parse_reply(action).kind:
        action = f"<search>{action}</search>"
    return f"<think>{think}</think>\n{action}"
