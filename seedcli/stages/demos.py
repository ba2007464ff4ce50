"""The expert's demonstrations for the warm start (`seedcli/stages/warmstart.py`) and the training examples made from
them: the environment's expert plays its training tasks with noise injection, every turn labelled with the expert's
action at that state; acting examples are the agent prompt → the labelled response, skill-writing examples the
analysis prompt → the rules analyzer's JSON, both rendered exactly as the rollout engines and rl's self-analyzer
render them.

Demonstrations are cached (`$SEEDCLI_CACHE`, default ~/.cache/seedcli/expert-demos/): resets cost 1-5 s a game.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import sys
import time
from pathlib import Path

from pydantic import BaseModel

from seedcli.analyzers import analysis_messages
from seedcli.engines.base import render_chat, stop_token_ids
from seedcli.envs import get_env
from seedcli.envs.alfworld.data import list_games, resolve_data_root, select_games
from seedcli.envs.alfworld.pool import EnvPool
from seedcli.envs.alfworld.projection import format_response
from seedcli.envs.alfworld.prompt import AGENT_PROMPT_VERSION
from seedcli.envs.alfworld.rules import parse_goal
from seedcli.envs.pool import EnvPool as GenericPool
from seedcli.prompts import analysis_turns, render_analysis_prompt
from seedcli.records import JsonlWriter, Trajectory, iter_jsonl
from seedcli.rollout import EpisodeSpec, Generated, RolloutSettings, _derive_seed, play_episodes


def default_cache_dir() -> Path:
    """Where expert demonstrations are cached: $SEEDCLI_CACHE/expert-demos or ~/.cache/seedcli/expert-demos."""
    base = os.environ.get("SEEDCLI_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "seedcli")
    return Path(base) / "expert-demos"


def log(msg: str) -> None:
    """One `[warm-start]` progress line on stderr (stdout is kept for `--json`)."""
    print(f"[warm-start] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------- demonstrations


THINK = "I follow the expert plan."  # the think of a demonstration turn whose task names no object


def demo_thinks(traj: Trajectory) -> list[str]:
    """A short template thought per turn that spells out the one fact the action hinges on: whether the agent holds
    the task's object, sees it here, or is still looking for it ("I see the tomato here."). It is computed from what
    the prompt shows (the task line, the current observation, the pick-up/put messages), so a model can learn to
    write it; once written, the object's name sits right before the action (a 1.3M-parameter clone with a constant
    thought walked past the tomato it was looking for)."""
    obj = parse_goal(traj.task).obj
    if not obj:
        return [THINK] * len(traj.turns)
    seen = re.compile(rf"\b{re.escape(obj)} \d+\b")
    picked = re.compile(rf"^You pick up the {re.escape(obj)} \d+\b")
    placed = re.compile(rf"^You (?:move|put) the {re.escape(obj)} \d+\b")
    holding, out = False, []
    for turn in traj.turns:
        if picked.match(turn.observation):
            holding = True
        elif placed.match(turn.observation):
            holding = False
        if holding:
            out.append(f"I have the {obj}.")
        elif seen.search(turn.observation):
            out.append(f"I see the {obj} here.")
        else:
            out.append(f"I look for the {obj}.")
    return out


# bump when the demonstrator changes (part of the cache key); the thoughts are added when examples are built, so
# they are not part of it
DEMO_VERSION = "search-noise-v1"


class DemoEpisode(BaseModel):
    """One demonstration episode: what was played, and the expert's action at each turn's state (None: silent)."""

    trajectory: Trajectory
    labels: list[str | None]


class NoisyExpertPolicy:
    """The searching expert, except that with probability `noise` a turn plays a random admissible action instead
    (never the first turn). `labels[episode_id]` collects the expert's action at every state, played or not."""

    name = "expert"

    def __init__(self, noise: float, seed: int, *, respond=format_response, fallback: str = "look"):
        self.noise = noise
        self.seed = seed
        self.respond = respond  # (think, action) -> response text: the environment's format_response
        self.fallback = fallback  # what a silent expert plays (ALFWorld's "look")
        self.labels: dict[str, list[str | None]] = {}

    def act(self, prompts, episodes, call: int) -> list:
        out = []
        for ep in episodes:
            expert = ep.last.expert_action if ep.last else None
            labels = self.labels.setdefault(ep.spec.episode_id, [])
            labels.append(expert)
            action = expert or self.fallback
            rng = random.Random(_derive_seed(self.seed, "noise", ep.spec.episode_id, len(ep.turns)))
            # a free-text environment (search) lists no admissible actions: its turns are never swapped
            choices = [a for a in ((ep.last.admissible or []) if ep.last else []) if a != action]
            if ep.turns and choices and rng.random() < self.noise:
                action = rng.choice(choices)
            out.append(Generated(self.respond(THINK, action)))
        return out


def expert_demonstrations(
    games: int,
    seed: int = 0,
    *,
    noise: float = 0.2,
    max_steps: int = 40,
    history: int = 5,
    workers: int = 2,
    data_root: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> tuple[list[DemoEpisode], Path]:
    """The searching expert's episodes (with `noise`) on `games` type-balanced training games (the same selection
    rule as collect), played through play_episodes; cached by (games, seed, noise, max_steps, history, prompt version,
    data root). Returns (episodes in game order, cache file)."""
    root = resolve_data_root(data_root)
    chosen = select_games(list_games(root, "train"), games, seed)
    key = {
        "games": [g.game_file for g in chosen],
        "noise": noise,
        "max_steps": max_steps,
        "history": history,
        "prompt": AGENT_PROMPT_VERSION,
        "demo": DEMO_VERSION,
        "root": str(root),
    }
    return _played_demonstrations(
        chosen,
        key,
        f"train-{len(chosen)}g-s{seed}",
        NoisyExpertPolicy(noise, seed),
        lambda: EnvPool(workers, expert="search", data_root=root),
        max_steps=max_steps,
        history=history,
        who="the searching expert",
        model_id="expert-search",
        max_active=max(2 * max(workers, 1), 4),
        cache_dir=cache_dir,
    )


def env_demonstrations(
    env,
    games: int,
    seed: int = 0,
    *,
    noise: float = 0.2,
    max_steps: int | None = None,
    history: int | None = None,
    workers: int = 2,
    cache_dir: str | os.PathLike | None = None,
) -> tuple[list[DemoEpisode], Path]:
    """The expert of any registered environment `env` (an `Environment`, not ALFWorld: `expert_demonstrations`) on
    `games` training tasks chosen by `env.select_tasks` (as collect chooses them), with `noise` as above; cached by
    (environment spec, tasks, noise, max_steps, history, prompt version). `max_steps` and `history` default to the
    environment's. Returns (episodes in task order, cache file)."""
    max_steps = env.max_steps if max_steps is None else max_steps
    history = env.history if history is None else history
    chosen = env.select_tasks(env.list_tasks(env.train_split), games, seed)
    key = {
        "env": env.name,
        "spec": env.spec(),
        "tasks": [t.task_id for t in chosen],
        "noise": noise,
        "max_steps": max_steps,
        "history": history,
        "prompt": env.prompt_version,
        "demo": DEMO_VERSION,
    }
    return _played_demonstrations(
        chosen,
        key,
        f"{env.name}-{len(chosen)}t-s{seed}",
        NoisyExpertPolicy(noise, seed, respond=env.format_response, fallback=""),
        lambda: GenericPool(env, workers, expert=True),
        max_steps=max_steps,
        history=history,
        who=f"the {env.title} expert",
        model_id=f"expert-{env.name}",
        max_active=max(2 * max(workers, 1), 16),
        cache_dir=cache_dir,
    )


def _played_demonstrations(
    chosen: list,
    key: dict,
    stem: str,
    policy: NoisyExpertPolicy,
    open_pool,
    *,
    max_steps: int,
    history: int,
    who: str,
    model_id: str,
    max_active: int,
    cache_dir: str | os.PathLike | None,
) -> tuple[list[DemoEpisode], Path]:
    """The demonstrations of `chosen` tasks: those the cache file `<stem>-<hash of key>.jsonl` holds, and the rest
    played now by `policy` in a pool from `open_pool()` and appended to it. Lockstep: the demonstrations are written
    in the order the episodes end, and that order is part of the data."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{stem}-{digest}.jsonl"
    done: dict[str, DemoEpisode] = {}
    if path.exists():
        for d in iter_jsonl(path, DemoEpisode):
            done[d.trajectory.episode_id] = d
    specs = [EpisodeSpec(episode_id=f"g{i:04d}", group_id=f"g{i:04d}", task=t) for i, t in enumerate(chosen)]
    todo = [s for s in specs if s.episode_id not in done]
    if todo:
        log(f"{who} plays {len(todo)} of {len(specs)} training tasks (noise {policy.noise}; cache: {path})")
        meta = {"engine": "none", "model_id": model_id, "model_hash": "", "policy": "expert"}
        settings = RolloutSettings(
            max_steps=max_steps,
            history=history,
            temperature=0.0,
            max_new_tokens=1,
            seed=policy.seed,
            rollout="lockstep",
        )
        t0 = time.time()
        with open_pool() as pool, JsonlWriter(path) as writer:

            def on_done(traj: Trajectory) -> None:
                labels = policy.labels.pop(traj.episode_id)[: len(traj.turns)]
                demo = DemoEpisode(trajectory=traj, labels=labels)
                writer.write(demo)
                done[traj.episode_id] = demo
                n = len(done)
                if n % 20 == 0 or n == len(specs):
                    won = sum(d.trajectory.won for d in done.values())
                    log(f"  {n}/{len(specs)} expert episodes, {won} won ({time.time() - t0:.0f}s)")

            play_episodes(todo, policy, pool, settings, meta, on_done, max_active=max_active)
    return [done[s.episode_id] for s in specs], path


# ----------------------------------------------------------------------------------------------- training data


def env_or_alfworld(env=None):
    """`env`, or ALFWorld's environment when None (the helpers below default to ALFWorld's warm start)."""
    return env if env is not None else get_env("alfworld")


def demo_examples(demos: list[DemoEpisode], tokenizer, env=None) -> list[tuple[list[int], list[int]]]:
    """Acting examples: (prompt ids, response ids) for every labelled turn of the episodes the expert won, the prompt
    rendered with the chat template exactly as the rollout engines render it; the response is demo_thinks' thought
    and the expert's action at that state, and ends with <|im_end|>, as a generated turn that stopped does. `env`
    (default ALFWorld's): its format_response; outside ALFWorld the thought is the constant THINK."""
    eos = stop_token_ids(tokenizer)[0]
    env = env_or_alfworld(env)
    out = []
    for demo in demos:
        if not demo.trajectory.won:
            continue
        thinks = demo_thinks(demo.trajectory) if env.name == "alfworld" else [THINK] * len(demo.trajectory.turns)
        for turn, label, think in zip(demo.trajectory.turns, demo.labels, thinks, strict=False):
            if not usable(label, turn):
                continue
            if env.name != "alfworld":  # the environment's own reasoning for the expert's move, where it has one
                think = env.demo_thought(demo.trajectory, turn, label) or think
            prompt = render_chat(tokenizer, [{"role": "user", "content": turn.prompt}])
            response = tokenizer.encode(env.format_response(think, label), add_special_tokens=False) + [eos]
            out.append((prompt, response))
    return out


def usable(label: str | None, turn) -> bool:
    """A label worth cloning: admissible (where the turn lists admissible actions: a free-text environment such as
    search lists none, and its expert's action is the label), and not the env's "look" placeholder for a silent expert
    (the hand-coded expert never says "look"; it goes quiet after its own plan fails)."""
    return bool(label) and label != "look" and (not turn.admissible or label in turn.admissible)


def analysis_example_texts(demos: list[DemoEpisode], max_chars: int, env=None) -> list[tuple[str, str]]:
    """Skill-writing examples: (analysis prompt, the rules analyzer's JSON) per demonstration episode, won or lost;
    the prompt is the one rl's self-analyzer renders (`render_analysis_prompt(..., max_chars)`). `env` (default
    ALFWorld's): its analysis description and rules analyzer."""
    env = env_or_alfworld(env)
    out = []
    for demo in demos:
        traj = demo.trajectory
        if not traj.turns:
            continue
        prompt = render_analysis_prompt(
            traj.task, traj.won, analysis_turns(traj), max_chars, description=env.analysis_description
        )
        summary, skill = env.rules_skill(traj)
        out.append((prompt, json.dumps({"episode_summary": summary, "episode_skill": skill})))
    return out


def analysis_examples(pairs: list[tuple[str, str]], tokenizer) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) of skill-writing examples, rendered as PolicyAnalyzer renders its chat."""
    eos = stop_token_ids(tokenizer)[0]
    return [
        (render_chat(tokenizer, analysis_messages(prompt)), tokenizer.encode(answer, add_special_tokens=False) + [eos])
        for prompt, answer in pairs
    ]
