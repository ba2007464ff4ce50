"""What a rollout is made of: a policy's response (`Generated`), the task to play (`EpisodeSpec`), the sampling and
schedule (`RolloutSettings`), an episode in play (`EpisodeState`), a turn's images and the per-turn seed."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from seedcli.engines.base import IMAGE_PLACEHOLDER
from seedcli.envs.base import StepResult, Task
from seedcli.images import decode_png
from seedcli.records import Turn


@dataclass
class Generated:
    """One response of a policy for one turn."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"


@dataclass
class EpisodeSpec:
    """Which task to play, and the ids the trajectory will carry."""

    episode_id: str
    group_id: str
    task: Task
    skill: str | None = None  # a skill block in every turn's prompt (`seed probe`'s skill-conditioned play); None: none


@dataclass
class RolloutSettings:
    max_steps: int = 30
    history: int = 5
    temperature: float = 0.4
    top_p: float = 1.0
    max_new_tokens: int = 512
    seed: int = 0
    rollout: str = "async"  # async | lockstep (module docstring)


@dataclass
class EpisodeState:
    """An episode in play: its slot in the pool, the last step's result, its history and turns so far."""

    spec: EpisodeSpec
    slot: int
    task: str = ""
    last: StepResult | None = None
    history: list[tuple[str, str]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    won: bool = False


def turn_images(prompt: str, result: StepResult | None) -> list:
    """The images of one turn's request: the observation image once per `<image>` placeholder of its prompt (the
    environments' visual prompts show the current image only). A placeholder without an image is an error."""
    wanted = prompt.count(IMAGE_PLACEHOLDER)
    if not wanted:
        return []
    if result is None or result.image is None:
        raise ValueError("the prompt asks for an image but the environment sent none (observation mode text?)")
    return [decode_png(result.image)] * wanted


def _derive_seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "little")
