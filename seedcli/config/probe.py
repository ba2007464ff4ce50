"""`seed probe`'s config: which run's episodes to re-score, with which model, which skills, and how many tasks to play
again with each skill in the prompt (seedcli/stages/probe.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from seedcli.config.base import _nohash
from seedcli.config.stages import RolloutConfig


class ProbeConfig(RolloutConfig):
    """`seed probe`: what a skill does to the teacher, measured without training (docs/method-check.md)."""

    from_run: str | None = Field(
        None, description="collect or eval run whose episodes are re-scored (an expert-played one too)"
    )
    skills: str = Field(
        "self",
        description="each episode's own skill: self (the model writes it from the episode, as `seed rl --analyzer "
        "self`) | rules (the environment's rules analyzer) | hindsight (the episode replayed against the environment's "
        "expert) | an annotate run of the same episodes | none",
    )
    episodes: int = Field(64, ge=1, description="episodes re-scored: the run's first N by episode id")
    play: int = Field(
        0,
        ge=0,
        description="tasks played again under each context, with the skill in every turn's prompt, against none "
        "(the skill-conditioned success gap; the own skill is the one written after the run's attempt); 0 = none",
    )
    analyzer_max_new_tokens: int = Field(512, ge=1, description="tokens of the self-written skill JSON (greedy)")
    analysis_max_chars: int = Field(
        24000, ge=1000, description="analysis prompts longer than this drop their oldest steps (as rl's)"
    )
    measure: Literal["contexts", "absorption", "both"] = Field(
        "contexts",
        description="contexts: Δ under each skill context (and --play); absorption: on the run's episodes as a fixed "
        "panel of states (play it with --policy expert), the model's log-prob with no skill of the expert's action "
        "tokens, and the teacher gap ℓ_oracle − ℓ_none on the model's own samples at those states (what distillation "
        "moves, read off the student; absorption.jsonl); both: the two",
    )
    baseline: str | None = Field(
        None,
        description="a probe run with absorption on the same panel (the start model's): each absorption measure is "
        "also given against it, paired by episode, ± its standard error",
    )
    micro_batch_tokens: int = _nohash("tokens per scoring micro-batch (packed by length)", 8192, ge=64)
