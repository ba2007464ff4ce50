"""The policies a rollout plays with: a model through an engine, the environment's expert, a random valid action;
and the two schedulers the async loop drives them by (engine turns, answered-at-once turns)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Protocol

from seedcli.engines.base import content_parts
from seedcli.engines.scheduling import Request, generate_requests, make_scheduler
from seedcli.envs import get_env
from seedcli.envs.base import Environment
from seedcli.rollout.episode import EpisodeState, Generated, RolloutSettings, _derive_seed, turn_images

_FOLLOW_UP = object()  # the tag of a follow-up request (never an episode)


class Policy(Protocol):
    """Decides one response per active episode."""

    name: str

    def act(self, prompts: Sequence[str], episodes: Sequence[EpisodeState], call: int) -> list[Generated]: ...


class ModelPolicy:
    """A language model through an engine (hf or vllm): prompts rendered with the chat template, each turn a
    `Request` with its own seed (`seedcli.engines.scheduling`)."""

    name = "model"

    def __init__(self, engine, settings: RolloutSettings, gen_batch: int = 64, lengths: Any = None):
        self.engine = engine
        self.settings = settings
        self.gen_batch = gen_batch
        # the rollout bench forces each request's length: `lengths(seed) -> tokens` (stop tokens never drawn)
        self.lengths = lengths
        self.steps = 0  # decode iterations of the lockstep calls (an async loop counts its scheduler's)

    def request(self, ep: EpisodeState, prompt: str) -> Request:
        """This turn's request. Its seed comes from (run seed, episode, turn): batch size, schedule, worker count
        and resume never change a sample. A vision-language engine sees the turn's image where the prompt's
        <image> placeholder stands; a text-only engine reads the prompt as it is."""
        s = self.settings
        vision = bool(getattr(self.engine, "vision", False))
        ids = self.engine.render([{"role": "user", "content": content_parts(prompt) if vision else prompt}])
        seed = _derive_seed(s.seed, ep.spec.episode_id, len(ep.turns))
        forced = self.lengths(seed) if self.lengths is not None else None
        return Request(
            tag=(ep, prompt),
            ids=list(ids),
            seed=seed,
            temperature=s.temperature,
            top_p=s.top_p,
            max_new_tokens=forced if forced is not None else s.max_new_tokens,
            images=turn_images(prompt, ep.last) if vision else [],
            ban_stop=forced is not None,
        )

    def scheduler(self) -> Any:
        return make_scheduler(self.engine, self.gen_batch)

    def act(self, prompts: Sequence[str], episodes: Sequence[EpisodeState], call: int) -> list[Generated]:
        requests = [self.request(ep, p) for p, ep in zip(prompts, episodes, strict=True)]
        completions, steps = generate_requests(self.engine, requests, self.gen_batch)
        self.steps += steps
        return [Generated(c.text, list(c.token_ids), list(c.logprobs), c.finish_reason) for c in completions]


class ActScheduler:
    """A policy without an engine (the expert, the random policy): the waiting turns, answered at once."""

    def __init__(self, policy: Any):
        self.policy = policy
        self.waiting: list[tuple[EpisodeState, str]] = []
        self.calls = 0
        self.steps = 0

    @property
    def busy(self) -> bool:
        return bool(self.waiting)

    def submit(self, ep: EpisodeState, prompt: str) -> None:
        self.waiting.append((ep, prompt))

    def step(self) -> list[tuple[EpisodeState, str, Generated]]:
        ready, self.waiting = self.waiting, []
        generated = self.policy.act([p for _, p in ready], [ep for ep, _ in ready], self.calls)
        self.calls += 1
        return [(ep, p, g) for (ep, p), g in zip(ready, generated, strict=True)]


class EngineTurns:
    """The model policy's turns through an engine scheduler (continuous or ready batches)."""

    def __init__(self, policy: ModelPolicy):
        self.policy = policy
        self.scheduler = policy.scheduler()
        self.followups: Any = None

    @property
    def busy(self) -> bool:
        return self.scheduler.busy

    @property
    def steps(self) -> int:
        return self.scheduler.steps

    def submit(self, ep: EpisodeState, prompt: str) -> None:
        self.scheduler.submit(self.policy.request(ep, prompt))

    def follow(self, request: Request) -> None:
        """A finished episode's follow-up request, tagged apart from the turns."""
        request.tag = (_FOLLOW_UP, request.tag)
        self.scheduler.submit(request)

    def step(self) -> list[tuple[EpisodeState, str, Generated]]:
        out = []
        for tag, c in self.scheduler.step():
            if tag[0] is _FOLLOW_UP:
                for request in self.followups.land(tag[1], c):
                    self.follow(request)
                continue
            ep, prompt = tag
            out.append((ep, prompt, Generated(c.text, list(c.token_ids), list(c.logprobs), c.finish_reason)))
        return out


class ExpertPolicy:
    """Plays the environment's expert: proves the harness (a correct harness wins every game it can win)."""

    name = "expert"

    def __init__(self, env: Environment | None = None):
        self.env = env or get_env("alfworld")

    def act(self, prompts: Sequence[str], episodes: Sequence[EpisodeState], call: int) -> list[Generated]:
        return [Generated(self.env.expert_response(ep.last)) for ep in episodes]


class RandomPolicy:
    """A random valid action each turn (the environment decides what that is): the floor."""

    name = "random"

    def __init__(self, seed: int = 0, env: Environment | None = None):
        self.seed = seed
        self.env = env or get_env("alfworld")

    def act(self, prompts: Sequence[str], episodes: Sequence[EpisodeState], call: int) -> list[Generated]:
        out = []
        for ep in episodes:
            rng = random.Random(_derive_seed(self.seed, ep.spec.episode_id, len(ep.turns)))
            out.append(Generated(self.env.random_response(ep.last, rng)))
        return out
