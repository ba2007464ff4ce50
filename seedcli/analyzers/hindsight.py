"""The offline `hindsight` analyzer: the stand-in for GLM, written from the environment's expert.

Each episode is played again against the environment's expert (`Environment.hindsight_skill`,
`seedcli/envs/hindsight.py`): the turn where it left the expert's path, or the one that decided a win, what the
expert did there and a rule that carries to other tasks. Privileged, as GLM reading the outcome is; the skill-leak
audit reports how much of each skill names the answer. It answers with the JSON an LLM would write, so the same parser
judges it; an episode the replay does not reproduce (other data, other env options) gets an answer the parser
rejects, saying why.
"""

from __future__ import annotations

import json
import threading

from seedcli.analyzers import AnalyzerResponse
from seedcli.envs.hindsight import ReplayMismatch


class HindsightAnalyzer:
    """The analyzer behind `--analyzer hindsight`, for one environment built as the episodes' run built it (its data
    root and options: the replay must be the episode)."""

    name = "hindsight"
    batched = False

    def __init__(self, env):
        self.env = env
        self.model = env.hindsight_version  # the identity in annotate's cache keys
        self._lock = threading.Lock()  # the environment's games run one at a time (TextWorld is not thread-safe)

    def analyze(self, messages: list[dict], trajectory=None) -> AnalyzerResponse:  # noqa: ARG002 - common interface
        if trajectory is None:
            raise ValueError("the hindsight analyzer replays the trajectory itself; pass it")
        with self._lock:
            try:
                summary, skill = self.env.hindsight_skill(trajectory)
            except ReplayMismatch as exc:
                return AnalyzerResponse(text=f"no hindsight skill: {exc}")
        return AnalyzerResponse(text=json.dumps({"episode_summary": summary, "episode_skill": skill}))

    def analyze_batch(self, conversations, trajectories=None) -> list[AnalyzerResponse]:
        return [
            self.analyze(m, t) for m, t in zip(conversations, trajectories or [None] * len(conversations), strict=True)
        ]

    def close(self) -> None:
        pass
