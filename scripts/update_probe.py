"""What one or more RL updates did to the policy's choices, read at fixed states: the expert's own states.

    python scripts/update_probe.py MODEL_DIR [MODEL_DIR ...] [--env ezpoints] [--games 48] [--seed 7]

Plays the environment's expert without noise on `--games` training tasks (a different selection from the warm
start's with `--seed`; cached as the warm start's demonstrations are), then asks every model for its greedy reply
at each state the expert visited, teacher-forced on the expert's history. Prints, per model, how often the reply
is valid and equals the expert's action, split by the kind of action the expert took there, and on EZPoints how
often the model closes with `=` where the expert does and where it does not.

Why: a fall in RL shows first as a shift of the policy's choices at states the warm start handled, long before a
16-episode rollout can tell it from noise. Comparing a checkpoint after one update with its start, over a few hundred
fixed states, reads the direction of an update variant (SmolLM2, 192 states: ~9 minutes a model on one AVX2 thread;
docs/method-check-calibration.md, "Why the demo's seeds fall").
"""

from __future__ import annotations

import argparse
import os
from collections import Counter

import torch

from seedcli.engines.hf import HFEngine
from seedcli.envs import get_env
from seedcli.stages.demos import env_demonstrations


def kind(action: str) -> str:
    """EZPoints' action kinds: the closing `=`, an operator, a number; any other environment: 'action'."""
    if action == "=":
        return "="
    if action in {"+", "*", "-", "/"}:
        return "op"
    return "number" if action.isdigit() else "action"


def states(env, games: int, seed: int) -> list[tuple[str, str]]:
    """(prompt, expert action) at every state of the noise-free expert's won episodes on `games` training tasks of
    the environment `env` (an `Environment`)."""
    demos, _ = env_demonstrations(env, games, seed, noise=0.0, workers=1)
    out = []
    for d in demos:
        if not d.trajectory.won:
            continue
        for turn, label in zip(d.trajectory.turns, d.labels, strict=False):
            if label:
                out.append((turn.prompt, label))
    return out


def tally(picked: list[tuple[str, str]], replies: list[str], parse_action) -> dict:
    """Per expert-action kind, Counter(states, valid, expert: the reply's action is the expert's), and `early_close`:
    replies that close with `=` where the expert does not."""
    counts: dict[str, Counter] = {}
    early_close = 0
    for (_, label), text in zip(picked, replies, strict=True):
        action, ok = parse_action(text)
        c = counts.setdefault(kind(label), Counter())
        c["states"] += 1
        c["valid"] += bool(ok)
        c["expert"] += bool(ok and action == label)
        early_close += bool(ok and action == "=" and label != "=")
    return {"kinds": counts, "early_close": early_close, "states": len(picked)}


def probe(model_dir: str, picked: list[tuple[str, str]], env, seed: int) -> dict:
    """`tally` of the model's greedy replies (hf engine, fp32) at the `picked` states."""
    engine = HFEngine(model_dir, device="cpu", dtype="float32", seed=seed)
    try:
        prompts = [engine.render([{"role": "user", "content": p}]) for p, _ in picked]
        replies = engine.generate(prompts, temperature=0.0, max_new_tokens=96, seed=seed)
    finally:
        engine.close()
    return tally(picked, [r.text for r in replies], env.parse_action)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--env", default="ezpoints")
    ap.add_argument("--games", type=int, default=48)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    env = get_env(args.env)
    picked = states(env, args.games, args.seed)
    print(f"{len(picked)} expert states from {args.games} {args.env} training tasks (seed {args.seed})")
    for model in args.models:
        r = probe(model, picked, env, args.seed)
        parts = [f"{k} {c['expert']}/{c['states']} expert ({c['valid']} valid)" for k, c in sorted(r["kinds"].items())]
        total = sum(c["expert"] for c in r["kinds"].values())
        print(
            f"{model}: expert action {total}/{r['states']} | "
            + " | ".join(parts)
            + f" | '=' too early {r['early_close']}"
        )


if __name__ == "__main__":
    main()
