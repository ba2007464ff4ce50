"""One search episode slot: `SearchGame` (the EnvGame of `env.SearchEnv.new_game`) plays one question: a search
returns the top passages inside `<information>`, an answer ends the episode with its exact match (`reward.py`); an
expert game adds the expert's next action (`expert.py`). The environment hands each slot what it reads (how a task
becomes its question, the retriever, how many passages a search returns): a slot never imports its environment."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from seedcli.envs.base import StepResult, Task
from seedcli.envs.search.data import Question
from seedcli.envs.search.expert import answer_action, first_action
from seedcli.envs.search.projection import parse_reply
from seedcli.envs.search.prompt import information_text, passages_to_string
from seedcli.envs.search.retriever import TOPK, Retriever
from seedcli.envs.search.reward import answer_in_text, exact_match, outcome


class SearchGame:
    """One episode slot: a question, its searches and the answer. `expert` adds the expert's next action."""

    def __init__(
        self,
        question: Callable[[Task], Question],
        retriever: Callable[[], Retriever],
        topk: int = TOPK,
        expert: bool = False,
    ):
        self.question = question  # the question behind a task
        self.retriever = retriever  # this process's retriever (built on first use)
        self.topk = topk
        self.expert = expert
        self.q: Question | None = None
        self.last: StepResult | None = None
        self.searches = 0

    def reset(self, task: Task) -> StepResult:
        self.q = self.question(task)
        self.searches = 0
        self.last = StepResult(
            observation=self.q.question,
            admissible=None,
            won=False,
            done=False,
            task=self.q.question,
            expert_action=first_action(self.q.question) if self.expert else None,
            info={"data_source": self.q.data_source},
        )
        return self.last

    def step(self, action: str) -> StepResult:
        if self.q is None or self.last is None:
            raise RuntimeError("step() before reset()")
        if self.last.done:
            return self.last
        parsed = parse_reply(action)
        q = self.q
        info: dict[str, Any] = {"data_source": q.data_source, "searches": self.searches}
        if parsed.kind == "answer":
            em = exact_match(parsed.content, list(q.golden_answers))
            info.update(answer=parsed.content, exact_match=em)
            won, score = outcome(em)
            self.last = StepResult("", None, won, True, q.question, None, em, score, info)
            return self.last
        if parsed.kind == "search":
            hits = self.retriever().search([parsed.content], self.topk)[0]
            self.searches += 1
            passages = passages_to_string(hits)
            found = answer_in_text(list(q.golden_answers), passages)
            info.update(query=parsed.content, searches=self.searches, doc_ids=[h["document"].get("id") for h in hits],
                        answer_retrieved=found is not None)  # fmt: skip
            expert_action = answer_action(found) if self.expert else None
            self.last = StepResult(
                information_text(hits), None, False, False, q.question, expert_action, 0.0, 0.0, info
            )
            return self.last
        # no usable block: verl-agent's environment answers nothing and the episode goes on
        self.last = StepResult("", None, False, False, q.question, self.last.expert_action, 0.0, 0.0, info)
        return self.last

    def close(self) -> None:
        pass
