"""The hf engine's continuous batcher side by side in one run: a finished request's row dropped at once and the next
request spliced in (a copy of every row's cache each time), against the row left as a hole that the next request is
copied into alone (`ContinuousBatcher(holes=True)`, the default). The same episodes (tasks, seeds) on one engine.

In an evaluation each episode sends its next turn as soon as its last one returns, so requests leave and join one at a
time: dropping a row copied the whole batch's keys and values, and the splice of its successor copied them again. At
64 rows and ~600 cached tokens of SmolLM2 that is ~1.7 GB a turn; profiled on two AVX2 cores it was ~45% of an
evaluation's time. Reported per setting: wall time, decode steps, whole-batch copies, reply tokens a second; then how
many episodes both played alike (same tokens, log-probs within 1e-4: a row's logits can move in the last bits with the
batch it shares, and a sampled token with them).

Requests leave and join one at a time only when the episodes fall out of step: more games than rows and several turns
(the defaults, 128 games on 64 rows, up to 8 turns). 64 games of 2 turns on 64 rows play in two waves that leave and
join together (measured: 15 copies against 8, wall 1.00x), which is not an evaluation's pattern. The defaults on the
demo's SmolLM2 sft model (fp32, 2 AVX2 threads, alone, 2026-12-05): wall 1.25x, copies 186 -> 33, identical 128/128.

    .venv/bin/python bench/hf_holes.py --model DIR             # a warm-started agent (its replies vary in length)
    .venv/bin/python bench/hf_holes.py                         # SmolLM2-135M-Instruct (`make install`), EZPoints
    .venv/bin/python bench/hf_holes.py --rows 16 --threads 1   # the default hf_batch on one thread
    .venv/bin/python bench/hf_holes.py --tiny                  # the tiny model built in code (seconds)
Last line: `hf holes bench: wall <x>x | copies <a> -> <b> | tokens/s <c> -> <d> | identical <k>/<n> (<dtype>)`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from prefix_cache import bench_model, dtype_of, play, rollout_args, same, test_games  # noqa: E402  (the prefix-cache bench's)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    rollout_args(ap, tasks=128, max_steps=8)
    ap.set_defaults(group=1)
    ap.add_argument("--rows", type=int, default=64, help="requests decoded at once (the engine's hf_batch)")
    args = ap.parse_args()

    from seedcli.engines import load_engine

    env, tasks = test_games(args)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        model, name = bench_model(args, tmp)
        engine = load_engine("hf", model, device="cpu", dtype=args.dtype, max_batch=args.rows)
        print(
            f"hf holes bench: {args.env}, {len(tasks)} test games x {args.group}, {name} ({engine.dtype}), "
            f"{args.rows} rows, T {args.temperature}, {args.max_new_tokens} new tokens a turn, "
            f"{args.threads} thread(s)",
            file=sys.stderr,
        )
        warm = argparse.Namespace(**{**vars(args), "group": 1, "max_steps": 1})
        play(engine, env, tasks[:1], warm, args.cache_mb)  # the first call's set-up, paid by neither setting
        for label, holes in (("drop", False), ("holes", True)):
            engine.kv_holes = holes
            batchers: list = []
            results[label] = play(engine, env, tasks, args, args.cache_mb, batchers.append)
            results[label]["copies"] = sum(b.copies for b in batchers)
    tps = {}
    for label, r in results.items():
        tokens = sum(len(t.response_ids) for ep in r["episodes"].values() for t in ep.turns)
        turns = sum(len(ep.turns) for ep in r["episodes"].values())
        tps[label] = tokens / max(r["wall"], 1e-9)
        print(f"{label:>6}: {r['wall']:.1f} s, {turns} turns, {r['steps']} decode steps, {r['copies']} whole-batch "
              f"copies, {tokens} reply tokens", file=sys.stderr)  # fmt: skip
    a, b = results["drop"], results["holes"]
    k, n = same(a, b)
    print(
        f"hf holes bench: wall {a['wall'] / max(b['wall'], 1e-9):.2f}x | copies {a['copies']} -> {b['copies']} | "
        f"tokens/s {tps['drop']:.1f} -> {tps['holes']:.1f} | identical {k}/{n} ({dtype_of(engine)})"
    )


if __name__ == "__main__":
    main()
