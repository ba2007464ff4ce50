"""`deterministic=true` against the default async rollouts, side by side in one run: what a fixed batch make-up costs
(wall time, engine steps) and what it buys in bf16 (the same episodes run after run).

In bf16 a row's sums depend on the rows it is batched with. Async rollouts batch whatever requests are waiting, which
follows thread timing, so two identical runs can part; `deterministic=true` plays lockstep (`settings_from` resolves
it), whose batches are made of the same requests whatever the timing. Each schedule here plays the same episodes twice
on one engine: the tiny model, ALFWorld, reply lengths drawn from bench/rollout.py's seeded lognormal (so rows end at
different steps, as a trained agent's do) and SEED's self-analysis of every episode. The second run of each schedule
has every environment step slowed by `--env-delay-ms` (as on a busier machine); the cost is measured on the first runs.

    .venv/bin/python bench/deterministic.py                  # bf16, 4 tasks x 4, 6 turns, 16 rows: minutes on 2 cores
    .venv/bin/python bench/deterministic.py --dtype float32  # fp32: both schedules repeat themselves
Last line: `deterministic bench (<dtype>): async <s> s <n> steps, run to run <k>/<n> identical | deterministic <s> s
<n> steps, run to run <k>/<n> identical | wall ratio <x> | steps ratio <y>` (ratios: deterministic over async).
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
sys.path.insert(0, str(REPO / "bench"))

from rollout import dtype_name, lognormal_lengths, play, warm_up  # noqa: E402  (the rollout bench's)


def identical(a: dict, b: dict) -> tuple[int, int]:
    """(identical, total): episodes whose records are equal to the last log-prob, with the same analysis answer."""
    k = sum(
        t.model_dump() == b["episodes"][eid].model_dump() and a["analysis"][eid].raw == b["analysis"][eid].raw
        for eid, t in a["episodes"].items()
    )
    return k, len(a["episodes"])


def slowed_env(delay_s: float):
    """A context in which every environment step of the pool takes `delay_s` longer."""
    import contextlib

    from seedcli.envs.pool import EnvPool

    @contextlib.contextmanager
    def slowed():
        step_many = EnvPool.step_many

        def slow(self, items):
            time.sleep(delay_s)
            return step_many(self, items)

        EnvPool.step_many = slow
        try:
            yield
        finally:
            EnvPool.step_many = step_many

    return slowed()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="alfworld")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-steps", type=int, default=6)
    ap.add_argument("--rows", type=int, default=16, help="requests the engine decodes at once (hf_batch)")
    ap.add_argument("--dtype", default="bfloat16", help="bfloat16 (default) | float32 | auto")
    ap.add_argument("--env-delay-ms", type=float, default=20.0, help="added to each environment step of the reruns")
    ap.add_argument("--analysis-tokens", type=int, default=128, help="tokens of each self-analysis answer")
    ap.add_argument("--analysis-chars", type=int, default=6000, help="analysis prompts cut to fit the tiny context")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.engine = "hf"

    import torch

    torch.set_num_threads(args.threads)
    from seedcli.config import CollectConfig
    from seedcli.engines import load_engine
    from seedcli.engines.tiny import build_tiny_model
    from seedcli.envs import get_env, tokenizer_texts
    from seedcli.stages.common import settings_from

    schedules = {
        "async": settings_from(CollectConfig(env=args.env)).rollout,
        "deterministic": settings_from(CollectConfig(env=args.env, deterministic=True)).rollout,
    }
    env = get_env(args.env)
    tasks = env.select_tasks(env.list_tasks(env.train_split), args.tasks, args.seed)
    lengths, described = lognormal_lengths(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "tiny", preset="tiny", seed=0, corpus=tokenizer_texts())
        engine = load_engine("hf", model, device="cpu", max_batch=args.rows, dtype=args.dtype)
        dtype = dtype_name(engine, args.dtype)
        print(
            f"deterministic bench: {args.env}, {len(tasks)} tasks x {args.group}, {args.max_steps} turns, {args.rows} "
            f"rows, tiny model on the hf engine ({dtype}), schedules {schedules}; reply lengths: {described}; "
            f"self-analysis of every episode; reruns with +{args.env_delay_ms:g} ms a step",
            file=sys.stderr,
        )
        warm_up(engine)
        runs: dict[str, list[dict]] = {}
        for name, mode in schedules.items():
            first = play(mode, args, engine, env, tasks, lengths)
            with slowed_env(args.env_delay_ms / 1000):
                again = play(mode, args, engine, env, tasks, lengths)
            runs[name] = [first, again]
            k, n = identical(first, again)
            print(f"{name:>13}: {first['wall']:.1f} s, {first['steps']} engine steps; rerun {again['wall']:.1f} s, "
                  f"{k}/{n} episodes identical", file=sys.stderr)  # fmt: skip
    (a, a2), (d, d2) = runs["async"], runs["deterministic"]
    ka, n = identical(a, a2)
    kd, _ = identical(d, d2)
    print(
        f"deterministic bench ({dtype}): async {a['wall']:.1f} s {a['steps']} steps, run to run {ka}/{n} identical | "
        f"deterministic {d['wall']:.1f} s {d['steps']} steps, run to run {kd}/{n} identical | wall ratio "
        f"{d['wall'] / max(a['wall'], 1e-9):.2f} | steps ratio {d['steps'] / max(a['steps'], 1):.2f}"
    )


if __name__ == "__main__":
    main()
