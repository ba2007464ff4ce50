"""scripts/update_probe.py: the expert's states on EZPoints, and the tally of a model's replies at them."""

from __future__ import annotations

import pytest

from seedcli.envs import get_env
from tests.helpers_cli import load_script


@pytest.fixture(scope="module")
def probe():
    return load_script("update_probe")


def test_expert_states_are_number_op_number_close(probe, tmp_path, monkeypatch):
    monkeypatch.setenv("SEEDCLI_CACHE", str(tmp_path))  # the demonstrations are cached there
    picked = probe.states(get_env("ezpoints"), games=3, seed=7)
    kinds = [probe.kind(label) for _, label in picked]
    # every EZPoints game is won by "a + b =" or "a * b =" (game.py), so the noise-free expert plays 4 moves a game
    assert kinds == ["number", "op", "number", "="] * 3
    assert all("formula" in prompt.lower() for prompt, _ in picked)


def test_tally_counts_valid_expert_and_early_close(probe):
    env = get_env("ezpoints")
    picked = [("p1", "5"), ("p2", "+"), ("p3", "7"), ("p4", "="), ("p5", "*")]
    replies = [
        env.format_response("t", "5"),  # number state: the expert's move
        env.format_response("t", "="),  # op state: closes too early
        "no json here",  # number state: invalid
        env.format_response("t", "="),  # close state: the expert's move
        env.format_response("t", "+"),  # op state: valid, another operator
    ]
    out = probe.tally(picked, replies, env.parse_action)
    assert out["states"] == 5
    assert out["early_close"] == 1
    assert dict(out["kinds"]["number"]) == {"states": 2, "valid": 1, "expert": 1}
    assert dict(out["kinds"]["op"]) == {"states": 2, "valid": 2, "expert": 0}
    assert dict(out["kinds"]["="]) == {"states": 1, "valid": 1, "expert": 1}
