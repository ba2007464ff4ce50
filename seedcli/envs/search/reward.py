"""Search-QA's reward: exact match as Search-R1 scores it (`verl/utils/reward_score/qa_em.py`: lower-case, drop ASCII
punctuation, drop the articles a/an/the, collapse whitespace; 1.0 when the prediction equals any golden answer), what
the trainer trains on, and the leak rule of its hindsight skills.

Trained on: the episode's success, an `<answer>` whose exact match is 1.0 (`outcome`). GRPO scores every turn of an
episode `SUCCESS_REWARD`·won − `INVALID_PENALTY` if that turn's reply was invalid (`projection.parse_reply`), with
the SEED code's values for search (1 and 0.01), and normalises the scores of a group by their mean and standard
deviation (`ADVANTAGE_NORM`); the trajectory's reward is `SUCCESS_REWARD`·won. Logged and evaluated: the exact match
itself (`StepResult.reward` and `StepResult.score` of the answering step; eval's "exact match"), and whether a
search retrieved a golden answer (`answer_in_text`, the expert's evidence test; `info["answer_retrieved"]`).
"""

from __future__ import annotations

import re
import string

from seedcli.envs.base import merge_spans

SUCCESS_REWARD = 1.0  # episode reward = SUCCESS_REWARD · won (1 · exact match)
INVALID_PENALTY = 0.01  # per invalid turn: the SEED code's value for search
ADVANTAGE_NORM = "mean_std"  # a group's turn scores: minus their mean, over their standard deviation

# Search-R1 removes only `string.punctuation` (ASCII); curly quotes, en dashes etc. stay and must match verbatim
_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Search-R1's `normalize_answer`, in its order: lower, remove punctuation, remove articles, fix whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, golden_answers: list[str]) -> float:
    """1.0 when the normalised prediction equals a normalised golden answer, else 0.0 (Search-R1's `em_check`)."""
    if isinstance(golden_answers, str):  # Search-R1 accepts a bare string as one answer
        golden_answers = [golden_answers]
    predicted = normalize_answer(prediction)
    return 1.0 if any(normalize_answer(g) == predicted for g in golden_answers) else 0.0


def outcome(em: float) -> tuple[bool, float]:
    """(success, score) of an answer whose exact match is `em`: a success when it is 1.0; the score is `em`."""
    return em == 1.0, em


def answer_in_text(golden_answers: list[str], text: str) -> str | None:
    """The first golden answer that occurs in `text` as whole words after normalisation, else None.

    This is the expert's evidence test (answer recall): the answer counts as retrieved only when it appears in a
    passage; whole words, so that "1" is not found inside "1990". Answers that normalise to nothing never count."""
    haystack = f" {normalize_answer(text)} "
    for answer in golden_answers:
        needle = normalize_answer(answer)
        if needle and f" {needle} " in haystack:
            return answer
    return None


def _normalize_with_offsets(text: str) -> tuple[str, list[int]]:
    """`normalize_answer(text)` built character by character, with the index in `text` each character came from.

    Equal to `normalize_answer` except where lower-casing depends on context (a Greek final sigma): this lower-cases
    one character at a time."""
    chars = [(low, i) for i, ch in enumerate(text) for low in ch.lower() if low not in _PUNCTUATION]
    joined = "".join(c for c, _ in chars)
    spaced: list[tuple[str, int]] = []
    pos = 0
    for m in _ARTICLES.finditer(joined):  # an article becomes one space, as re.sub makes it
        spaced += chars[pos : m.start()]
        spaced.append((" ", chars[m.start()][1]))
        pos = m.end()
    spaced += chars[pos:]
    out: list[tuple[str, int]] = []
    for c, i in spaced:  # " ".join(text.split()): whitespace runs become one space, none at either end
        if not c.isspace():
            out.append((c, i))
        elif out and out[-1][0] != " ":
            out.append((" ", i))
    if out and out[-1][0] == " ":
        out.pop()
    return "".join(c for c, _ in out), [i for _, i in out]


def answer_spans(golden_answers: list[str], text: str) -> list[tuple[int, int]]:
    """The (start, end) spans of `text` where a golden answer occurs as whole words, both normalised as exact match
    normalises them ("1" is not in "1990"); overlaps merged. A span runs from the first to the last character the
    matched words came from (an article or punctuation dropped inside it is included, at its ends not); a match
    only whole-string lower-casing finds (a Greek final sigma) spans the whole text."""
    exact = f" {normalize_answer(text)} "
    norm, offsets = _normalize_with_offsets(text)
    haystack = f" {norm} "
    spans: list[tuple[int, int]] = []
    for answer in golden_answers:
        needle = normalize_answer(answer)
        if not needle or f" {needle} " not in exact:
            continue
        found = False
        k = haystack.find(f" {needle} ")
        while k != -1:  # haystack index k + 1 is norm index k
            spans.append((offsets[k], offsets[k + len(needle) - 1] + 1))
            found = True
            k = haystack.find(f" {needle} ", k + 1)
        if not found:
            spans.append((0, len(text)))
    return merge_spans(spans)
