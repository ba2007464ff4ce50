"""Exact match as Search-R1's qa_em.py computes it, on hand-normalised cases."""

import pytest

from seedcli.envs.search.reward import answer_in_text, exact_match, normalize_answer


@pytest.mark.parametrize(
    ("text", "normalised"),
    [
        ("The Beatles", "beatles"),  # case, leading article
        ("  Paris,\n  France. ", "paris france"),  # ASCII punctuation, whitespace collapsed
        ("an apple a day", "apple day"),  # a / an as whole words only
        ("theater", "theater"),  # "the" inside a word stays
        ("the-end", "theend"),  # punctuation goes first, so "the" is no longer a word of its own
        ("“Hamlet”", "“hamlet”"),  # non-ASCII quotes are not in string.punctuation: they stay
        ("1990–1995", "1990–1995"),  # en dash stays
        ("1990-1995", "19901995"),  # hyphen goes
        ("Małgorzata BRAUNEK", "małgorzata braunek"),  # non-ASCII letters are lower-cased
        ("A", ""),
    ],
)
def test_normalize_answer(text: str, normalised: str) -> None:
    assert normalize_answer(text) == normalised


def test_exact_match_cases() -> None:
    assert exact_match("the Beatles!", ["Beatles"]) == 1.0
    assert exact_match("Beatles band", ["Beatles"]) == 0.0  # exact, not substring
    # several golden answers: any one suffices (NQ's aliases)
    assert exact_match("december 1972", ["14 December 1972 UTC", "December 1972"]) == 1.0
    assert exact_match("1972", ["14 December 1972 UTC", "December 1972"]) == 0.0
    # non-ASCII punctuation must match verbatim, ASCII punctuation need not
    assert exact_match("Hamlet", ["“Hamlet”"]) == 0.0
    assert exact_match("Hamlet", ['"Hamlet"']) == 1.0
    assert exact_match("1990–1995", ["1990-1995"]) == 0.0
    # whitespace and case
    assert exact_match("  NEW   york ", ["New York"]) == 1.0
    # a bare string is one golden answer, as in Search-R1
    assert exact_match("yes", "Yes") == 1.0
    # Search-R1's quirk: an answer that normalises to nothing matches an article-only golden answer
    assert exact_match("a", ["The"]) == 1.0


def test_answer_in_text_whole_words() -> None:
    passage = '"Moon landing"\nThe last crewed landing was in December 1972, by Apollo 17.'
    assert answer_in_text(["14 December 1972 UTC", "December 1972"], passage) == "December 1972"
    assert answer_in_text(["Apollo 1"], passage) is None  # "apollo 1" is not "apollo 17"
    assert answer_in_text(["the"], passage) is None  # normalises to nothing: never evidence
