"""Which recorded rl updates could have trained a uniform group's rounding noise, before `group_advantages` gave
such a group exactly 0. Reads each rl run's metrics.jsonl in a method-check record.

A group whose turn scores are all equal should get advantage 0, and with zero_adv drop its samples are not trained.
On EZPoints a turn scores 10·won − 0.1·invalid, so the only equal scores a float mean cannot reproduce are a lost
group's with every turn invalid (all −0.1: ±1.4e-11 before the fix, counted non-zero and trained). An update could
hold such a group only if (a) one of its groups was all lost or all won (`adv/mixed_group_frac` < 1), (b) at least
`group` of its turns were invalid (that group's every turn, each of its `group` episodes having one turn or more),
and (c) fewer of its turn-samples had advantage exactly 0 than the uniform groups hold. The metrics cannot tell more;
the count printed for such updates, their invalid turns, is an upper bound on the turn-samples trained on noise.
Usage:
    python scripts/zero_adv_audit.py docs/method-check/record [more records]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml


def audit(run: Path) -> tuple[int, int, int, int]:
    """(updates, updates that could be affected, turn-samples affected at the most, turn-samples) of one rl run."""
    config = yaml.safe_load((run / "config.yaml").read_text())
    group, tasks = int(config["group"]), int(config["batch_tasks"])
    updates = affected = samples = total = 0
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "adv/zero_frac" not in m:
            continue
        updates += 1
        n = int(m["rollout/turn_samples"])
        total += n
        zeros = round(float(m["adv/zero_frac"]) * n)
        uniform = round((1.0 - float(m["adv/mixed_group_frac"])) * tasks)
        invalid = round(float(m["env/invalid_rate"]) * n)
        if uniform and invalid >= group and zeros < uniform * group:
            affected += 1
            samples += invalid
    return updates, affected, samples, total


def main(records: list[str]) -> None:
    for record in records:
        runs = sorted(p for p in (Path(record) / "rl").glob("*") if (p / "metrics.jsonl").exists())
        totals = [0, 0, 0, 0]
        for run in runs:
            u, a, s, n = audit(run)
            totals = [t + x for t, x in zip(totals, (u, a, s, n), strict=True)]
            if a:
                print(f"  {run.name}: {a} of {u} updates could be, <= {s} turn-samples")
        print(
            f"{record}: {len(runs)} rl runs, {totals[0]} updates, {totals[1]} could be affected, "
            f"<= {totals[2]} of {totals[3]} turn-samples"
        )


if __name__ == "__main__":
    main(sys.argv[1:] or ["docs/method-check/record"])
