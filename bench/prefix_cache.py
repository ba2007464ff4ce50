"""The hf engine's prefix cache side by side in one run: the same rollout (tasks, seeds, replies) with the cache off
and on, on a real model's own replies.

An agent's turn prompts repeat themselves: the episodes of a group play one game, so their first prompts are the same
and their later ones differ only near the end (text EZPoints: 475 SmolLM2 tokens a prompt, 370 of them the rules and
the cards). Without a cache every turn prefills its whole prompt; with it (`prefix_cache_mb`, on by default) a
prompt prefills only what follows its longest stored prefix, and the prefixes a batch's prompts share prefill once.

A short warm-up episode first, then the rollout with the cache off and on, one after the other on the same engine.
Reported per setting: wall time, prompt tokens, tokens run through a prefill forward, decode steps; then whether the
two gave the same trajectories (same tokens, log-probs within 1e-4).

    .venv/bin/python bench/prefix_cache.py                      # SmolLM2-135M-Instruct (`make install`), EZPoints
    .venv/bin/python bench/prefix_cache.py --model runs/…/agent # a warm-started agent writes real replies
    .venv/bin/python bench/prefix_cache.py --tiny               # the tiny model built in code (seconds)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def play(engine, env, tasks, args, cache_mb: int, instrument=None) -> dict:
    """Play `tasks` x `args.group` episodes on `engine` (continuous batching); `instrument(batcher)` is called on the
    batcher before it serves (bench/hf_decode.py times its phases)."""
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
        if instrument is not None:
            instrument(s.batcher)
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


def same(a: dict, b: dict) -> tuple[int, int]:
    """(identical, total): episodes of `a` that `b` played with the same tokens (log-probs within 1e-4)."""
    return sum(t.same_play(b["episodes"].get(eid)) for eid, t in a["episodes"].items()), len(a["episodes"])


def dtype_of(engine) -> str:
    """The engine's compute dtype by name ('float32', 'bfloat16'): printed beside every identity count, which holds to
    the bit in fp32 only (in bf16 a row's sums depend on the rows batched with it)."""
    return str(engine.dtype).removeprefix("torch.")


def rollout_args(ap: argparse.ArgumentParser, tasks: int, max_steps: int) -> None:
    """The options both rollout benches take (this one and bench/hf_batch.py)."""
    ap.add_argument("--model", help="a Hugging Face model directory (default: SmolLM2-135M-Instruct from its package)")
    ap.add_argument("--tiny", action="store_true", help="the tiny model built in code instead")
    ap.add_argument("--env", default="ezpoints")
    ap.add_argument("--tasks", type=int, default=tasks)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-steps", type=int, default=max_steps, help="turns an episode (0: the environment's)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=0.4)
    ap.add_argument("--cache-mb", type=int, default=1024)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)


def test_games(args: argparse.Namespace):
    """(environment, its first evaluation split's games that `--tasks` and `--seed` select), with torch on
    `--threads` threads."""
    import torch

    from seedcli.envs import get_env

    torch.set_num_threads(args.threads)
    env = get_env(args.env)
    return env, env.select_tasks(env.list_tasks(env.eval_splits[0]), args.tasks, args.seed)


def bench_model(args: argparse.Namespace, tmp: str) -> tuple[Path, str]:
    """(model directory, name): the tiny model built in `tmp`, `--model`, or SmolLM2 converted once and cached."""
    if args.tiny:
        from seedcli.engines.tiny import build_tiny_model
        from seedcli.envs import tokenizer_texts

        return build_tiny_model(Path(tmp) / "tiny", preset="tiny", seed=0, corpus=tokenizer_texts()), "tiny"
    if args.model:
        return Path(args.model), args.model
    from seedcli.engines.gguf import cached_preset

    return cached_preset("smollm2-135m-instruct"), "SmolLM2-135M-Instruct"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    rollout_args(ap, tasks=2, max_steps=0)
    ap.add_argument("--rows", type=int, default=16, help="requests the engine decodes at once (max_batch)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from seedcli.engines import load_engine
    from seedcli.envs import get_env

    env = get_env(args.env)
    tasks = env.select_tasks(env.list_tasks(env.train_split), args.tasks, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        model, name = bench_model(args, tmp)
        engine = load_engine("hf", model, device="cpu", dtype=args.dtype, max_batch=args.rows)
        print(
            f"prefix cache bench: {args.env}, {len(tasks)} tasks x {args.group}, {name} ({engine.dtype}) on the hf "
            f"engine, {args.rows} rows, T {args.temperature}, {args.max_new_tokens} new tokens a turn",
            file=sys.stderr,
        )
        # one short episode first, so the first setting does not pay the first call's set-up
        play(engine, env, tasks[:1], argparse.Namespace(**{**vars(args), "group": 1, "max_steps": 1}), args.cache_mb)
        results = {mb: play(engine, env, tasks, args, mb) for mb in (0, args.cache_mb)}
    for mb, r in results.items():
        turns = sum(len(t.turns) for t in r["episodes"].values())
        print(f"cache {mb:>5} MB: {r['wall']:.1f} s, {turns} turns, {r['prompt']} prompt tokens, {r['prefill']} "
              f"prefilled, {r['steps']} decode steps", file=sys.stderr)  # fmt: skip
    off, on = results[0], results[args.cache_mb]
    k, n = same(off, on)
    print(
        f"prefix cache bench: off {off['wall']:.1f} s | on {on['wall']:.1f} s | wall ratio "
        f"{off['wall'] / max(on['wall'], 1e-9):.2f} | prefill tokens {off['prefill']} -> {on['prefill']} "
        f"({off['prefill'] / max(on['prefill'], 1):.1f}x fewer) | identical trajectories ({dtype_of(engine)}): "
        f"{'yes' if k == n else 'no'} ({k}/{n})"
    )


if __name__ == "__main__":
    main()
