"""The training panel of the positive control (docs/positive-control.md): the expert plays the very tasks an rl run
trains on, so that `seed probe --measure absorption` can read, on those states, what the run's teacher taught.

`seed rl` draws its training tasks with `TaskSampler` (seedcli/rl/sampler.py): the split's seeded, category-balanced
order, its first `train_fraction`. This rebuilds that pool for a seed and plays it with `seed eval --policy expert`
(one episode a task, an ordinary eval run that `seed probe --from` reads; `seed eval` refuses a training split,
which this script alone lets it play).

    python scripts/expert_panel.py --env webshop --seed 0 --train-fraction 0.0015 --runs-dir runs/pc/panel-train-s0

Prints the eval run's directory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from seedcli.config import build_config  # noqa: E402
from seedcli.envs.base import Environment  # noqa: E402
from seedcli.errors import UserError  # noqa: E402
from seedcli.rl.sampler import TaskSampler  # noqa: E402
from seedcli.stages import eval as eval_stage  # noqa: E402
from seedcli.stages.common import make_env  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", required=True)
    ap.add_argument("--seed", type=int, required=True, help="the rl run's seed")
    ap.add_argument("--train-fraction", type=float, required=True, help="the rl run's train_fraction")
    ap.add_argument("--split", default="train", help="the rl run's split")
    ap.add_argument("--runs-dir", required=True)
    ap.add_argument("overrides", nargs="*", help="eval key=value overrides (env_options, max_steps)")
    args = ap.parse_args()
    base = {"env": args.env, "runs_dir": args.runs_dir, "policy": "expert", "split": args.split, "seed": args.seed}
    cfg = build_config("eval", None, base, args.overrides)
    env = make_env(cfg)
    tasks = env.list_tasks(env.resolve_split(args.split))
    pool = TaskSampler(tasks, 1, args.seed, args.train_fraction).pool  # batch_tasks does not change the pool
    ids = {t.task_id for t in pool}

    def select(self, tasks, n, seed, categories=None):  # the rl run's pool, whatever --limit asks
        return [t for t in tasks if t.task_id in ids]

    Environment.select_tasks = select
    # eval plays evaluation splits only; here the rl split is the point (this process only)
    type(env).eval_splits = (*env.eval_splits, env.resolve_split(args.split))
    cfg = build_config("eval", None, {**base, "limit": len(pool)}, args.overrides)
    manifest = eval_stage.run(cfg)
    print(Path(args.runs_dir) / "eval" / manifest.run_id)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
