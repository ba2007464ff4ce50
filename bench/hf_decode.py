"""The hf engine's decoding side by side in one run: transformers' way (`sdpa` attention, which repeats every key/value
head for its query heads when a mask is given; a DynamicLayer cache, concatenated every step) against the engine's
(grouped-query attention without the repeat, `seedcli.engines.attention`; a cache with free columns written in place,
`BufferedLayer`). The same episodes (tasks, seeds) on two engines loaded from one model.

A left-padded batch always carries a mask, so transformers' sdpa copied SmolLM2's 3 key/value heads to its 9 query
heads at every layer of every decode step, and the cache grew by concatenation: at 64 rows and ~600 cached tokens a
decode step spent most of its time copying. Reported per setting: wall time, the time in prefill forwards and in
decode steps, decode steps, reply tokens a second; then how many episodes both played alike (same tokens, log-probs
within 1e-4; the two attentions sum in different orders, so a sampled token can differ where two are nearly tied).

    .venv/bin/python bench/hf_decode.py                        # SmolLM2-135M-Instruct (`make install`), EZPoints
    .venv/bin/python bench/hf_decode.py --model runs/method-check/models/agent --threads 1   # the method check's agent
    .venv/bin/python bench/hf_decode.py --tiny                 # the tiny model built in code (seconds)
Last line: `hf decode bench: decode <x>x | prefill <y>x | wall <z>x | tokens/s <a> -> <b> | identical <k>/<n>
(<dtype>)`.
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

from prefix_cache import bench_model, dtype_of, play, rollout_args, same, test_games  # noqa: E402  (the prefix-cache bench's)


def timed(clock: dict):
    """An `instrument` for play(): adds the seconds the batcher spends in prefill forwards and decode steps."""

    def wrap(batcher) -> None:
        for phase, name in (("prefill_s", "_prefill"), ("decode_s", "_decode")):
            inner = getattr(batcher, name)

            def run(*a, _inner=inner, _phase=phase, **kw):
                t0 = time.perf_counter()
                try:
                    return _inner(*a, **kw)
                finally:
                    clock[_phase] += time.perf_counter() - t0

            setattr(batcher, name, run)

    return wrap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    rollout_args(ap, tasks=64, max_steps=2)
    ap.set_defaults(group=1)
    ap.add_argument("--rows", type=int, default=64, help="requests decoded at once (the method check's hf_batch)")
    args = ap.parse_args()

    from seedcli.engines import load_engine

    env, tasks = test_games(args)
    settings = {
        "transformers": {"attn_implementation": "sdpa", "spare": 0},
        "seedcli": {"attn_implementation": None, "spare": None},
    }
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        model, name = bench_model(args, tmp)
        for label, s in settings.items():
            engine = load_engine("hf", model, device="cpu", dtype=args.dtype, max_batch=args.rows,
                                 attn_implementation=s["attn_implementation"])  # fmt: skip
            if s["spare"] is not None:
                engine.kv_spare = s["spare"]
            dtype = dtype_of(engine)
            if not results:
                print(
                    f"hf decode bench: {args.env}, {len(tasks)} test games x {args.group}, {name} ({engine.dtype}), "
                    f"{args.rows} rows, T {args.temperature}, {args.max_new_tokens} new tokens a turn, "
                    f"{args.threads} thread(s)",
                    file=sys.stderr,
                )
            warm = argparse.Namespace(**{**vars(args), "group": 1, "max_steps": 1})
            play(engine, env, tasks[:1], warm, args.cache_mb)  # the first call's set-up, paid by neither setting
            clock = {"prefill_s": 0.0, "decode_s": 0.0}
            results[label] = {**play(engine, env, tasks, args, args.cache_mb, timed(clock)), **clock}
            del engine
    tps = {}
    for label, r in results.items():
        tokens = sum(len(t.response_ids) for ep in r["episodes"].values() for t in ep.turns)
        tps[label] = tokens / max(r["wall"], 1e-9)
        print(f"{label:>12}: {r['wall']:.1f} s, prefill {r['prefill_s']:.1f} s ({r['prefill']} tokens), "
              f"decode {r['decode_s']:.1f} s ({r['steps']} steps, {1e3 * r['decode_s'] / max(r['steps'], 1):.0f} ms a "
              f"step), {tokens} reply tokens", file=sys.stderr)  # fmt: skip
    a, b = results["transformers"], results["seedcli"]
    k, n = same(a, b)
    print(
        f"hf decode bench: decode {a['decode_s'] / max(b['decode_s'], 1e-9):.2f}x | prefill "
        f"{a['prefill_s'] / max(b['prefill_s'], 1e-9):.2f}x | wall {a['wall'] / max(b['wall'], 1e-9):.2f}x | tokens/s "
        f"{tps['transformers']:.1f} -> {tps['seedcli']:.1f} | identical {k}/{n} ({dtype})"
    )


if __name__ == "__main__":
    main()
