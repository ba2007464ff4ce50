"""The probe across environments as one markdown table (docs/skill-probe.md): a row per probe run under
RUNS/<env>/probe/ (scripts/probe_sweep.sh), the base model on expert-played held-out episodes, and where a warm start
was probed on its own episodes (RUNS/<env>/warm/probe/), its row beside.

    python scripts/probe_sweep_table.py runs/sweep
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _probe(run: Path) -> dict | None:
    path = run / "probe.json"
    if not path.exists():
        latest = run / "latest"
        path = latest / "probe.json" if latest.exists() else path
    return json.loads(path.read_text()) if path.exists() else None


def row(env: str, label: str, p: dict) -> str:
    c = p.get("contrasts", {}).get("oracle-oracle_shuffled")
    own = p.get("contrasts", {}).get("own-shuffled")
    none = p["contexts"]["oracle"]["action"]["all"].get("logp_none_mean") if "oracle" in p.get("contexts", {}) else None
    gap = p.get("play", {}).get("oracle") or {}
    cells = [
        env,
        label,
        f"{p['won']}/{p['episodes']}",
        f"{c['action_delta_mean']:+.3f} ± {c['action_delta_se']:.3f} ({c['episodes']}, {c['up']}↑ {c['down']}↓)"
        if c else "—",
        f"{c['action_delta_mean'] / c['action_delta_se']:+.1f}" if c and c["action_delta_se"] else "—",
        f"{own['action_delta_mean']:+.3f} ± {own['action_delta_se']:.3f} ({own['episodes']})" if own else "—",
        f"{none:.2f}" if none is not None else "—",
        f"{gap['gap_points']:+.1f} ± {gap['gap_se_points']:.1f} ({gap['tasks']})" if gap.get("tasks") else "—",
        f"{p.get('wall_time_s', 0):.0f}",
    ]
    return "| " + " | ".join(cells) + " |"


def main(root: str) -> None:
    print("| environment | model, episodes | won | oracle − another task's oracle, action tokens (N, up, down) | in SE "
          "| own − another task's own | ℓ_none, action | success gap with the oracle (played) | probe s |")
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|")
    for env_dir in sorted(Path(root).iterdir()):
        for label, sub in (("base, expert's episodes", "probe"), ("warm start, own episodes", "warm/probe")):
            p = _probe(env_dir / sub)
            if p is not None and "contrasts" in p:
                print(row(env_dir.name, label, p))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/sweep")
