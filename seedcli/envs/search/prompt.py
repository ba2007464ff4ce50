"""The text the search agent reads: verl-agent's search templates (`agent_system/environments/prompts/search.py`),
its search-memory history, the turn prompt built from them, retrieved passages formatted as its search tool formats
them, the analysis prompt's first sentence, and the tiny tokenizer's text."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import orjson

from seedcli.envs.search.data import CORPUS_FILE, load_split

PROMPT_VERSION = "search-v1 (verl-agent SEARCH_TEMPLATE)"
TASK_LINE_PREFIX = "Your question: "
HISTORY = 4  # observation/action pairs shown by default (SearchEnv.history)
ANALYSIS_DESCRIPTION = (
    "You are an expert analyst of search agents that answer questions with a search engine (Search-R1's "
    "question answering: the agent writes <search> queries, reads the retrieved Wikipedia passages inside "
    "<information>, and gives an <answer> scored by exact match)."
)

# verbatim from verl-agent, including the trailing spaces after "tags." and the leading newline
SEARCH_TEMPLATE_NO_HIS = """
You are an expert agent tasked with answering the given question step-by-step.
Your question: {task_description}

Now it's your turn to respond for the current step.
You should first conduct reasoning process. This process MUST be enclosed within <think> </think> tags. 
After completing your reasoning, choose only one of the following actions (do not perform both):
(1) If you find you lack some knowledge, you can call a search engine to get more external information using format: <search> your query </search>.
(2) If you have enough knowledge to answer the question confidently, provide your final answer within <answer> </answer> tags, without detailed illustrations. For example, <answer>Beijing</answer>.
"""

SEARCH_TEMPLATE = """
You are an expert agent tasked with answering the given question step-by-step.
Your question: {task_description}

Prior to this step, you have already taken {step_count} step(s). Below is the interaction history where <search> </search> wrapped your past search queries and <information> </information> wrapped the corresponding search results returned by the external search engine. History:
{memory_context}

Now it's your turn to respond for the current step.
You should first conduct reasoning process. This process MUST be enclosed within <think> </think> tags. 
After completing your reasoning, choose only one of the following actions (do not perform both):
(1) If you find you lack some knowledge, you can call a search engine to get more external information using format: <search> your query </search>.
(2) If you have enough knowledge to answer the question confidently, provide your final answer within <answer> </answer> tags, without detailed illustrations. For example, <answer>Beijing</answer>.
"""


def passages_to_string(hits: Sequence[dict]) -> str:
    """verl-agent's `_passages2string`: one `Doc i: <contents>` line per passage (title line included)."""
    return "".join(f"Doc {i + 1}: {hit['document']['contents'].strip()}\n" for i, hit in enumerate(hits))


def information_text(hits: Sequence[dict]) -> str:
    """The observation after a search: the JSON-wrapped passages inside `<information>`, as verl-agent shows it.

    verl-agent's tool returns `json.dumps({"result": passages})` (so newlines appear as `\\n` and non-ASCII as
    `\\uXXXX`), the env wraps it in `\\n<information>…</information>\\n` and the env manager strips the newlines."""
    return "<information>" + json.dumps({"result": passages_to_string(hits)}) + "</information>"


def history_text(steps: Sequence[tuple[str, str]], history: int) -> str:
    """verl-agent's `SearchMemory.fetch`: the last `history` (action, observation) pairs as `Step n:<action> <obs>`."""
    recent = list(steps)[-history:] if history > 0 else []
    start = len(steps) - len(recent)
    return "\n".join(f"Step {start + j + 1}:{action} {obs}\n" for j, (action, obs) in enumerate(recent))


def build_prompt(question: str, steps: Sequence[tuple[str, str]], history: int) -> str:
    """The agent prompt for the next turn: the no-history template on the first turn, else the history template."""
    if not steps or history <= 0:
        return SEARCH_TEMPLATE_NO_HIS.format(task_description=question)
    return SEARCH_TEMPLATE.format(
        task_description=question, memory_context=history_text(steps, history), step_count=len(steps)
    )


def render_prompt(question: str, observation: str, history: Sequence[tuple[str, str]], history_length: int) -> str:
    """The user message of a turn from the protocol's history: (observation, action taken on it) pairs of the
    earlier turns, the current `observation` last."""
    # The protocol's history pairs an observation with the action taken on it; verl-agent's memory pairs an
    # action with the information it brought back, i.e. with the next observation.
    pairs = list(history)
    steps = [(pairs[i][1], pairs[i + 1][0] if i + 1 < len(pairs) else observation) for i in range(len(pairs))]
    return build_prompt(question, steps, history_length)


def fallback_texts() -> list[str]:
    """The tiny tokenizer's text without data: a first-turn prompt."""
    return [build_prompt("Who wrote Hamlet?", [], HISTORY)]


@lru_cache(maxsize=2)
def sample_texts(root: str) -> tuple[str, ...]:
    """Questions, answers, first and later prompts, and passages as the agent sees them (JSON-escaped)."""
    texts: list[str] = []
    questions = load_split("train", root) + load_split("dev", root)
    for q in questions:
        texts.append(q.question)
        texts.append(" ".join(f"<answer>{a}</answer>" for a in q.golden_answers))
    corpus = Path(root) / CORPUS_FILE
    docs: list[dict] = []
    if corpus.is_file():
        with corpus.open("rb") as fh:
            for i, line in enumerate(fh):
                if i % 8 == 0:  # an eighth of the corpus is plenty of Wikipedia text for a tiny tokenizer
                    docs.append({"document": orjson.loads(line), "score": 0.0})
    for i in range(0, len(docs), 3):
        hits = docs[i : i + 3]
        q = questions[(i // 3) % len(questions)].question
        info = information_text(hits)
        if i % 30 == 0:
            texts.append(build_prompt(q, [(f"<search>{q}</search>", info)], HISTORY))
        else:
            texts.append(info)
    texts.append(build_prompt(questions[0].question, [], HISTORY))
    return tuple(texts)
