"""Exact match as Search-R1 scores it (`verl/utils/reward_score/qa_em.py`): lower-case, drop ASCII punctuation,
drop the articles a/an/the, collapse whitespace; 1.0 when the prediction equals any golden answer."""

from __future__ import annotations

import re
import string

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
