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


def test_plain_lines_estimate_the_time_left(monkeypatch, capsys):
    """Off a terminal each plain line gives the time left at the rate so far (issue 62 §3: a probe whose output went
    to a file printed nothing for 45 minutes); the last line, with nothing left, gives none."""
    monkeypatch.setenv("SEEDCLI_PROGRESS_S", "0")
    clock = iter([100.0, 110.0, 130.0])  # start, after 1 of 4 (10 s), after all 4
    monkeypatch.setattr("seedcli.progress.time.time", lambda: next(clock))
    with StageProgress("probe scoring", 4) as progress:
        progress.tty = False
        progress.advance(1)
        progress.advance(3)
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("[probe scoring] 1/4 10s ~30s left")  # 10 s a step, 3 steps to go
    assert lines[1].startswith("[probe scoring] 4/4 30s") and "left" not in lines[1]
