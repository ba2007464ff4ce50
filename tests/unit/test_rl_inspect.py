"""`seed inspect`: picks the right update's sample and shows tokens coloured by the score shift."""

import io
import json

import pytest
from rich.console import Console

from seedcli.errors import UserError
from seedcli.rl.inspect import pick_sample, read_samples, shift_style, show_samples


def record(step: int) -> dict:
    return {
        "step": step,
        "episode_id": f"u{step:04d}-g000-r00",
        "task": "put a clean mug in coffeemachine.",
        "task_type": "pick_clean_then_place_in_recep",
        "won": step == 2,
        "skill": "Find and take the mug, clean it with the sinkbasin, then put it in the coffeemachine.",
        "opd_beta": 5.0,
        "turns": [
            {
                "turn": 1,
                "action": "go to countertop 1",
                "valid": True,
                "advantage": 0.5,
                "tokens": ["<think>", "mug", "</think>"],
                "old_logp": [-1.0, -2.0, -0.5],
                "skill_logp": [-0.5, -3.0, -0.5],
                "shift": [0.5, -1.0, 0.0],
                "gate": [0.924, 0.0067, 0.5],
            }
        ],
    }


@pytest.fixture()
def run_dir(tmp_path):
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(record(s)) + "\n" for s in (1, 2)))
    return tmp_path


def test_show_latest_and_a_given_step(run_dir):
    buf = io.StringIO()
    rec = show_samples(run_dir, None, Console(file=buf, width=120, force_terminal=True, color_system="truecolor"))
    assert rec["step"] == 2
    text = buf.getvalue()
    assert "update 2" in text and "WON" in text and "clean it with the sinkbasin" in text
    assert "mean shift -0.167" in text and "most endorsed: '<think>' +0.50" in text
    assert "\x1b[" in text  # coloured
    assert show_samples(run_dir, 1, Console(file=io.StringIO()))["step"] == 1


def test_missing_step_and_missing_file(run_dir, tmp_path_factory):
    with pytest.raises(UserError, match="no sample logged at update 7; updates with samples: 1, 2"):
        pick_sample(read_samples(run_dir), 7)
    with pytest.raises(UserError, match="samples.jsonl: not found"):
        read_samples(tmp_path_factory.mktemp("empty"))


def test_shift_colours():
    assert "rgb(60,235,60)" in shift_style(5.0)  # saturated green
    assert "rgb(235,60,60)" in shift_style(-5.0)  # saturated red
    assert "rgb(235,235,235)" in shift_style(0.0)
    assert shift_style(None) == ""
