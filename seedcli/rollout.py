"""Play ALFWorld episodes with a policy: collect, eval and rl all use this loop.

Every active episode advances together: one batched generation call per turn across all of them, and the games
are stepped in parallel worker processes. A finished episode is handed to `on_done` at once, so the caller can
append it to disk and a crash loses only episodes still in play.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from seedcli.envs.alfworld import EnvPool, Game, StepResult
from seedcli.prompts import AGENT_PROMPT_VERSION, format_response, parse_action, render_agent_prompt
from seedcli.records import Trajectory, Turn


@dataclass
class Generated:
    """One response of a policy for one turn."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"


@dataclass
class EpisodeSpec:
    """Which game to play, and the ids the trajectory will carry."""

    episode_id: str
    group_id: str
    game: Game


@dataclass
class RolloutSettings:
    max_steps: int = 30
    history: int = 5
    temperature: float = 0.4
    top_p: float = 1.0
    max_new_tokens: int = 512
    seed: int = 0


@dataclass
class _Episode:
    spec: EpisodeSpec
    slot: int
    task: str = ""
    last: StepResult | None = None
    history: list[tuple[str, str]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    won: bool = False


class Policy(Protocol):
    """Decides one response per active episode."""

    name: str

    def act(self, prompts: Sequence[str], episodes: Sequence[_Episode], call: int) -> list[Generated]: ...


class ModelPolicy:
    """A language model through an engine (hf or vllm): prompts rendered with the chat template, generated in batches."""

    name = "model"

    def __init__(self, engine, settings: RolloutSettings, gen_batch: int = 64):
        self.engine = engine
        self.settings = settings
        self.gen_batch = gen_batch

    def act(self, prompts: Sequence[str], episodes: Sequence[_Episode], call: int) -> list[Generated]:
        ids = [self.engine.render([{"role": "user", "content": p}]) for p in prompts]
        out: list[Generated] = []
        s = self.settings
        for start in range(0, len(ids), self.gen_batch):
            completions = self.engine.generate(
                ids[start : start + self.gen_batch],
                temperature=s.temperature,
                top_p=s.top_p,
                max_new_tokens=s.max_new_tokens,
                seed=_derive_seed(s.seed, call, start),
            )
            out.extend(Generated(c.text, list(c.token_ids), list(c.logprobs), c.finish_reason) for c in completions)
        return out


class ExpertPolicy:
    """Plays the game's expert plan: proves the harness (a correct harness wins every game)."""

    name = "expert"

    def act(self, prompts: Sequence[str], episodes: Sequence[_Episode], call: int) -> list[Generated]:
        out = []
        for ep in episodes:
            action = (ep.last.expert_action if ep.last else None) or "look"
            out.append(Generated(format_response("I follow the expert plan.", action)))
        return out


class RandomPolicy:
    """A random admissible action each turn: the floor."""

    name = "random"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def act(self, prompts: Sequence[str], episodes: Sequence[_Episode], call: int) -> list[Generated]:
        out = []
        for ep in episodes:
            rng = random.Random(_derive_seed(self.seed, ep.spec.episode_id, len(ep.turns)))
            choices = [a for a in (ep.last.admissible if ep.last else []) if a != "help"] or ["look"]
            out.append(Generated(format_response("I pick a random admissible action.", rng.choice(choices))))
        return out


def _derive_seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "little")


def play_episodes(
    specs: Sequence[EpisodeSpec],
    policy: Policy,
    pool: EnvPool,
    settings: RolloutSettings,
    meta: dict,
    on_done: Callable[[Trajectory], None],
    max_active: int = 64,
) -> int:
    """Play `specs` with at most `max_active` games open at once; `meta` fills the trajectory's engine/model fields.
    Returns the number of episodes played."""
    queue = list(specs)
    active: list[_Episode] = []
    free_slots = list(range(max_active))[::-1]
    call = 0
    played = 0
    while queue or active:
        # open new games into free slots (resets are the slow part: do them in one parallel batch)
        opening = []
        while queue and free_slots:
            opening.append(_Episode(spec=queue.pop(0), slot=free_slots.pop()))
        if opening:
            results = pool.reset_many([(ep.slot, ep.spec.game) for ep in opening])
            for ep, res in zip(opening, results, strict=True):
                ep.last = res
                ep.task = res.task
            active.extend(opening)

        prompts = [
            render_agent_prompt(
                ep.task, ep.last.observation, ep.last.admissible, len(ep.turns) + 1, ep.history, settings.history
            )
            for ep in active
        ]
        generated = policy.act(prompts, active, call)
        call += 1
        actions = []
        for ep, prompt, gen in zip(active, prompts, generated, strict=True):
            action, valid = parse_action(gen.text)
            ep.turns.append(
                Turn(
                    step=len(ep.turns) + 1,
                    observation=ep.last.observation,
                    admissible=[a for a in ep.last.admissible if a != "help"],
                    prompt=prompt,
                    response=gen.text,
                    response_ids=gen.token_ids,
                    logprobs=[round(x, 6) for x in gen.logprobs],
                    action=action,
                    valid=valid,
                    admissible_action=action in ep.last.admissible,
                    finish_reason=gen.finish_reason,
                )
            )
            actions.append((ep.slot, action))
        results = pool.step_many(actions)

        still = []
        for ep, res, (_, action) in zip(active, results, actions, strict=True):
            ep.history.append((ep.last.observation, action))
            ep.last = res
            if res.won or res.done or len(ep.turns) >= settings.max_steps:
                ep.won = bool(res.won)
                on_done(_to_trajectory(ep, settings, meta))
                played += 1
                free_slots.append(ep.slot)
            else:
                still.append(ep)
        active = still
    return played


def _to_trajectory(ep: _Episode, settings: RolloutSettings, meta: dict) -> Trajectory:
    return Trajectory(
        episode_id=ep.spec.episode_id,
        group_id=ep.spec.group_id,
        game_file=ep.spec.game.game_file,
        split=ep.spec.game.split,
        task_type=ep.spec.game.task_type,
        task=ep.task,
        turns=ep.turns,
        won=ep.won,
        reward=10.0 if ep.won else 0.0,
        length=len(ep.turns),
        engine=meta.get("engine", ""),
        model_id=meta.get("model_id", ""),
        model_hash=meta.get("model_hash", ""),
        sampling={
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "max_new_tokens": settings.max_new_tokens,
            "max_steps": settings.max_steps,
            "history": settings.history,
        },
        prompt_version=AGENT_PROMPT_VERSION,
        seed=settings.seed,
        policy=meta.get("policy", "model"),
    )


def episode_metrics(episodes: Sequence[Trajectory]) -> dict:
    """Summary shared by collect, eval and rl: success per task type, length, invalid rate, tokens."""
    from collections import defaultdict

    by_type: dict[str, list[bool]] = defaultdict(list)
    turns = invalid = tokens = 0
    for ep in episodes:
        by_type[ep.task_type].append(ep.won)
        turns += len(ep.turns)
        invalid += ep.invalid_turns
        tokens += sum(len(t.response_ids) for t in ep.turns)
    n = len(episodes)
    out = {
        "episodes": n,
        "success_rate": sum(ep.won for ep in episodes) / n if n else 0.0,
        "success_by_type": {k: sum(v) / len(v) for k, v in sorted(by_type.items())},
        "episodes_by_type": {k: len(v) for k, v in sorted(by_type.items())},
        "mean_length": sum(ep.length for ep in episodes) / n if n else 0.0,
        "invalid_rate": invalid / turns if turns else 0.0,
        "tokens_generated": tokens,
    }
    return out
