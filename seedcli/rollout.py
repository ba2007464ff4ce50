"""Play episodes of any registered environment with a policy: collect, eval and rl all use this loop.

Two schedules, the same trajectories in fp32 (every request carries its own seed; vLLM on CUDA draws each request's
noise from (seed, position)); in bf16 the logits depend on the batch make-up, so a near-tie can part the two unless
vLLM runs batch-invariant kernels (`scripts/gpu_smoke.py` reports the share of identical trajectories):
- `async` (the default): each episode sends its next request as soon as its own environment step has returned; the
  engine decodes whatever requests are waiting, continuously (the hf engine's `ContinuousBatcher`: a finished reply
  leaves the batch at once and a waiting one takes its row), and the environment steps run in a thread, in the
  worker processes, while the engine generates for other episodes. An engine without continuous batching (vLLM
  here, a vision-language model) gets the requests that are ready, as one `generate` call.
- `lockstep`: every active episode advances together: one batched generation call per turn, which returns when its
  longest reply is done, then one parallel environment step for all.

Episodes are stepped in parallel worker processes (`seedcli.envs.pool.EnvPool`). The environment (`pool.env`)
renders the prompt, parses the action and sets the reward convention; nothing here knows which environment it plays.
A finished episode is handed to `on_done` at once, so the caller can append it to disk and a crash loses only
episodes still in play.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Protocol

from seedcli.engines.base import IMAGE_PLACEHOLDER, content_parts
from seedcli.engines.scheduling import Request, generate_requests, make_scheduler
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


@dataclass
class EpisodeSpec:
    """Which task to play, and the ids the trajectory will carry."""

    episode_id: str
    group_id: str
    task: Task


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

    def request(self, ep: _Episode, prompt: str) -> Request:
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

    def act(self, prompts: Sequence[str], episodes: Sequence[_Episode], call: int) -> list[Generated]:
        requests = [self.request(ep, p) for p, ep in zip(prompts, episodes, strict=True)]
        completions, steps = generate_requests(self.engine, requests, self.gen_batch)
        self.steps += steps
        return [Generated(c.text, list(c.token_ids), list(c.logprobs), c.finish_reason) for c in completions]


class _ActScheduler:
    """A policy without an engine (the expert, the random policy): the waiting turns, answered at once."""

    def __init__(self, policy: Any):
        self.policy = policy
        self.waiting: list[tuple[_Episode, str]] = []
        self.calls = 0
        self.steps = 0

    @property
    def busy(self) -> bool:
        return bool(self.waiting)

    def submit(self, ep: _Episode, prompt: str) -> None:
        self.waiting.append((ep, prompt))

    def step(self) -> list[tuple[_Episode, str, Generated]]:
        ready, self.waiting = self.waiting, []
        generated = self.policy.act([p for _, p in ready], [ep for ep, _ in ready], self.calls)
        self.calls += 1
        return [(ep, p, g) for (ep, p), g in zip(ready, generated, strict=True)]


class _EngineTurns:
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

    def submit(self, ep: _Episode, prompt: str) -> None:
        self.scheduler.submit(self.policy.request(ep, prompt))

    def follow(self, request: Request) -> None:
        """A finished episode's follow-up request, tagged apart from the turns."""
        request.tag = (_FOLLOW_UP, request.tag)
        self.scheduler.submit(request)

    def step(self) -> list[tuple[_Episode, str, Generated]]:
        out = []
        for tag, c in self.scheduler.step():
            if tag[0] is _FOLLOW_UP:
                for request in self.followups.land(tag[1], c):
                    self.follow(request)
                continue
            ep, prompt = tag
            out.append((ep, prompt, Generated(c.text, list(c.token_ids), list(c.logprobs), c.finish_reason)))
        return out


_FOLLOW_UP = object()  # the tag of a follow-up request (never an episode)


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
    followups: Any = None,
) -> int:
    """Play `specs` with at most `max_active` episodes open at once in `pool` (its `env` renders prompts, parses
    actions and sets rewards), on `settings.rollout`'s schedule; `meta` fills the trajectory's engine/model fields.
    Returns the number played. Observation images (visual environments) go to `images` (default: kept in memory)
    and turns refer to them by sha256.

    `followups` (a model policy only): requests a finished episode makes of the same engine — `first(trajectory)`,
    then `land(tag, completion)` for more (SEED's self-analysis and its retry, `SelfAnalysis`). Async serves them
    as soon as the episode ends, among the other episodes' turns; lockstep after the last episode."""
    images = images if images is not None else ImageStore(None)
    play = _play_async if settings.rollout == "async" else _play_lockstep
    return play(_Loop(specs, pool, settings, meta, on_done, max_active, images), policy, followups)


class _Loop:
    """What both schedules share: the queue of episodes to open, the free slots, and turn bookkeeping."""

    def __init__(self, specs, pool, settings, meta, on_done, max_active, images):
        self.env: Environment = pool.env
        self.pool, self.settings, self.meta, self.on_done, self.images = pool, settings, meta, on_done, images
        self.queue = list(specs)
        self.free_slots = list(range(max_active))[::-1]
        self.played = 0

    def opening(self) -> list[_Episode]:
        out = []
        while self.queue and self.free_slots:
            out.append(_Episode(spec=self.queue.pop(0), slot=self.free_slots.pop()))
        return out

    def reset(self, opening: list[_Episode]) -> list[StepResult]:
        """Resets are the slow part: one parallel batch."""
        return self.pool.reset_many([(ep.slot, ep.spec.task) for ep in opening])

    def started(self, ep: _Episode, res: StepResult) -> None:
        ep.last = res
        ep.task = res.task

    def prompt(self, ep: _Episode) -> str:
        s = self.settings
        return self.env.render_prompt(
            ep.task, ep.last.observation, ep.last.admissible, len(ep.turns) + 1, ep.history, s.history
        )

    def record(self, ep: _Episode, prompt: str, gen: Generated) -> tuple[int, str]:
        """The turn of `gen`, appended to the episode; returns (slot, action) for the environment step."""
        action, valid = self.env.parse_action(gen.text)
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
                image=self.images.put(ep.last.image) if ep.last.image is not None else None,
            )
        )
        return ep.slot, action

    def stepped(self, ep: _Episode, action: str, res: StepResult) -> bool:
        """Apply a step's result; True when the episode is over (then handed to `on_done`, its slot freed)."""
        ep.turns[-1].reward = float(res.reward)
        ep.history.append((ep.last.observation, action))
        ep.last = res
        if res.won or res.done or len(ep.turns) >= self.settings.max_steps:
            ep.won = bool(res.won)
            self.on_done(_to_trajectory(ep, self.env, self.settings, self.meta))
            self.played += 1
            self.free_slots.append(ep.slot)
            return True
        return False


def _play_lockstep(loop: _Loop, policy: Policy, followups: Any = None) -> int:
    """Every active episode advances together: one batched generation call per turn, then one step for all; the
    follow-up requests of all episodes after the last one ends."""
    finished: list[Trajectory] = []
    if followups is not None:
        on_done = loop.on_done
        loop.on_done = lambda traj: (finished.append(traj), on_done(traj))
    active: list[_Episode] = []
    call = 0
    while loop.queue or active:
        opening = loop.opening()
        if opening:
            for ep, res in zip(opening, loop.reset(opening), strict=True):
                loop.started(ep, res)
            active.extend(opening)
        prompts = [loop.prompt(ep) for ep in active]
        generated = policy.act(prompts, active, call)
        call += 1
        actions = [loop.record(ep, p, g) for ep, p, g in zip(active, prompts, generated, strict=True)]
        results = loop.pool.step_many(actions)
        active = [
            ep for ep, res, (_, a) in zip(active, results, actions, strict=True) if not loop.stepped(ep, a, res)
        ]
    if followups is not None:
        requests = [r for traj in finished for r in followups.first(traj)]
        while requests:
            completions, steps = generate_requests(policy.engine, requests, policy.gen_batch)
            policy.steps += steps
            requests = [n for r, c in zip(requests, completions, strict=True) for n in followups.land(r.tag, c)]
    return loop.played


def _play_async(loop: _Loop, policy: Any, followups: Any = None) -> int:
    """Each episode sends its next request when its own step has returned; the engine decodes continuously while
    a thread steps the environments (the pool is used from that thread only). A finished episode's follow-up
    requests enter the same engine at once."""
    scheduler = _EngineTurns(policy) if isinstance(policy, ModelPolicy) else _ActScheduler(policy)
    inflight: list[Future] = []
    if followups is not None and not isinstance(policy, ModelPolicy):
        raise ValueError("follow-up requests need a model policy (an engine to serve them)")
    if followups is not None:
        on_done = loop.on_done

        def done_then_follow(traj: Trajectory) -> None:
            on_done(traj)
            for request in followups.first(traj):
                scheduler.follow(request)

        loop.on_done = done_then_follow
        scheduler.followups = followups
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="env")

    def open_new() -> None:
        opening = loop.opening()
        if opening:
            inflight.append(executor.submit(lambda: ("reset", opening, loop.reset(opening))))

    def land(kind: str, items: list, results: list[StepResult]) -> None:
        for item, res in zip(items, results, strict=True):
            if kind == "reset":
                loop.started(item, res)
                scheduler.submit(item, loop.prompt(item))
            elif not loop.stepped(item[0], item[1], res):
                scheduler.submit(item[0], loop.prompt(item[0]))

    try:
        open_new()
        while inflight or scheduler.busy:
            if inflight and not scheduler.busy:  # nothing to decode: wait for an environment
                wait(inflight, return_when=FIRST_COMPLETED)
            for future in [f for f in inflight if f.done()]:
                inflight.remove(future)
                land(*future.result())
            if scheduler.busy:
                decided = [(ep, loop.record(ep, p, g)) for ep, p, g in scheduler.step()]
                if decided:
                    batch = [(ep, action) for ep, (_, action) in decided]
                    actions = [slot_action for _, slot_action in decided]
                    inflight.append(executor.submit(lambda b=batch, a=actions: ("step", b, loop.pool.step_many(a))))
            open_new()
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
        if isinstance(policy, ModelPolicy):
            policy.steps += scheduler.steps
    return loop.played


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
