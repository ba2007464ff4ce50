"""Play ALFWorld's expert on every game of a split through EnvPool and print wins per task type.

    python bench/expert_check.py --split unseen --workers 2
    python bench/expert_check.py --split seen --workers 2 --perturb 3     # 3 random actions first, then the expert

A correct harness wins every game with --perturb 0 (the walkthrough). With --perturb K the first K actions are
random admissible ones, so the hand-coded fallback expert has to recover: that rate is informative, not 100%.
Also prints reset/step timings and pool throughput.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seedcli.envs.alfworld.data import SHORT_TASK_TYPES, list_games, resolve_data_root, resolve_split  # noqa: E402
from seedcli.envs.alfworld.pool import EnvPool  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", default="unseen", help="train, seen/valid_seen or unseen/valid_unseen")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (0: in-process)")
    ap.add_argument("--batch", type=int, default=16, help="games open at once")
    ap.add_argument("--max-steps", type=int, default=50, help="step limit per game")
    ap.add_argument("--perturb", type=int, default=0, help="random admissible actions before the expert takes over")
    ap.add_argument("--limit", type=int, default=None, help="only the first N games (sorted by name)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="also write per-game results here")
    args = ap.parse_args()

    root = resolve_data_root()
    split = resolve_split(args.split)
    games = list_games(root, split)[: args.limit]
    wins: dict[str, list[bool]] = defaultdict(list)
    lengths: list[int] = []
    failures: list[str] = []
    per_game: list[dict] = []
    reset_s = step_s = 0.0
    n_resets = n_steps = 0
    t_start = time.time()
    with EnvPool(args.workers, expert=True) as pool:
        for start in range(0, len(games), args.batch):
            batch = games[start : start + args.batch]
            slots = list(range(len(batch)))
            t = time.time()
            results = pool.reset_many(list(zip(slots, batch, strict=True)))
            reset_s += time.time() - t
            n_resets += len(batch)
            steps = [0] * len(batch)
            rngs = [random.Random(f"{args.seed}/{g.name}") for g in batch]
            active = [i for i, r in enumerate(results) if not r.won]
            while active:
                actions = []
                for i in active:
                    r = results[i]
                    if steps[i] < args.perturb:
                        actions.append((i, rngs[i].choice(r.admissible)))
                    else:
                        actions.append((i, r.expert_action or "look"))
                t = time.time()
                out = pool.step_many(actions)
                step_s += time.time() - t
                n_steps += len(actions)
                still = []
                for (i, _), r in zip(actions, out, strict=True):
                    results[i] = r
                    steps[i] += 1
                    if not r.won and steps[i] < args.max_steps:
                        still.append(i)
                active = still
            for g, r, n in zip(batch, results, steps, strict=True):
                wins[g.task_type].append(r.won)
                lengths.append(n)
                per_game.append({"game": g.name, "task_type": g.task_type, "won": r.won, "steps": n})
                if not r.won:
                    failures.append(g.name)
            done = sum(len(v) for v in wins.values())
            print(f"  {done}/{len(games)} games, {sum(sum(v) for v in wins.values())} won", file=sys.stderr, flush=True)
    wall = time.time() - t_start

    total = sum(len(v) for v in wins.values())
    won = sum(sum(v) for v in wins.values())
    print(f"split {split}: {won}/{total} won  (workers={args.workers}, perturb={args.perturb})")
    for t in SHORT_TASK_TYPES:
        if wins[t]:
            print(f"  {t:9s} {sum(wins[t]):3d}/{len(wins[t]):3d}")
    print(f"  mean length {sum(lengths) / max(len(lengths), 1):.1f} steps, max {max(lengths, default=0)}")
    print(
        f"  timing: reset {reset_s / max(n_resets, 1):.2f} s/game (batched wall), "
        f"step call {step_s / max(n_steps, 1) * 1000:.0f} ms/game-step (batched wall), "
        f"{n_steps / max(step_s, 1e-9):.1f} game-steps/s, total {wall:.0f} s"
    )
    for name in failures:
        print(f"  LOST {name}")
    if args.json:
        args.json.write_text(json.dumps(per_game, indent=1))
    return 0 if not failures or args.perturb else 1


if __name__ == "__main__":
    raise SystemExit(main())
