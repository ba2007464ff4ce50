"""docs/positive-control.md from a positive-control run directory (scripts/positive_control.py): every number read
from the run directories its index.json names.

    python scripts/positive_control_report.py --runs runs/pc -c configs/positive_control.yaml --out docs/positive-control.md

Per arm, over its seeds: success on the held-out test tasks (and, paired per task, against GRPO of the same seed at
the arm's learning rate); absorption against the start on the training panel and the held-out panel (`seed probe
--measure absorption --baseline`: each seed's paired mean over the panel's episodes, then the mean over seeds); the
OPD term's share of the gradient norm on ℓ_θ (`opd/grad_share`); the wall time of an update against GRPO's. Then each
arm against its control on the same panel episodes (the skill's information: X − X_shuffled) and against GRPO at its
learning rate (what the teacher adds to the outcome reward), pooled over seeds, ± its paired standard error.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from seedcli.report.probe import absorption_paired  # noqa: E402

MEASURES = {
    "expert_action_logp": "ℓ of the expert's action tokens (no skill), − start",
    "expert_final_action_logp": "ℓ of the expert's last action (search: the answer), − start",
    "own_gap": "oracle teacher's gap on own samples, − start",
}
# an arm's dose or sampling suffix: signed_oracle_lr1e4 is signed_oracle at lr 1e-4, signed_oracle_t1 at temperature 1
SUFFIX = re.compile(r"(_lr[0-9][0-9e.-]*|_t[0-9][0-9.]*)$")


def grpo_of(arm: str, arms) -> str | None:
    """The GRPO arm trained at the same dose as `arm` (signed_oracle_lr1e4 → grpo_lr1e4, signed_oracle → grpo), or
    None when the config has none (signed_oracle_t1: no GRPO at temperature 1) or `arm` is a GRPO arm itself."""
    if arm.startswith("grpo"):
        return None
    match = SUFFIX.search(arm.removesuffix("_shuffled"))
    grpo = "grpo" + (match.group(0) if match else "")
    return grpo if grpo in arms else None


def contrast_pairs(arms) -> list[tuple[str, str]]:
    """Each arm against its shuffled control (the skill's information), then each skill-reading arm against GRPO at
    its own dose (what the teacher adds to the outcome reward alone)."""
    pairs = [(a, f"{a}_shuffled") for a in arms if f"{a}_shuffled" in arms]
    pairs += [(a, grpo_of(a, arms)) for a in arms if not a.endswith("_shuffled") and grpo_of(a, arms)]
    return pairs


def mean_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    if n == 0:
        return float("nan"), float("nan")
    m = sum(values) / n
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1) / n) if n > 1 else float("nan")


def fmt(m: float, se: float, spec: str = "+.3f") -> str:
    if m != m:
        return "—"
    return f"{m:{spec}}" + (f" ± {se:{spec.lstrip('+')}}" if se == se else "")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _won(run: str) -> dict[str, float]:
    return {e["task_id"]: float(e["won"]) for e in _jsonl(Path(run) / "episodes.jsonl")}


def _rl_metrics(run: str) -> dict[str, float]:
    rows = [r for r in _jsonl(Path(run) / "metrics.jsonl") if "timing_s/update" in r]
    if not rows:
        return {}
    per_update = [sum(v for k, v in r.items() if k.startswith("timing_s/") and isinstance(v, (int, float)))
                  for r in rows]  # fmt: skip
    share = [r.get("opd/grad_share", 0.0) for r in rows]
    return {"update_s": sum(per_update) / len(per_update), "grad_share": sum(share) / len(share),
            "updates": len(rows)}  # fmt: skip


def collect(runs: Path, arms: list[str], seeds: list[int]) -> dict:
    index = json.loads((runs / "index.json").read_text())
    out: dict = {"start_won": _won(index["eval_start"]) if "eval_start" in index else {}, "arms": {}}
    for arm in arms:
        per_seed = {}
        for s in seeds:
            name = f"{arm}_s{s}"
            if f"eval_{name}" not in index:
                continue
            entry = {"won": _won(index[f"eval_{name}"]), **_rl_metrics(index[f"rl_{name}"])}
            for panel in ("train", "heldout"):
                probe = index.get(f"absorb_{name}_{panel}")
                start = index.get(f"absorb_start_train_s{s}" if panel == "train" else "absorb_start_heldout")
                if probe and start:
                    # paired here, against the start's newest probe on the same panel (a start probe rerun with
                    # more measures pairs with arms probed before it)
                    entry[f"{panel}_rows"] = _jsonl(Path(probe) / "absorption.jsonl")
                    entry[panel] = absorption_paired(_jsonl(Path(start) / "absorption.jsonl"), entry[f"{panel}_rows"])
            per_seed[s] = entry
        if per_seed:
            out["arms"][arm] = per_seed
    return out


def arm_rows(data: dict) -> list[str]:
    lines = []
    for arm, per_seed in data["arms"].items():
        seeds = sorted(per_seed)
        # success and update time against GRPO at the arm's own dose (a GRPO arm: against itself)
        grpo = per_seed if arm.startswith("grpo") else data["arms"].get(grpo_of(arm, data["arms"]) or "grpo", {})
        success = [100 * sum(per_seed[s]["won"].values()) / max(len(per_seed[s]["won"]), 1) for s in seeds]
        m, se = mean_se(success)
        vs = []
        for s in seeds:
            if grpo is not per_seed and s in grpo:
                both = sorted(set(per_seed[s]["won"]) & set(grpo[s]["won"]))
                vs.append(100 * sum(per_seed[s]["won"][t] - grpo[s]["won"][t] for t in both) / max(len(both), 1))
        cells = [arm, str(len(seeds)), fmt(m, se, ".1f"), fmt(*mean_se(vs), "+.1f") if vs else "—"]
        for panel in ("train", "heldout"):
            for key in MEASURES:
                vals = [per_seed[s][panel][key]["mean"] for s in seeds if key in per_seed[s].get(panel, {})]
                cells.append(fmt(*mean_se(vals)) if vals else "—")
        share = [per_seed[s]["grad_share"] for s in seeds if "grad_share" in per_seed[s]]
        cells.append(f"{sum(share) / len(share):.2f}" if share else "—")
        upd = [per_seed[s]["update_s"] for s in seeds if "update_s" in per_seed[s]]
        g_upd = [grpo[s]["update_s"] for s in seeds if s in grpo and "update_s" in grpo[s]]
        ratio = f" ({(sum(upd) / len(upd)) / (sum(g_upd) / len(g_upd)):.2f}×)" if upd and g_upd else ""
        cells.append(f"{sum(upd) / len(upd):.0f}{ratio}" if upd else "—")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def contrast_rows(data: dict) -> list[str]:
    """Each arm against its control on the same panel episodes (contrast_pairs: its shuffled control, and GRPO at its
    own dose): per-episode differences pooled over the seeds both ran (N = seeds × panel episodes), ± their paired
    SE; and the per-seed means."""
    lines = []
    arms = data["arms"]
    for arm, control in contrast_pairs(arms):
        # success on the eval tasks, paired per task within a seed, pooled over the seeds both ran (in points)
        pooled, per_seed = [], []
        for s in sorted(set(arms[arm]) & set(arms[control])):
            a, b = arms[arm][s]["won"], arms[control][s]["won"]
            d = [100.0 * (a[t] - b[t]) for t in sorted(set(a) & set(b))]
            if d:
                pooled += d
                per_seed.append(f"{sum(d) / len(d):+.1f}")
        if pooled:
            m, se = mean_se(pooled)
            z = f"{m / se:+.1f}" if se and se == se else "—"
            lines.append(f"| {arm} − {control} | eval tasks | success (points) | {m:+.1f} ± {se:.1f} | {z} | "
                         f"{len(pooled)} | {sum(x > 0 for x in pooled)}/{sum(x < 0 for x in pooled)} | "
                         f"{', '.join(per_seed)} |")  # fmt: skip
        for panel in ("train", "heldout"):
            for key in MEASURES:
                pooled, per_seed = [], []
                for s in sorted(set(arms[arm]) & set(arms[control])):
                    a = {
                        r["episode_id"]: r[key] for r in arms[arm][s].get(f"{panel}_rows", []) if r.get(key) is not None
                    }
                    b = {r["episode_id"]: r[key] for r in arms[control][s].get(f"{panel}_rows", [])
                         if r.get(key) is not None}  # fmt: skip
                    d = [a[e] - b[e] for e in sorted(set(a) & set(b))]
                    if d:
                        pooled += d
                        per_seed.append(f"{sum(d) / len(d):+.3f}")
                if pooled:
                    m, se = mean_se(pooled)
                    z = f"{m / se:+.1f}" if se and se == se else "—"
                    lines.append(f"| {arm} − {control} | {panel} | {MEASURES[key].split(',')[0]} | {fmt(m, se)} | "
                                 f"{z} | {len(pooled)} | {sum(x > 0 for x in pooled)}/{sum(x < 0 for x in pooled)} | "
                                 f"{', '.join(per_seed)} |")  # fmt: skip
    return lines


def plot(data: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(data["arms"])
    fig, axes = plt.subplots(1, len(MEASURES), figsize=(5.5 * len(MEASURES), 3.8))
    for ax, key in zip(axes, MEASURES, strict=True):
        for k, panel in enumerate(("train", "heldout")):
            ms, ses = [], []
            for arm in arms:
                vals = [e[panel][key]["mean"] for e in data["arms"][arm].values() if key in e.get(panel, {})]
                m, se = mean_se(vals) if vals else (0.0, 0.0)
                ms.append(m if m == m else 0.0)
                ses.append(se if se == se else 0.0)
            ax.bar([i + (k - 0.5) * 0.38 for i in range(len(arms))], ms, 0.38, yerr=ses, label=f"{panel} panel")
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(arms)), arms, rotation=25, ha="right", fontsize=8)
        ax.set_title(MEASURES[key], fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", required=True)
    ap.add_argument("-c", "--config", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cfg = yaml.safe_load(Path(args.config).read_text())
    pc = cfg["positive_control"]
    data = collect(Path(args.runs), list(pc["arms"]), pc["seeds"])
    out = Path(args.out)
    assets = out.with_suffix("")
    assets.mkdir(parents=True, exist_ok=True)
    plot(data, assets / "absorption.png")
    start = data["start_won"]
    short = {
        "expert_action_logp": "ℓ expert action",
        "expert_final_action_logp": "ℓ expert's last action",
        "own_gap": "own gap",
    }
    cols = [f"{panel}: {short[k]} − start" for panel in ("train", "held-out") for k in MEASURES]
    head = [
        "| arm | seeds | success % (mean ± SE over seeds) | − GRPO at its lr, paired per task (points) | "
        + " | ".join(cols)
        + " | OPD share of ‖∇ℓ‖ | s an update (× GRPO at its lr) |",
        "|---|--:|--:|--:|" + "--:|" * len(cols) + "--:|--:|",
    ]
    contrast_head = [
        "| arm − control | panel | measure | mean ± paired SE (nats; success: points) | in SE | N | up/down | per seed |",
        "|---|---|---|--:|--:|--:|--:|---|",
    ]
    table = "\n".join(head + arm_rows(data))
    contrast = "\n".join(contrast_head + contrast_rows(data))
    start_text = f"{100 * sum(start.values()) / len(start):.1f}% of {len(start)}" if start else "—"
    (assets / "tables.md").write_text(f"start: {start_text}\n\n{table}\n\n{contrast}\n")
    print(f"start {start_text}\n{table}\n\n{contrast}")


if __name__ == "__main__":
    main()
