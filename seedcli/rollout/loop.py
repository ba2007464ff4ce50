"""The rollout loop: `play_episodes` on the async or the lockstep schedule (the package docstring), the finished
episode as a `Trajectory`, and the summary collect, eval and rl share (`episode_metrics`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from seedcli.engines.scheduling import generate_requests
from seedcli.envs.base import Environment, StepResult
from seedcli.envs.pool import EnvPool
from seedcli.images import ImageStore
from seedcli.records import Trajectory, Turn
from seedcli.rollout.episode import EpisodeSpec, EpisodeState, Generated, RolloutSettings
from seedcli.rollout.policies import ActScheduler, EngineTurns, ModelPolicy, Policy


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

    def opening(self) -> list[EpisodeState]:
        out = []
        while self.queue and self.free_slots:
            out.append(EpisodeState(spec=self.queue.pop(0), slot=self.free_slots.pop()))
        return out

    def reset(self, opening: list[EpisodeState]) -> list[StepResult]:
        """Resets are the slow part: one parallel batch."""
        return self.pool.reset_many([(ep.slot, ep.spec.task) for ep in opening])

    def started(self, ep: EpisodeState, res: StepResult) -> None:
        ep.last = res
        ep.task = res.task

    def prompt(self, ep: EpisodeState) -> str:
        s = self.settings
        text = self.env.render_prompt(
            ep.task, ep.last.observation, ep.last.admissible, len(ep.turns) + 1, ep.history, s.history
        )
        return self.env.insert_skill(text, ep.spec.skill) if ep.spec.skill else text

    def record(self, ep: EpisodeState, prompt: str, gen: Generated) -> tuple[int, str]:
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

    def stepped(self, ep: EpisodeState, action: str, res: StepResult) -> bool:
        """Apply a step's result; True when the episode is over (then handed to `on_done`, its slot freed). A step
        whose `info` says `invalid` (the game refused the move) makes its turn invalid, as an unreadable reply is."""
        ep.turns[-1].reward = float(res.reward)
        if res.info.get("invalid"):
            ep.turns[-1].valid = ep.turns[-1].admissible_action = False
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
    active: list[EpisodeState] = []
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
        active = [ep for ep, res, (_, a) in zip(active, results, actions, strict=True) if not loop.stepped(ep, a, res)]
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
    scheduler = EngineTurns(policy) if isinstance(policy, ModelPolicy) else ActScheduler(policy)
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


def _to_trajectory(ep: EpisodeState, env: Environment, settings: RolloutSettings, meta: dict) -> Trajectory:
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
