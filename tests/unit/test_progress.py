"""Plain progress lines: $SEEDCLI_PROGRESS_S sets their interval; a value that is not seconds is one clear error."""

from __future__ import annotations

import pytest

from seedcli.errors import UserError
from seedcli.progress import StageProgress


def test_the_interval_comes_from_the_environment_unless_the_stage_sets_one(monkeypatch):
    monkeypatch.delenv("SEEDCLI_PROGRESS_S", raising=False)
    assert StageProgress("rl", 3)._every == 30.0
    monkeypatch.setenv("SEEDCLI_PROGRESS_S", "2.5")
    assert StageProgress("rl", 3)._every == 2.5
    assert StageProgress("annotate", 3, every_s=10.0)._every == 10.0


@pytest.mark.parametrize("value", ["abc", "-1", "nan"])
def test_a_malformed_interval_says_how_to_fix_it(monkeypatch, value):
    monkeypatch.setenv("SEEDCLI_PROGRESS_S", value)
    with pytest.raises(UserError, match=r"SEEDCLI_PROGRESS_S=.* is not a number of seconds >= 0: set it to e\.g\. 10"):
        StageProgress("rl", 3)
