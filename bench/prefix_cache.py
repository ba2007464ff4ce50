"""The hf engine's prefix cache side by side in one run: the same rollout (tasks, seeds, replies) with the cache off
and on, on a real model's own replies.

An agent's turn prompts repeat themselves: the episodes of a group play one game, so their first prompts are the same
and their later ones differ only near the end (text EZPoints: 475 SmolLM2 tokens a prompt, 370 of them the rules and
the cards). Without a cache every turn prefills its whole prompt; with it (`prefix_cache_mb`, on by default) a
prompt prefills only what follows its longest stored prefix, and the prefixes a batch's prompts share prefill once.

Three settings, one after the other on the same engine: transformers' DynamicLayer without the prefix cache (the
engine before both changes: it concatenates the whole cache at every decode step), the batcher's growing layers
(seedcli/engines/kv_cache.py) without it, and both. Reported per setting: wall time, prompt tokens, tokens run
through a prefill forward, decode steps; then whether all gave the same trajectories (same tokens, log-probs
within 1e-4).

    .venv/bin/python bench/prefix_cache.py                      # SmolLM2-135M-Instruct (`make install`), EZPoints
    .venv/bin/python bench/prefix_cache.py --model runs/…/agent # a warm-started agent writes real replies
    .venv/bin/python bench/prefix_cache.py --tiny               # the tiny model built in code (seconds)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


# (label, growing cache layers, prefix cache): the engine before this bench's two changes, then each added
SETTINGS = [
    ("DynamicLayer, no prefix cache", False, 0),
    ("growing layers, no prefix cache", True, 0),
    ("growing layers + prefix cache", True, None),  # None: --cache-mb
]


def play(engine, env, tasks, args, cache_mb: int) -> dict:
    from seedcli.envs.pool import EnvPool
    from seedcli.rollout import EpisodeSpec, ModelPolicy, RolloutSettings, play_episodes

    engine.prefix_cache_bytes = cache_mb << 20
    settings = RolloutSettings(
        max_steps=args.max_steps or env.max_steps, history=env.history, temperature=args.temperature,
        max_new_tokens=args.max_new_tokens, seed=args.seed, rollout="async",
    )  # fmt: skip
    specs = [
        EpisodeSpec(f"b{i:03d}-r{r:02d}", f"b{i:03d}", task=task) for i, task in enumerate(tasks)
        for r in range(args.group)
    ]  # fmt: skip
    policy = ModelPolicy(engine, settings, gen_batch=len(specs))
    batchers = []
    make = policy.scheduler

    def scheduler():  # keep the batcher, to read its counters afterwards
        s = make()
        batchers.append(s.batcher)
        return s

    policy.scheduler = scheduler
    episodes: dict = {}
    t0 = time.perf_counter()
    with EnvPool(env, 0) as pool:
        play_episodes(specs, policy, pool, settings, {"engine": "hf"}, lambda t: episodes.__setitem__(t.episode_id, t),
                      max_active=len(specs))  # fmt: skip
    wall = time.perf_counter() - t0
    b = batchers[0]
    return {
        "wall": wall,
        "episodes": episodes,
        "prompt": b.prompt_tokens,
        "prefill": b.prefill_tokens,
        "steps": b.steps,
    }


@contextlib.contextmanager
def cache_layers(growing: bool):
    """The batcher with its growing cache layers, or with transformers' DynamicLayer (the engine before them: it
    concatenates the whole cache at every decode step)."""
    from transformers import DynamicCache

    from seedcli.engines import batching

    def plain(config, layers=None):
        return DynamicCache(ddp_cache_data=layers, config=config) if layers else DynamicCache(config=config)

    original = batching.new_cache
    batching.new_cache = original if growing else plain
    try:
        yield
    finally:
        batching.new_cache = original


def same(a: dict, b: dict) -> tuple[int, int]:
    k = 0
    for eid, ta in a["episodes"].items():
        tb = b["episodes"].get(eid)
        ok = tb is not None and [t.response_ids for t in ta.turns] == [t.response_ids for t in tb.turns]
        ok = ok and all(
            max((abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)), default=0) < 1e-4
            for x, y in zip(ta.turns, tb.turns, strict=True)
        )
        k += ok
    return k, len(a["episodes"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a Hugging Face model directory (default: SmolLM2-135M-Instruct from its package)")
    ap.add_argument("--tiny", action="store_true", help="the tiny model built in code instead")
    ap.add_argument("--env", default="ezpoints")
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-steps", type=int, default=0, help="turns an episode (default: the environment's)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=0.4)
    ap.add_argument("--rows", type=int, default=16, help="requests the engine decodes at once (max_batch)")
    ap.add_argument("--cache-mb", type=int, default=1024)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from seedcli.engines import load_engine
    from seedcli.envs import get_env

    env = get_env(args.env)
    tasks = env.select_tasks(env.list_tasks(env.train_split), args.tasks, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        if args.tiny:
            from seedcli.engines.tiny import build_tiny_model
            from seedcli.envs import tokenizer_texts

            model, name = build_tiny_model(Path(tmp) / "tiny", preset="tiny", seed=0, corpus=tokenizer_texts()), "tiny"
        elif args.model:
            model, name = Path(args.model), args.model
        else:
            from seedcli.engines.gguf import cached_preset

            model, name = cached_preset("smollm2-135m-instruct"), "SmolLM2-135M-Instruct"
        engine = load_engine("hf", model, device="cpu", dtype=args.dtype, max_batch=args.rows)
        print(
            f"prefix cache bench: {args.env}, {len(tasks)} tasks x {args.group}, {name} ({engine.dtype}) on the hf "
            f"engine, {args.rows} rows, T {args.temperature}, {args.max_new_tokens} new tokens a turn",
            file=sys.stderr,
        )
        results = {}
        for label, growing, mb in SETTINGS:
            with cache_layers(growing):
                results[label] = play(engine, env, tasks, args, args.cache_mb if mb is None else mb)
    for label, r in results.items():
        turns = sum(len(t.turns) for t in r["episodes"].values())
        print(f"{label:>32}: {r['wall']:.1f} s, {turns} turns, {r['prompt']} prompt tokens, {r['prefill']} "
              f"prefilled, {r['steps']} decode steps", file=sys.stderr)  # fmt: skip
    before, growing, cached = (results[label] for label, _, _ in SETTINGS)
    agree = [same(before, r) for r in (growing, cached)]
    k, n = min(k for k, _ in agree), agree[0][1]
    print(
        f"prefix cache bench: before {before['wall']:.1f} s | growing layers {growing['wall']:.1f} s "
        f"({before['wall'] / max(growing['wall'], 1e-9):.2f}x) | + prefix cache {cached['wall']:.1f} s "
        f"({growing['wall'] / max(cached['wall'], 1e-9):.2f}x; {before['wall'] / max(cached['wall'], 1e-9):.2f}x in "
        f"all) | prefill tokens {before['prefill']} -> {cached['prefill']} "
        f"({before['prefill'] / max(cached['prefill'], 1):.1f}x fewer) | identical trajectories: "
        f"{'yes' if k == n else 'no'} ({k}/{n})"
    )


if __name__ == "__main__":
    main()
