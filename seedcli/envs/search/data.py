"""Search-QA questions (FlashRAG's fields `id`, `question`, `golden_answers`, `data_source`) and their splits.

Splits: `train` and `dev` are the closed questions whose passages are in the bundled corpus (`closed/`); `test` is
the five test sets (`test/<name>.jsonl`); any other value is read as a JSONL file with the same fields, so TriviaQA,
PopQA or a custom set plug in by path.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import orjson

from seedcli.envs.base import find_data_root
from seedcli.errors import UserError

TEST_SETS = ("nq", "hotpotqa", "2wiki", "musique", "bamboogle")
CLOSED_SPLITS = ("train", "dev")
SPLITS = (*CLOSED_SPLITS, "test")
CORPUS_FILE = "corpus.jsonl"


@dataclass(frozen=True)
class Question:
    """One QA item; `data_source` is its category (test-set name, or the closed set it came from)."""

    id: str
    question: str
    golden_answers: tuple[str, ...]
    data_source: str


def resolve_data_root(explicit: str | os.PathLike | None = None) -> Path:
    """The search data folder: `explicit`, else $SEARCH_DATA, else ../shared/search next to the cwd or the repo."""

    def has_data(root: Path) -> bool:
        return (root / "closed").is_dir() or (root / "test").is_dir()

    def missing(source: str, root: Path | None) -> str:
        if root is None:
            return (
                "search data not found: set SEARCH_DATA=/path/to/search (the folder holding closed/, test/ and "
                "corpus.jsonl) or pass env.data_root"
            )
        how = {"explicit": "data_root", "env": "SEARCH_DATA"}.get(source, "default")
        if not root.is_dir():
            return f"search data folder {root} ({how}) does not exist; point it at the folder holding closed/ and test/"
        return f"search data folder {root} ({how}) holds neither closed/ nor test/; point it at the search data bundle"

    return find_data_root(explicit, "SEARCH_DATA", "search", has_data, missing)


def default_corpus(data_root: str | os.PathLike | None = None) -> Path:
    """The bundled wiki-18-format corpus (10,002 passages)."""
    return resolve_data_root(data_root) / CORPUS_FILE


def iter_json_objects(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each non-empty line of a JSONL file; a bad line is a one-line error."""
    with path.open("rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise UserError(f"{path}:{lineno}: not valid JSON ({exc}); fix or remove the line") from None
            if not isinstance(rec, dict):
                raise UserError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
            yield lineno, rec


def read_questions(path: str | os.PathLike) -> list[Question]:
    """Read a question JSONL; a missing field or a bad line is a one-line error naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"question file {path} not found; give a JSONL with id, question, golden_answers, data_source")
    questions: list[Question] = []
    seen: set[str] = set()
    for lineno, rec in iter_json_objects(path):
        questions.append(_to_question(rec, path, lineno))
        if questions[-1].id in seen:
            raise UserError(f"{path}:{lineno}: duplicate id '{questions[-1].id}'; ids must be unique in a split")
        seen.add(questions[-1].id)
    if not questions:
        raise UserError(f"question file {path} is empty; it needs one JSON question per line")
    return questions


def _to_question(rec: dict, path: Path, lineno: int) -> Question:
    missing = [k for k in ("question", "golden_answers") if k not in rec]
    if missing:
        raise UserError(
            f"{path}:{lineno}: missing field(s) {', '.join(missing)}; each line needs id, question, golden_answers, "
            "data_source"
        )
    answers = rec["golden_answers"]
    if isinstance(answers, str):
        answers = [answers]
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        raise UserError(f"{path}:{lineno}: golden_answers must be a non-empty list of strings")
    if not isinstance(rec["question"], str) or not rec["question"].strip():
        raise UserError(f"{path}:{lineno}: question must be a non-empty string")
    # a user file may lack ids or sources: fall back to the line number and the file name
    qid = str(rec.get("id") or f"{path.stem}-{lineno - 1}")
    source = str(rec.get("data_source") or path.stem)
    return Question(qid, rec["question"], tuple(answers), source)


def load_split(
    split: str,
    data_root: str | os.PathLike | None = None,
    datasets: list[str] | None = None,
    limit: int | None = None,
) -> list[Question]:
    """Questions of a split, in file order; `datasets` keeps only those data sources, `limit` applies per source.

    `test` leaves out the 2Wiki questions that `closed/train.jsonl` holds (the data README: a model trained on
    `train` has seen them)."""
    if split in CLOSED_SPLITS:
        root = resolve_data_root(data_root)
        questions = read_questions(root / "closed" / f"{split}.jsonl")
    elif split == "test":
        root = resolve_data_root(data_root)
        names = list(datasets) if datasets else list(TEST_SETS)
        unknown = [n for n in names if n not in TEST_SETS]
        if unknown:
            raise UserError(f"unknown test set(s) {', '.join(unknown)}; choose from {', '.join(TEST_SETS)}")
        seen_in_training = _closed_train_ids(root)
        questions = []
        for name in names:
            questions += [q for q in read_questions(root / "test" / f"{name}.jsonl") if q.id not in seen_in_training]
        datasets = None  # already applied, by file
    elif split.endswith(".jsonl") or Path(split).is_file():
        questions = read_questions(split)
    else:
        raise UserError(f"unknown search split '{split}'; use train, dev, test or a JSONL file of questions")
    if datasets:
        available = sorted({q.data_source for q in questions})
        unknown = [d for d in datasets if d not in available]
        if unknown:
            raise UserError(
                f"split '{split}' has no data source(s) {', '.join(unknown)}; it has {', '.join(available)}"
            )
        questions = [q for q in questions if q.data_source in set(datasets)]
    if limit is not None:
        taken: Counter[str] = Counter()
        kept = []
        for q in questions:
            if taken[q.data_source] < limit:
                taken[q.data_source] += 1
                kept.append(q)
        questions = kept
    return questions


def _closed_train_ids(root: Path) -> set[str]:
    path = root / "closed" / "train.jsonl"
    return {q.id for q in read_questions(path)} if path.is_file() else set()


@lru_cache(maxsize=8)
def question_index(split: str, data_root: str | None) -> dict[str, Question]:
    """Every question of a split (a named split or a JSONL file) by id, read once per process."""
    if split in SPLITS:
        questions = load_split(split, data_root)
    else:
        questions = read_questions(split)
    return {q.id: q for q in questions}
