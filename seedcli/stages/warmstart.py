"""Warm start: behaviour-clone ALFWorld's searching expert into a tiny model, so that on CPU some games are won and
GRPO / SEED get non-zero rewards to learn from (a random tiny model wins nothing).

    seed model init --preset tiny --out runs/models/agent --warm-start expert --games 240 --epochs 3

The demonstrator is ALFWorld's hand-coded expert playing from the first step (EnvPool(expert="search")): it does not
know where anything is and searches the receptacles where the object class can be, so its choices depend only on
what the agent sees. (A clone of the stored walkthroughs walks to where the object was in its own game: it won 37.5%
of its training episodes and 0 of 140 seen games.) With probability `noise` a turn executes a random admissible
action instead (DART-style noise injection); every turn is labelled with the expert's action *at that state*, so the
clone also sees how to recover from states the expert alone never visits.

Two kinds of examples, both rendered exactly as the rollout engines render them:
- acting: the agent prompt collect would show for that state → `format_response(<short template think>, <label>)`,
  from the episodes the expert won;
- skill writing: the analysis prompt of each demonstration episode (the prompt `--analyzer self` renders in rl,
  `analysis_max_chars` as there) → the `rules` analyzer's JSON for it, so the policy can write a parseable skill
  about its own episodes (SEED's self-analyzer) before Stage 1's SFT.

The model is trained with next-token NLL on the response tokens (+ <|im_end|>) plus a down-weighted NLL on the prompt
tokens (a model from random weights has to learn the game's language before it can copy an admissible action out of
the prompt), saved in place (Hugging Face format); `warmstart.json` beside it records games, epochs, the loss curve,
greedy checks (acting and skill writing) and the wall time. The tiny preset's default shape is replaced by
AGENT_SHAPE (see `warm_start(shape=...)`).

Other environments (`--env sokoban`, webshop, search, ezpoints): the environment's own expert plays its training
tasks through the generic EnvPool (Sokoban: the shortest plan by breadth-first search), with the same noise and
labels; the thought is a constant (`THINK`), the skill-writing examples use the environment's analysis description
and rules analyzer, and `skill_writing=False` leaves them out (a run whose skills come from `--analyzer rules`
needs none).

Demonstrations are cached (`$SEEDCLI_CACHE`, default ~/.cache/seedcli/expert-demos/): resets cost 1-5 s a game.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from seedcli.envs.alfworld.data import list_games, resolve_data_root, select_games
from seedcli.envs.alfworld.pool import EnvPool
from seedcli.envs.alfworld.projection import format_response
from seedcli.envs.alfworld.prompt import AGENT_PROMPT_VERSION
from seedcli.prompts import ANALYSIS_PROMPT_VERSION
from seedcli.records import JsonlWriter, Trajectory, iter_jsonl
from seedcli.rollout import EpisodeSpec, Generated, RolloutSettings, _derive_seed, play_episodes

# The model shape `seed model init --preset tiny --warm-start expert` trains (Qwen2Config fields for
# build_tiny_model): 1.3M parameters with the ALFWorld BPE. On two shared CPU cores (one thread each: two threads
# ran 4x slower under contention) it trains at ~4k tokens/s, so 120 games × 8 epochs of ~620-token prompts take
# ~15 min and an RL update stays at minutes. Four layers: copying an action out of the prompt needs an induction
# circuit (two layers at least) on top of reading the observation. head_dim stays 32 for vLLM's CPU attention.
AGENT_SHAPE: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}

WARMSTART_FILE = "warmstart.json"


def default_cache_dir() -> Path:
    """Where expert demonstrations are cached: $SEEDCLI_CACHE/expert-demos or ~/.cache/seedcli/expert-demos."""
    base = os.environ.get("SEEDCLI_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "seedcli")
    return Path(base) / "expert-demos"


def _log(msg: str) -> None:
    print(f"[warm-start] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------- demonstrations


THINK = "I follow the expert plan."  # the think of a demonstration turn whose task names no object


def demo_thinks(traj: Trajectory) -> list[str]:
    """A short template thought per turn that spells out the one fact the action hinges on: whether the agent holds
    the task's object, sees it here, or is still looking for it ("I see the tomato here."). It is computed from what
    the prompt shows (the task line, the current observation, the pick-up/put messages), so a model can learn to
    write it; once written, the object's name sits right before the action (a 1.3M-parameter clone with a constant
    thought walked past the tomato it was looking for)."""
    from seedcli.envs.alfworld.rules import parse_goal  # the warm start is ALFWorld's (it clones its expert)

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


DEMO_VERSION = "search-noise-v1"  # (the thoughts are added when examples are built: not part of the key)  # bump when the demonstrator changes (part of the cache key)


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
            choices = [a for a in (ep.last.admissible if ep.last else []) if a != action]
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
    from seedcli.envs.pool import EnvPool as GenericPool

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
        _log(f"{who} plays {len(todo)} of {len(specs)} training tasks (noise {policy.noise}; cache: {path})")
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
                    _log(f"  {n}/{len(specs)} expert episodes, {won} won ({time.time() - t0:.0f}s)")

            play_episodes(todo, policy, pool, settings, meta, on_done, max_active=max_active)
    return [done[s.episode_id] for s in specs], path


# ----------------------------------------------------------------------------------------------- training data


def _environment(env=None):
    """`env`, or ALFWorld's environment when None (the helpers below default to ALFWorld's warm start)."""
    if env is not None:
        return env
    from seedcli.envs import get_env

    return get_env("alfworld")


def demo_examples(demos: list[DemoEpisode], tokenizer, env=None) -> list[tuple[list[int], list[int]]]:
    """Acting examples: (prompt ids, response ids) for every labelled turn of the episodes the expert won, the prompt
    rendered with the chat template exactly as the rollout engines render it; the response is demo_thinks' thought
    and the expert's action at that state, and ends with <|im_end|>, as a generated turn that stopped does. `env`
    (default ALFWorld's): its format_response; outside ALFWorld the thought is the constant THINK."""
    from seedcli.engines.base import render_chat, stop_token_ids

    eos = stop_token_ids(tokenizer)[0]
    env = _environment(env)
    out = []
    for demo in demos:
        if not demo.trajectory.won:
            continue
        thinks = demo_thinks(demo.trajectory) if env.name == "alfworld" else [THINK] * len(demo.trajectory.turns)
        for turn, label, think in zip(demo.trajectory.turns, demo.labels, thinks, strict=False):
            if not _usable(label, turn):
                continue
            if env.name != "alfworld":  # the environment's own reasoning for the expert's move, where it has one
                think = env.demo_thought(demo.trajectory, turn, label) or think
            prompt = render_chat(tokenizer, [{"role": "user", "content": turn.prompt}])
            response = tokenizer.encode(env.format_response(think, label), add_special_tokens=False) + [eos]
            out.append((prompt, response))
    return out


def _usable(label: str | None, turn) -> bool:
    """A label worth cloning: admissible, and not the env's "look" placeholder for a silent expert (the hand-coded
    expert never says "look"; it goes quiet after its own plan fails)."""
    return bool(label) and label != "look" and label in turn.admissible


def analysis_example_texts(demos: list[DemoEpisode], max_chars: int, env=None) -> list[tuple[str, str]]:
    """Skill-writing examples: (analysis prompt, the rules analyzer's JSON) per demonstration episode, won or lost;
    the prompt is the one rl's self-analyzer renders (`render_analysis_prompt(..., max_chars)`). `env` (default
    ALFWorld's): its analysis description and rules analyzer."""
    from seedcli.prompts import analysis_turns, render_analysis_prompt

    env = _environment(env)
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
    from seedcli.analyzers import analysis_messages
    from seedcli.engines.base import render_chat, stop_token_ids

    eos = stop_token_ids(tokenizer)[0]
    return [
        (render_chat(tokenizer, analysis_messages(prompt)), tokenizer.encode(answer, add_special_tokens=False) + [eos])
        for prompt, answer in pairs
    ]


def _batches(lengths: list[int], max_tokens: int, rng: random.Random) -> list[list[int]]:
    """Indices grouped by similar length (little padding), at most `max_tokens` padded tokens a batch, batch order
    shuffled: shortest first (ties in a seeded random order), packed by rl's packer."""
    from seedcli.rl.batching import pack_in_order

    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches = pack_in_order(order, lengths, max_tokens)
    rng.shuffle(batches)
    return batches


def _collate(examples, idx, pad_id: int, prompt_weight: float):
    """(ids [B, T], attention mask [B, T], loss weight of predicting token t [B, T]) of the examples `idx`, right-padded
    to the longest: 1 on the response, `prompt_weight` on the prompt after its first token."""
    import torch

    from seedcli.rl.batching import pad_right

    ids, attn = pad_right([examples[i][0] + examples[i][1] for i in idx], pad_id)
    weight = torch.zeros(ids.shape, dtype=torch.float32)
    for row, i in enumerate(idx):
        p, r = examples[i]
        weight[row, 1 : len(p)] = prompt_weight
        weight[row, len(p) : len(p) + len(r)] = 1.0
    return ids, attn, weight


def _loss(model, ids, attn, weight):
    """(weighted loss, response-token NLL sum, response tokens) of one batch. Without prompt weight only the
    response positions get logits (rl/logprobs.py: chunked, fp32), not a [B, T, vocab] tensor."""
    import torch

    resp = (weight == 1.0).float()  # [B, T]: response tokens
    if not bool((weight[weight != 1.0] != 0).any()):
        from seedcli.rl.logprobs import sequence_logprobs

        logp = sequence_logprobs(model, ids, attn, resp)  # [B, T] fp32, 0 off the response
        nll_sum = -(logp * resp).sum()
        n = resp.sum()
        return nll_sum / n.clamp(min=1.0), float(nll_sum.detach()), float(n)
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()  # [B, T-1, V]
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # [B, T-1]
    w = weight[:, 1:]
    resp = (w == 1.0).float()
    loss = (nll * w).sum() / w.sum().clamp(min=1.0)
    return loss, float((nll.detach() * resp).sum()), float(resp.sum())


def warm_start(
    model_dir: str | os.PathLike,
    games: int = 240,
    epochs: int = 4,
    seed: int = 0,
    *,
    shape: dict[str, Any] | None = AGENT_SHAPE,
    lr: float = 1e-3,
    batch_tokens: int = 4096,
    prompt_weight: float = 0.5,
    noise: float = 0.2,
    max_steps: int | None = None,
    history: int | None = None,
    analysis_max_chars: int = 6000,
    threads: int | None = None,
    workers: int = 2,
    data_root: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    check_turns: int = 64,
    check_skills: int = 8,
    env: str = "alfworld",
    skill_writing: bool = True,
    dtype: str | None = None,
) -> dict:
    """Behaviour-clone the expert on `games` training games for `epochs` epochs into the model at `model_dir`
    (trained in place) and write warmstart.json beside it. `prompt_weight` adds a small next-token loss on the
    prompt (teaches a from-scratch model the game's language and to copy from it); 0 = response tokens only.
    With `shape` (default AGENT_SHAPE), a model of another shape is first rebuilt in place with that shape (same
    preset tokenizer and seed): the default tiny shape is too small to pick the expert's action out of the prompt;
    `shape=None` trains the model as given. `env`: whose expert (ALFWorld's searching expert; any other registered
    environment's own expert, `env_demonstrations`); `max_steps` and `history` default to 40 and 5 on ALFWorld, the
    environment's own elsewhere; `skill_writing=False` trains acting only. `dtype` (auto: bf16 on a CPU with bf16
    instructions) is the compute dtype: fp32 master weights and AdamW state, bf16 matmuls under autocast."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seedcli.errors import UserError

    torch.set_num_threads(threads or int(os.environ.get("OMP_NUM_THREADS", "1")))
    if games < 1 or epochs < 1:
        raise UserError(f"--warm-start expert needs --games >= 1 and --epochs >= 1 (got {games}, {epochs})")
    if not 0.0 <= noise < 1.0:
        raise UserError(f"--noise is the share of random turns, in [0, 1); got {noise}")
    t_start = time.time()
    model_dir = Path(model_dir)
    rebuilt = _ensure_shape(model_dir, shape, seed)
    from seedcli.envs import get_env

    environment = get_env(env, data_root=data_root) if data_root is not None else get_env(env)
    alfworld = environment.name == "alfworld"
    # ALFWorld's limits are the searching expert's (40 turns, history 5); elsewhere the environment's own
    max_steps = max_steps if max_steps is not None else (40 if alfworld else environment.max_steps)
    history = history if history is not None else (5 if alfworld else environment.history)
    play = {"noise": noise, "max_steps": max_steps, "history": history, "workers": workers, "cache_dir": cache_dir}
    if alfworld:
        demos, cache_path = expert_demonstrations(games, seed, data_root=data_root, **play)
    else:
        demos, cache_path = env_demonstrations(environment, games, seed, **play)
    # the last few episodes are held out of skill writing, to check it on prompts the model has not seen
    check_skills = check_skills if skill_writing else 0
    held_out = demos[-check_skills:] if check_skills else []
    skill_pairs = (
        analysis_example_texts(demos[: len(demos) - len(held_out)], analysis_max_chars, environment)
        if skill_writing
        else []
    )
    t_demos = time.time() - t_start
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    acting = demo_examples(demos, tokenizer, environment)
    writing = analysis_examples(skill_pairs, tokenizer)
    if not acting:
        raise UserError(f"the expert won none of the {len(demos)} demonstration games; nothing to clone")
    examples = acting + writing
    lengths = [len(p) + len(r) for p, r in examples]
    won = sum(d.trajectory.won for d in demos)
    _log(
        f"{len(demos)} expert episodes ({won} won), {len(acting)} acting turns (prompt tokens mean "
        f"{sum(len(p) for p, _ in acting) / len(acting):.0f}), {len(writing)} skill-writing examples (prompt tokens "
        f"mean {sum(len(p) for p, _ in writing) / max(len(writing), 1):.0f}), longest {max(lengths)}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters"
    )

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    t_train = time.time()
    from seedcli.precision import compute_dtype_name

    compute = compute_dtype_name(dtype, "cpu")
    curve = train_clone(
        model,
        examples,
        epochs,
        seed,
        lr=lr,
        batch_tokens=batch_tokens,
        prompt_weight=prompt_weight,
        pad_id=pad_id,
        dtype=compute,
    )
    train_s = time.time() - t_train

    model.save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    check, skill_check = clone_checks(
        model_dir, demos, held_out, check_turns, analysis_max_chars, seed, environment, dtype=compute
    )
    epoch_nll = []
    for e in range(1, epochs + 1):
        rows = [c["response_nll"] for c in curve if c["epoch"] == e]
        epoch_nll.append(sum(rows) / len(rows))
    record = {
        "method": (
            "behaviour cloning of ALFWorld's searching hand-coded expert"
            if alfworld
            else f"behaviour cloning of the {environment.title} expert"
        )
        + " with noise injection (agent prompt format)"
        + (" + skill writing (analysis prompt -> rules analyzer JSON)" if skill_writing else ""),
        "env": env,
        "demonstrator": DEMO_VERSION,
        "games": len(demos),
        "games_won_by_expert": won,
        "noise": noise,
        "epochs": epochs,
        "seed": seed,
        "turns": len(acting),
        "skill_examples": len(writing),
        "analysis_prompt_version": ANALYSIS_PROMPT_VERSION,
        "analysis_max_chars": analysis_max_chars,
        "response_tokens": sum(len(r) for _, r in examples),
        "prompt_tokens_mean": sum(len(p) for p, _ in acting) / len(acting),
        "prompt_tokens_max": max(len(p) for p, _ in acting),
        "analysis_prompt_tokens_mean": sum(len(p) for p, _ in writing) / max(len(writing), 1),
        "parameters": sum(p.numel() for p in model.parameters()),
        "shape": {
            k: getattr(model.config, k)
            for k in (
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "vocab_size",
            )
        },
        "rebuilt_with_agent_shape": rebuilt,
        "lr": lr,
        "batch_tokens": batch_tokens,
        "compute_dtype": compute,
        "master_dtype": "float32",
        "prompt_weight": prompt_weight,
        "max_steps": max_steps,
        "history": history,
        "demos_cache": str(cache_path),
        "epoch_response_nll": epoch_nll,
        "first_response_nll": curve[0]["response_nll"],
        "last_response_nll": sum(c["response_nll"] for c in curve[-20:]) / len(curve[-20:]),
        "check": check,
        "skill_check": skill_check,
        "demos_s": round(t_demos, 1),
        "train_s": round(train_s, 1),
        "wall_time_s": round(time.time() - t_start, 1),
        "threads": torch.get_num_threads(),
        "curve": curve,
    }
    (model_dir / WARMSTART_FILE).write_text(json.dumps(record, indent=1))
    return record


def train_clone(
    model,
    examples: list,
    epochs: int,
    seed: int,
    *,
    lr: float,
    batch_tokens: int,
    prompt_weight: float,
    pad_id: int,
    dtype: str = "float32",
) -> list[dict]:
    """`epochs` epochs of AdamW over `examples` (prompt ids, response ids) in length-grouped batches of at most
    `batch_tokens` padded tokens, lr with a linear warm-up and a cosine decay to 10%; returns the loss curve (one
    entry per batch). `dtype` bfloat16: the matmuls under bf16 autocast (the weights and AdamW state stay fp32)."""
    import torch

    from seedcli.precision import autocast

    rng = random.Random(seed)
    torch.manual_seed(seed)
    lengths = [len(p) + len(r) for p, r in examples]
    plan = [_batches(lengths, batch_tokens, rng) for _ in range(epochs)]
    total = sum(len(b) for b in plan)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, total // 20)

    def lr_at(step: int) -> float:  # linear warm-up, cosine decay to 10%
        if step < warmup:
            return lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    model.train()
    curve: list[dict] = []
    step = 0
    t_train = time.time()
    for epoch in range(epochs):
        nll_sum = tok_sum = 0.0
        for idx in plan[epoch]:
            ids, attn, weight = _collate(examples, idx, pad_id, prompt_weight)
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
            with autocast(torch.bfloat16 if dtype == "bfloat16" else torch.float32, "cpu"):
                loss, nll, ntok = _loss(model, ids, attn, weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            nll_sum += nll
            tok_sum += ntok
            step += 1
            curve.append({"step": step, "epoch": epoch + 1, "response_nll": nll / max(ntok, 1.0), "loss": loss.item()})
            if step % 20 == 0 or step == total:
                recent = curve[-20:]
                mean = sum(c["response_nll"] for c in recent) / len(recent)
                _log(
                    f"epoch {epoch + 1}/{epochs} batch {step}/{total}: response NLL {mean:.3f} ({time.time() - t_train:.0f}s)"
                )
        _log(f"epoch {epoch + 1} done: response NLL {nll_sum / max(tok_sum, 1.0):.3f}")
    return curve


def clone_checks(
    model_dir: Path,
    demos: list[DemoEpisode],
    held_out: list[DemoEpisode],
    turns: int,
    max_chars: int,
    seed: int,
    env=None,
    dtype: str | None = None,
) -> tuple[dict, dict]:
    """(greedy acting check, skill-writing check on the held-out episodes; empty without any) of the saved clone,
    loaded through the hf engine as collect, rl and eval will load it. `env`: another environment than ALFWorld."""
    from seedcli.engines.hf import HFEngine

    engine = HFEngine(model_dir, device="cpu", dtype=dtype, seed=seed)
    try:
        check = greedy_check(engine, demos, turns, seed, env)
        _log(
            f"greedy check on {check['turns']} demonstration turns: valid {check['valid_rate']:.0%}, admissible "
            f"{check['admissible_rate']:.0%}, expert action {check['expert_action_rate']:.0%}"
        )
        if not held_out:
            return check, {"episodes": 0, "kept": 0, "examples": []}
        skill_check = skill_writing_check(engine, held_out, max_chars, env=env)
        _log(
            f"skill check on {skill_check['episodes']} held-out episodes: parseable skill "
            f"{skill_check['kept']}/{skill_check['episodes']}"
        )
    finally:
        engine.close()
    return check, skill_check


def _ensure_shape(model_dir: Path, shape: dict[str, Any] | None, seed: int) -> bool:
    """Rebuild the model at `model_dir` with `shape` when its config differs (the tokenizer preset is kept)."""
    if not shape:
        return False
    config = json.loads((model_dir / "config.json").read_text())
    if all(config.get(k) == v for k, v in shape.items()):
        return False
    from seedcli.engines.tiny import QWEN_VOCAB_SIZE, build_tiny_model
    from seedcli.envs import tokenizer_texts

    preset = "tiny-qwen" if config.get("vocab_size") == QWEN_VOCAB_SIZE else "tiny"
    _log(f"rebuilding {model_dir} with the warm-start shape {shape} (preset {preset}, seed {seed})")
    corpus = tokenizer_texts() if preset == "tiny" else None
    build_tiny_model(model_dir, preset=preset, seed=seed, corpus=corpus, **shape)
    return True


def greedy_check(engine, demos: list[DemoEpisode], turns: int, seed: int, env=None) -> dict:
    """Greedy response (through an Engine) on `turns` sampled demonstration prompts: how often it is well-formed,
    admissible and the expert's own action at that state (teacher-forced history: the states the demonstrations
    visited)."""
    parse_action = _environment(env).parse_action

    pool = [
        (t, label)
        for d in demos
        if d.trajectory.won
        for t, label in zip(d.trajectory.turns, d.labels, strict=False)
        if _usable(label, t)
    ]
    picked = random.Random(seed + 1).sample(pool, min(turns, len(pool)))
    prompts = [engine.render([{"role": "user", "content": turn.prompt}]) for turn, _ in picked]
    completions = engine.generate(prompts, temperature=0.0, max_new_tokens=96, seed=seed) if prompts else []
    valid = admissible = expert = 0
    examples = []
    for (turn, label), completion in zip(picked, completions, strict=True):
        action, ok = parse_action(completion.text)
        valid += ok
        admissible += ok and action in turn.admissible
        expert += ok and action == label
        if len(examples) < 3:
            examples.append({"expert": label, "model": completion.text})
    n = max(len(picked), 1)
    return {
        "turns": len(picked),
        "valid_rate": valid / n,
        "admissible_rate": admissible / n,
        "expert_action_rate": expert / n,
        "examples": examples,
    }


def skill_writing_check(engine, demos: list[DemoEpisode], max_chars: int, max_new_tokens: int = 256, env=None) -> dict:
    """Greedy skill JSON for held-out demonstration episodes, asked through rl's self-analyzer (PolicyAnalyzer, one
    attempt) and judged by its parser."""
    from seedcli.analyzers import analysis_messages
    from seedcli.analyzers.parse import parse_skill
    from seedcli.analyzers.policy import PolicyAnalyzer

    analyzer = PolicyAnalyzer(engine, max_new_tokens=max_new_tokens)
    pairs = analysis_example_texts(demos, max_chars, env)
    responses = analyzer.analyze_batch([analysis_messages(prompt) for prompt, _ in pairs])
    kept, examples = 0, []
    for response in responses:
        parsed = parse_skill(response.text)
        kept += parsed.kept
        if len(examples) < 2:
            examples.append({"model": response.text, "kept": parsed.kept, "skill": parsed.skill})
    return {"episodes": len(demos), "kept": kept, "examples": examples}
