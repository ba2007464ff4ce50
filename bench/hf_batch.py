"""The hf engine's rows a decode step (`hf_batch`) side by side in one run: the same episodes (tasks, seeds) played
with 16 rows (the default) and with more, on one engine.

On a CPU a decode step reads every weight once whatever the rows, so more rows share that read; on a GPU a step of a
small model costs about the same for 16 or 128 rows. An evaluation (256 games) or a Stage-1 collect plays many
episodes at once and gains; an rl update's 16 episodes do not (they fill 16 rows). Reported per setting: wall time,
turns, decode steps, tokens a second; then the share of episodes both settings played alike (same tokens, log-probs
within 1e-4): completions depend on their prompt and seed alone, but a row's logits can move in the last bits with
the batch it shares, and a sampled token with them.

    .venv/bin/python bench/hf_batch.py                       # SmolLM2-135M-Instruct (`make install`), EZPoints
    .venv/bin/python bench/hf_batch.py --rows 16 64 --tasks 8 --group 8 --max-steps 2
    .venv/bin/python bench/hf_batch.py --tiny                # the tiny model built in code (seconds)
Last line: `hf batch bench: 16 rows <s> s | 64 rows <s> s | wall ratio <x> | tokens/s <a> -> <b> | identical <k>/<n>
(<dtype>)`.
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
    rollout_args(ap, tasks=8, max_steps=2)
    ap.add_argument("--rows", type=int, nargs=2, default=[16, 64], help="the two settings of max_batch")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    from seedcli.engines import load_engine

    env, tasks = test_games(args)
    with tempfile.TemporaryDirectory() as tmp:
        model, name = bench_model(args, tmp)
        engine = load_engine("hf", model, device=args.device, dtype=args.dtype, max_batch=min(args.rows))
        print(
            f"hf batch bench: {args.env}, {len(tasks)} tasks x {args.group}, {name} ({engine.dtype}) on the hf engine "
            f"({args.device}), rows {args.rows}, T {args.temperature}, {args.max_new_tokens} new tokens a turn",
            file=sys.stderr,
        )
        warm = argparse.Namespace(**{**vars(args), "group": 1, "max_steps": 1})
        play(engine, env, tasks[:1], warm, args.cache_mb)  # the first call's set-up, paid by neither setting
        results = {}
        for rows in args.rows:
            engine.max_batch = rows
            results[rows] = play(engine, env, tasks, args, args.cache_mb)
    tps = {}
    for rows, r in results.items():
        turns = [t for ep in r["episodes"].values() for t in ep.turns]
        tokens = sum(len(t.response_ids) for t in turns)
        tps[rows] = tokens / max(r["wall"], 1e-9)
        print(f"{rows:>4} rows: {r['wall']:.1f} s, {len(turns)} turns, {tokens} reply tokens, {r['steps']} decode "
              f"steps, {tps[rows]:.1f} tokens/s", file=sys.stderr)  # fmt: skip
    a, b = args.rows
    k, n = same(results[a], results[b])
    print(
        f"hf batch bench: {a} rows {results[a]['wall']:.1f} s | {b} rows {results[b]['wall']:.1f} s | wall ratio "
        f"{results[a]['wall'] / max(results[b]['wall'], 1e-9):.2f} | tokens/s {tps[a]:.1f} -> {tps[b]:.1f} | "
        f"identical {k}/{n} ({dtype_of(engine)})"
    )


if __name__ == "__main__":
    main()
