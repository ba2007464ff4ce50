"""The offline `rules` analyzer: a hindsight skill derived from the trajectory itself, without an LLM.

A baseline so the pipeline runs end to end without an API key or a GPU — not the paper's analyzer (GLM-5.2 writes
the paper's skills). Each environment writes its own rule (`Environment.rules_skill`): for a success the workflow of
the decisive actions, for a failure an avoidance rule from what went wrong. ALFWorld's lives in
`seedcli.envs.alfworld.rules`. It answers with the same JSON text an LLM would, so the same parser
judges it.
"""

from __future__ import annotations

import json

from seedcli.analyzers import AnalyzerResponse
from seedcli.envs import get_env

# bump when any environment's generated text changes (it is part of the response cache key)
RULES_VERSION = "rules-v1"


def rules_skill(trajectory) -> tuple[str, str]:
    """(episode_summary, episode_skill) for one trajectory, by its environment's rule."""
    return get_env(getattr(trajectory, "env", "alfworld")).rules_skill(trajectory)


class RulesAnalyzer:
    """The offline analyzer behind `--analyzer rules`: answers with the JSON an LLM would write."""

    name = "rules"
    model = RULES_VERSION
    batched = False

    def analyze(self, messages: list[dict], trajectory=None) -> AnalyzerResponse:  # noqa: ARG002 - common interface
        if trajectory is None:
            raise ValueError("the rules analyzer reads the trajectory itself; pass it")
        summary, skill = rules_skill(trajectory)
        return AnalyzerResponse(text=json.dumps({"episode_summary": summary, "episode_skill": skill}))

    def analyze_batch(self, conversations, trajectories=None) -> list[AnalyzerResponse]:
        return [
            self.analyze(m, t) for m, t in zip(conversations, trajectories or [None] * len(conversations), strict=True)
        ]

    def close(self) -> None:
        pass
