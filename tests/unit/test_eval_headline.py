"""`seed eval`'s summary puts the environment's own headline first (seedcli.stages.eval.headline_metrics)."""

from __future__ import annotations

import pytest

from seedcli.envs import env_class
from seedcli.stages.eval import headline_metrics

RESULTS = {
    "macro_success": 0.5,
    "micro_success": 0.4,
    "mean_score": 0.885,
    "macro_score": 0.457,
    "mean_episode_length": 6.0,
    "invalid_action_rate": 0.0,
    "partial": False,
}


@pytest.mark.parametrize(
    "env, key, headline",
    [
        ("alfworld", "macro_success", "macro success 50.0% (macro_success)"),
        ("webshop", "mean_score", "score 88.5 (mean_score)"),
        ("search", "macro_score", "exact match (average over data sources) 45.7 (macro_score)"),
    ],
)
def test_the_headline_comes_first_and_is_the_environments_own(env: str, key: str, headline: str):
    metrics = headline_metrics(env_class(env), RESULTS)
    assert list(metrics)[:3] == ["env", "headline", key]
    assert metrics["headline"] == headline and metrics[key] == RESULTS[key]
    # the other figures stay, each once
    assert {"macro_success", "micro_success", "mean_score", "partial"} <= set(metrics)
