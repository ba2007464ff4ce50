"""Play episodes of any registered environment with a policy: collect, eval and rl all use this loop.

Every active episode advances together: one batched generation call per turn across all of them, and the episodes
are stepped in parallel worker processes (`seedcli.envs.pool.EnvPool`). The environment (`pool.env`) renders the
prompt, parses the action and sets the reward convention; nothing here knows which environment it plays. A finished episode is handed to `on_done` at once, so the caller can
append it to disk and a crash loses only episodes still in play.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from seedcli.engines.base import IMAGE_PLACEHOLDER, content_parts
from seedcli.envs import get_env
from seedcli.envs.base import Environment, StepResult, Task
from seedcli.envs.pool import EnvPool
from seedcli.images import ImageStore, decode_png
from seedcli.records import Trajectory, Turn


@dataclass
class Generated:
    """One response of a policy for one turn."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"


@dataclass(init=False)
class EpisodeSpec:
    """Which task to play, and the ids the trajectory will carry."""

    episode_id: str
    group_id: str
    task: Task

    def __init__(self, episode_id: str, group_id: str, task: Task | None = None, *, game: Task | None = None):
        if (task is None) == (game is None):
            raise TypeError("EpisodeSpec needs exactly one of task= (or its old name game=)")
        self.episode_id, self.group_id, self.task = episode_id, group_id, task if task is not None else game

    @property
    def game(self) -> Task:
        """Old name of `task` (ALFWorld games)."""
        return self.task


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
        # a vision-language engine sees each turn's image where the prompt's <image> placeholder stands; a text-only
        # engine reads the prompt as it is
        vision = bool(getattr(self.engine, "vision", False))
        images = [turn_images(p, ep.last) for p, ep in zip(prompts, episodes, strict=True)] if vision else None
        ids = [self.engine.render([{"role": "user", "content": content_parts(p) if vision else p}]) for p in prompts]
        out: list[Generated] = []
        s = self.settings
        # one seed per request from (run seed, episode, turn): batch size, worker count and resume never change a sample
        seeds = [_derive_seed(s.seed, ep.spec.episode_id, len(ep.turns)) for ep in episodes]
        for start in range(0, len(ids), self.gen_batch):
            extra = {"images": images[start : start + self.gen_batch]} if images is not None else {}
            completions = self.engine.generate(
                ids[start : start + self.gen_batch],
                temperature=s.temperature,
                top_p=s.top_p,
                max_new_tokens=s.max_new_tokens,
                seeds=seeds[start : start + self.gen_batch],
                **extra,
            )
            out.extend(Generated(c.text, list(c.token_ids), list(c.logprobs), c.finish_reason) for c in completions)
        return out


class ExpertPolicy:
    """Plays the environment's expert: proves the harness (a correct harness wins every game it can win)."""

    name = "expert"

    def __init__(self, env: Environment | None = None):
        self.env = env or get_env("alfworld")

    def act(self, prompts: Sequence[str], episodes: Sequence[_Episode], call: int) -> list[Generated]:
        return [Generated(self.env.expert_response(ep.last)) for ep in episodes]


class RandomPolicy:
    """A random valid action each turn (the environment decides what that is): the floor."""

    name = "random"

    def __init__(self, seed: int = 0, env: Environment | None = None):
        self.seed = seed
        self.env = env or get_env("alfworld")

    def act(self, prompts: Sequence[str], episodes: Sequence[_Episode], call: int) -> list[Generated]:
        out = []
        for ep in episodes:
            rng = random.Random(_derive_seed(self.seed, ep.spec.episode_id, len(ep.turns)))
            out.append(Generated(self.env.random_response(ep.last, rng)))
        return out


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


def play_episodes(
    specs: Sequence[EpisodeSpec],
    policy: Policy,
    pool: EnvPool,
    settings: RolloutSettings,
    meta: dict,
    on_done: Callable[[Trajectory], None],
    max_active: int = 64,
    images: ImageStore | None = None,
) -> int:
    """Play `specs` with at most `max_active` episodes open at once in `pool` (its `env` renders prompts, parses
    actions and sets rewards); `meta` fills the trajectory's engine/model fields. Returns the number played.
    Observation images (visual environments) go to `images` (default: kept in memory) and turns refer to them by
    sha256."""
    env = pool.env
    images = images if images is not None else ImageStore(None)
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
            results = pool.reset_many([(ep.slot, ep.spec.task) for ep in opening])
            for ep, res in zip(opening, results, strict=True):
                ep.last = res
                ep.task = res.task
            active.extend(opening)

        prompts = [
            env.render_prompt(
                ep.task, ep.last.observation, ep.last.admissible, len(ep.turns) + 1, ep.history, settings.history
            )
            for ep in active
        ]
        generated = policy.act(prompts, active, call)
        call += 1
        actions = []
        for ep, prompt, gen in zip(active, prompts, generated, strict=True):
            action, valid = env.parse_action(gen.text)
            admissible = ep.last.admissible
            ep.turns.append(
                Turn(
                    step=len(ep.turns) + 1,
                    observation=ep.last.observation,
                    admissible=[a for a in admissible if a != "help"] if admissible is not None else [],
                    prompt=prompt,
                    response=gen.text,
                    response_ids=gen.token_ids,
                    logprobs=[round(x, 6) for x in gen.logprobs],
                    action=action,
                    valid=valid,
                    admissible_action=action in admissible if admissible is not None else valid,
                    finish_reason=gen.finish_reason,
                    image=images.put(ep.last.image) if ep.last.image is not None else None,
                )
            )
            actions.append((ep.slot, action))
        results = pool.step_many(actions)
        for ep, res in zip(active, results, strict=True):
            ep.turns[-1].reward = float(res.reward)

        still = []
        for ep, res, (_, action) in zip(active, results, actions, strict=True):
            ep.history.append((ep.last.observation, action))
            ep.last = res
            if res.won or res.done or len(ep.turns) >= settings.max_steps:
                ep.won = bool(res.won)
                on_done(_to_trajectory(ep, env, settings, meta))
                played += 1
                free_slots.append(ep.slot)
            else:
                still.append(ep)
        active = still
    return played


def _to_trajectory(ep: _Episode, env: Environment, settings: RolloutSettings, meta: dict) -> Trajectory:
    score = min(1.0, max(0.0, float(ep.last.score))) if ep.last is not None else 0.0
    return Trajectory(
        episode_id=ep.spec.episode_id,
        group_id=ep.spec.group_id,
        env=env.name,
        task_id=ep.spec.task.task_id,
        split=ep.spec.task.split,
        category=ep.spec.task.category,
        task=ep.task,
        turns=ep.turns,
        won=ep.won,
        score=score,
        reward=env.success_reward if ep.won else 0.0,
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
        prompt_version=env.prompt_version,
        seed=settings.seed,
        policy=meta.get("policy", "model"),
    )


def episode_metrics(episodes: Sequence[Trajectory]) -> dict:
    """Summary shared by collect, eval and rl: success (and score) per category, length, invalid rate, tokens.
    The `*_by_type` keys are per category (ALFWorld: task type)."""
    from collections import defaultdict

    by_type: dict[str, list[bool]] = defaultdict(list)
    turns = invalid = tokens = 0
    for ep in episodes:
        by_type[ep.category].append(ep.won)
        turns += len(ep.turns)
        invalid += ep.invalid_turns
        tokens += sum(len(t.response_ids) for t in ep.turns)
    n = len(episodes)
    out = {
        "episodes": n,
        "success_rate": sum(ep.won for ep in episodes) / n if n else 0.0,
        "mean_score": sum(ep.score for ep in episodes) / n if n else 0.0,
        "success_by_type": {k: sum(v) / len(v) for k, v in sorted(by_type.items())},
        "episodes_by_type": {k: len(v) for k, v in sorted(by_type.items())},
        "mean_length": sum(ep.length for ep in episodes) / n if n else 0.0,
        "invalid_rate": invalid / turns if turns else 0.0,
        "tokens_generated": tokens,
    }
    return out
