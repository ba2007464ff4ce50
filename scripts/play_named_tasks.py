"""Play the named tasks of a split many times with `seed collect`'s machinery, and print the success per task: how
well a model plays the very games an RL run trained on (the method check's overfit probe,
docs/method-check-calibration.md). Writes an ordinary collect run (manifest, trajectories.jsonl).

    python scripts/play_named_tasks.py -c configs/method_check.yaml --runs-dir runs/probe --model DIR \
        --tasks "2 of Diamonds and King of Hearts;3 of Clubs and 4 of Spades" --rollouts 64

A task is named as RL's samples.jsonl and the trajectories name it (`task`: its name, or its task_id).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from seedcli.config import build_config  # noqa: E402
from seedcli.envs.base import Environment  # noqa: E402
from seedcli.errors import UserError  # noqa: E402
from seedcli.stages import collect  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", required=True)
    ap.add_argument("--runs-dir", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tasks", required=True, help="task names or ids, ';'-separated")
    ap.add_argument("--rollouts", type=int, default=64)
    ap.add_argument("overrides", nargs="*", help="collect key=value overrides")
    args = ap.parse_args()
    wanted = [t.strip() for t in args.tasks.split(";") if t.strip()]
    cfg = build_config(
        "collect",
        args.config,
        {"runs_dir": args.runs_dir, "model": args.model, "rollouts": args.rollouts, "tasks": len(wanted)},
        args.overrides,
    )

    def select(self, tasks, n, seed, categories=None):  # the named tasks, in the order given
        by_name = {**{t.task_id: t for t in tasks}, **{t.name: t for t in tasks if t.name}}
        missing = [w for w in wanted if w not in by_name]
        if missing:
            raise UserError(f"no task named {missing[0]!r} in the {cfg.split} split: copy a name from samples.jsonl")
        return [by_name[w] for w in wanted]

    Environment.select_tasks = select
    manifest = collect.run(cfg)
    run_dir = Path(args.runs_dir) / "collect" / manifest.run_id
    import orjson

    wins: Counter[str] = Counter()
    plays: Counter[str] = Counter()
    for line in (run_dir / "trajectories.jsonl").read_bytes().splitlines():
        ep = orjson.loads(line)
        name = ep["task_id"]
        plays[name] += 1
        wins[name] += bool(ep["won"])
    ids = [t.task_id for t in select(None, collect.make_env(cfg).list_tasks(cfg.split), 0, 0)]
    for name in ids:
        print(f"{name}: {wins[name]}/{plays[name]} = {wins[name] / max(plays[name], 1):.1%}")
    total_w, total_n = sum(wins.values()), sum(plays.values())
    print(f"all: {total_w}/{total_n} = {total_w / max(total_n, 1):.1%}  ({run_dir})")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
