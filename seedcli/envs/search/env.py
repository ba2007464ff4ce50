"""Search-QA on the environment protocol: Search-R1's question answering as verl-agent and the SEED code run it.

A task is a question (`data.py`); its category the data source. Each turn the agent writes `<think>` and one of
`<search> query </search>` (the top 3 passages come back inside `<information>`) or `<answer> … </answer>` (the episode
ends; reward 1·exact match: `reward.py`). The prompt is verl-agent's (`prompt.py`), the reply read as its search
projection reads it (`projection.py`); one question is an `episode.SearchGame`. Options (`env_options`): `corpus` (wiki-18-format JSONL for in-process BM25; default the
bundled 10k passages), `search_url` (a Search-R1 `/retrieve` server instead), `datasets` and `limit` (test sets and
questions per data source), `topk`, `timeout`, `max_retries`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from seedcli.envs.base import Environment, EnvOptions, StepResult, Task
from seedcli.envs.card import EnvCard
from seedcli.envs.search import prompt
from seedcli.envs.search.data import SPLITS, Question, default_corpus, load_split, question_index, resolve_data_root
from seedcli.envs.search.episode import SearchGame
from seedcli.envs.search.expert import UNKNOWN, expert_response
from seedcli.envs.search.hindsight import HINDSIGHT_VERSION, hindsight_skill, retrieved
from seedcli.envs.search.projection import format_response, parse_reply
from seedcli.envs.search.retriever import TOPK, Retriever, make_retriever, normalise_url
from seedcli.envs.search.reward import ADVANTAGE_NORM, INVALID_PENALTY, SUCCESS_REWARD, answer_in_text, answer_spans
from seedcli.envs.search.rules import RULES_VERSION, rules_skill
from seedcli.errors import UserError
from seedcli.prompts import ORACLE_PREFIX

ORACLE_PASSAGE_CHARS = 400  # the oracle skill's passage, cut to this many characters

CARD = EnvCard(
    metric_labels={
        "macro_score": "exact match (average over data sources)",
        "mean_score": "exact match (all questions)",
    },
    task_noun="question",
    category_label="data source",
    category_names={
        "nq": "NQ",
        "triviaqa": "TriviaQA",
        "popqa": "PopQA",
        "hotpotqa": "HotpotQA",
        "2wiki": "2Wiki",
        "musique": "MuSiQue",
        "bamboogle": "Bamboogle",
        "hotpotqa_train": "HotpotQA (closed)",
        "musique_train": "MuSiQue (closed)",
        "2wiki_dev": "2Wiki (closed)",
    },
    # The paper gives only the average over its seven sets (NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, MuSiQue,
    # Bamboogle) with a 21M-passage wiki-18 retriever; offline runs average five sets over 10k passages.
    paper_results={
        "test": {
            "GRPO": {"macro_score": 0.364},
            "SDAR": {"macro_score": 0.434},
            "SEED": {"macro_score": 0.457},
        }
    },
    paper_note=(
        "Paper: Qwen2.5-3B, exact match averaged over NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, MuSiQue and Bamboogle "
        "with a 21M-passage wiki-18 retriever; the seed documents give the 7-set average only, not per data source."
    ),
    offline_note=(
        "Offline corpus: about 10k passages, not wiki-18's 21M, and no TriviaQA or PopQA; offline scores test the "
        "mechanism and cannot be compared with the paper (point env_options.search_url at a wiki-18 server for that)."
    ),
)


class SearchOptions(EnvOptions):
    """`env_options` of the search environment."""

    corpus: str | None = Field(
        None, description="wiki-18-format JSONL of passages for in-process BM25 (default: the data root's corpus.jsonl)"
    )
    search_url: str | None = Field(
        None, description="a Search-R1 POST /retrieve server to use instead of BM25 (host:port or a full URL)"
    )
    datasets: list[str] | None = Field(
        None, description="data sources to load (test: nq, hotpotqa, 2wiki, musique, bamboogle; default: all)"
    )
    limit: int | None = Field(None, ge=1, description="load only the first N questions of each data source")
    topk: int = Field(TOPK, ge=1, description="passages returned per search")
    timeout: float = Field(30.0, gt=0, description="seconds a search_url request may take before it is retried")
    max_retries: int = Field(3, ge=0, description="retries of a failed search_url request (doubling backoff)")

    @field_validator("datasets", mode="before")
    @classmethod
    def _csv(cls, v: Any) -> Any:
        return [d.strip() for d in v.split(",") if d.strip()] if isinstance(v, str) else v  # `datasets=nq,bamboogle`

    @field_validator("search_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                normalise_url(v)
            except UserError as exc:
                raise ValueError(str(exc)) from None
        return v


class SearchEnv(Environment):
    """Search-R1's QA protocol: free-text searches, exact-match reward, an in-process or remote retriever."""

    name = "search"
    title = "Search-QA"
    prompt_version = prompt.PROMPT_VERSION
    task_line_prefix = prompt.TASK_LINE_PREFIX
    max_steps = 4
    history = prompt.HISTORY
    max_step_skills = 2  # the SEED code's analysis_max_step_skills_per_traj for search
    success_reward = SUCCESS_REWARD  # reward = 1·exact match
    invalid_penalty = INVALID_PENALTY  # the SEED code's value for search
    advantage_norm = ADVANTAGE_NORM
    gigpo_similarity_threshold = 0.9  # verl-agent run_search.sh: enable_similarity=True, similarity_thresh=0.9
    free_text = True
    splits = {s: s for s in SPLITS} | {"valid": "dev", "validation": "dev"}
    train_split = "train"
    eval_splits = ("test", "dev")
    split_file = "a JSONL file of questions in FlashRAG's fields (id, question, golden_answers, data_source)"
    val_split = "dev"
    # report order: the paper's seven sets, then the closed sets of the offline bundle
    categories = ("nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle",
                  "hotpotqa_train", "musique_train", "2wiki_dev")  # fmt: skip
    category_aliases = {"2wikimultihopqa": "2wiki", "natural_questions": "nq", "hotpot": "hotpotqa"}
    counted_actions = {"search calls": "<search>"}  # the game searches whatever action parses as a search
    limit_per_category = True  # `seed eval --limit N`: N questions of each data source (Search-R1's practice)
    rules_version = RULES_VERSION
    hindsight_version = HINDSIGHT_VERSION
    analysis_description = prompt.ANALYSIS_DESCRIPTION
    expert_modes = (False, True)
    options_model = SearchOptions
    card = CARD

    def __init__(self, data_root: str | None = None, **options: Any):
        super().__init__(data_root, **options)
        self._retriever: Retriever | None = None

    # -- tasks ----------------------------------------------------------------------------------------------------

    def resolve_data_root(self) -> Path:
        """`data_root`, else $SEARCH_DATA, else ../shared/search; missing or empty is a one-line UserError."""
        return resolve_data_root(self.data_root)

    def resolve_split(self, split: str) -> str:
        """train | dev (alias valid) | test, or a JSONL file of questions in FlashRAG's fields."""
        text = str(split).strip()
        if text.lower() in self.splits:
            return self.splits[text.lower()]
        if text.endswith(".jsonl") or Path(text).is_file():
            path = str(Path(text).expanduser().resolve())
            # a user's question file (TriviaQA, PopQA, ...) is an eval split of this instance too
            if path not in self.eval_splits:
                self.eval_splits = (*self.eval_splits, path)
            return path
        raise UserError(f"unknown Search-QA split {split!r}: use train, dev, test or a JSONL file of questions")

    def list_tasks(self, split: str) -> list[Task]:
        canon = self.resolve_split(split)
        limit = self.options.get("limit")
        questions = load_split(canon, self.data_root, self.options.get("datasets"), int(limit) if limit else None)
        return [Task(task_id=q.id, category=q.data_source, split=canon, name=q.id) for q in questions]

    def question(self, task: Task) -> Question:
        """The question behind a task (looked up in its whole split, whatever filters made the task list)."""
        found = question_index(task.split, None if self.data_root is None else str(self.data_root)).get(task.task_id)
        if found is None:
            raise UserError(f"question {task.task_id!r} is not in the {task.split} split; was the data changed?")
        return found

    # -- playing --------------------------------------------------------------------------------------------------

    def retriever(self) -> Retriever:
        """The retriever of this process (built on first use): HTTP when `search_url` is set, else BM25."""
        if self._retriever is None:
            url = self.options.get("search_url")
            corpus = self.options.get("corpus") or (None if url else default_corpus(self.data_root))
            http = {k: self.options[k] for k in ("timeout", "max_retries") if k in self.options}
            self._retriever = make_retriever(corpus=corpus, search_url=url, **http)
        return self._retriever

    def new_game(self, expert: bool | str = False) -> SearchGame:
        if expert not in self.expert_modes:
            raise UserError(f"unknown expert mode {expert!r} for search; use one of {self.expert_modes}")
        return SearchGame(self.question, self.retriever, self.options.get("topk", TOPK), expert=bool(expert))

    # -- prompt and actions ---------------------------------------------------------------------------------------

    def render_prompt(
        self,
        task: str,
        observation: str,
        admissible: Sequence[str] | None,
        step: int,
        history: Sequence[tuple[str, str]],
        history_length: int,
    ) -> str:
        return prompt.render_prompt(task, observation, history, history_length)

    def parse_action(self, response: str) -> tuple[str, bool]:
        action = parse_reply(response)
        return action.text, action.valid

    def format_response(self, think: str, action: str) -> str:
        return format_response(think, action)  # `action` is what parse_action returns (or a bare query)

    def expert_response(self, result: StepResult) -> str:
        return expert_response(result.expert_action)

    def random_response(self, result: StepResult, rng: random.Random) -> str:
        """Searches three random words of the question or answers one of them, with equal odds: the floor."""
        words = result.task.split() or [UNKNOWN]
        if rng.random() < 0.5:
            query = " ".join(rng.sample(words, min(3, len(words))))
            return self.format_response("I search some words of the question.", f"<search>{query}</search>")
        return self.format_response("I answer a word of the question.", f"<answer>{rng.choice(words)}</answer>")

    # -- analysis and tokenizer -----------------------------------------------------------------------------------

    def rules_skill(self, trajectory) -> tuple[str, str]:
        return rules_skill(trajectory, self.card.category_name(getattr(trajectory, "category", "") or ""))

    def hindsight_skill(self, trajectory) -> tuple[str, str]:
        """The answer given although a retrieved passage states the golden one, else the search that missed it
        (against the expert's search of the question), or a win's search that found it (`hindsight.hindsight_skill`).
        Names the golden answer: privileged, as an analyzer reading the outcome is."""
        task = Task(trajectory.task_id, trajectory.category, trajectory.split)
        question = self.question(task)
        answers = list(question.golden_answers)
        plan = self.expert_plan(task, limit=1)  # the expert's first action: a search for the question's text
        expert_search = retrieved(question.question, plan[0][1].observation, answers) if plan else None
        return hindsight_skill(trajectory, self.hindsight_replay(trajectory), answers, expert_search)

    def leaks(self, trajectory, skill: str) -> list[tuple[int, int]]:
        """Spans of `skill` where one of the question's golden answers occurs, both normalised as exact match
        normalises them, as whole words (`reward.answer_spans`). The question is read from the trajectory's split."""
        task = Task(trajectory.task_id, trajectory.category, trajectory.split)
        return answer_spans(list(self.question(task).golden_answers), skill)

    def oracle_skill(self, trajectory) -> str | None:
        """The question's answer and the passage that holds it (the expert's one search for the question's text:
        its first passage with a golden answer, cut to ORACLE_PASSAGE_CHARS), or the answer alone when no passage
        holds it. Privileged: the answer itself."""
        key = (trajectory.task_id, trajectory.split)
        cache = self.__dict__.setdefault("_oracle_cache", {})
        if key not in cache:
            q = self.question(Task(trajectory.task_id, trajectory.category, trajectory.split))
            answers = list(q.golden_answers)
            hits = self.retriever().search([q.question], self.options.get("topk", TOPK))[0]
            held = [h["document"]["contents"].strip() for h in hits]
            found = next(((answer_in_text(answers, text), text) for text in held if answer_in_text(answers, text)), None)
            answer = found[0] if found else answers[0]
            text = f"{ORACLE_PREFIX}the answer is {answer}."
            if found:
                text += f" The passage that holds it: {found[1][:ORACLE_PASSAGE_CHARS]}"
            cache[key] = text
        return cache[key]

    def sample_texts(self) -> list[str]:
        try:
            root = resolve_data_root(self.data_root)
        except UserError:
            return prompt.fallback_texts()
        return list(prompt.sample_texts(str(root)))
