"""The GPU smoke's checks (scripts/gpu_smoke.py), as a pure function of what the runs wrote, so that each check can
be shown to fail on CPU when the thing it checks is broken (tests/unit/test_gpu_smoke_checks.py).

`results` = {"card_gib", "total_wall_s", "time_limit_s", "runs": {name: run}}, each run = {"rc", "steps", "world",
"lr", "expect_checksums", "metrics": [metrics.jsonl records], "checkpoint_dtype", "wall_s", "plan" (optional),
"expect_opd" (optional: a run on static skills, whose teacher pass must train OPD tokens)}.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PHASES = ("rollout", "analyze", "sleep", "rescore", "update", "refresh")
REQUIRED = (
    "reward/mean", "rollout/success_rate", "actor/pg_loss", "actor/kl", "actor/entropy", "actor/grad_norm",
    "opd/loss", "opd/gate_mean", "timing_s/rollout", "timing_s/rescore", "timing_s/update", "timing_s/sync",
    "sync/probe_mean_abs_diff", "sync/probe_drift", "sync/checksum_tensors",
)  # fmt: skip
PROBE_TOL = 0.05  # drift of the engine-vs-trainer mean |Δ log-prob| on the probe beyond its first-check calibration
SLEEP_FREES_GIB = 1.0  # a level-2 sleep must hand back at least this much of vLLM's share


@dataclass
class Check:
    name: str
    ok: bool | None  # None: not applicable here (e.g. one GPU), reported as skipped
    detail: str = ""


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(float(x))


def evaluate(results: dict) -> list[Check]:
    """Every check of the smoke, in report order."""
    out: list[Check] = []
    card = float(results.get("card_gib", 0.0))
    for name, run in results.get("runs", {}).items():
        out += _run_checks(name, run, card)
    limit = float(results.get("time_limit_s", 600))
    wall = float(results.get("total_wall_s", math.inf))
    out.append(Check(f"whole smoke under {limit / 60:.0f} minutes", wall <= limit, f"{wall:.0f} s"))
    return out


def _run_checks(name: str, run: dict, card: float) -> list[Check]:
    """The checks of one `seed rl` run of the smoke (`card`: the GPU's memory in GiB)."""
    out: list[Check] = []
    recs = run.get("metrics", [])
    out.append(Check(f"{name}: seed rl exited 0", run.get("rc") == 0, f"rc={run.get('rc')}"))
    out.append(
        Check(
            f"{name}: one metrics record per update",
            len(recs) == run.get("steps"),
            f"{len(recs)}/{run.get('steps')}",
        )
    )
    missing = sorted({k for r in recs for k in REQUIRED if not _finite(r.get(k))})
    out.append(
        Check(f"{name}: every required metric present and finite", bool(recs) and not missing, ", ".join(missing))
    )
    want = int(run.get("expect_checksums", 1))
    got = [r.get("sync/checksum_tensors", 0) for r in recs]
    out.append(
        Check(
            f"{name}: exact weight checksum verified after every refresh (>= {want} tensors)",
            bool(recs) and all(_finite(g) and g >= want for g in got),
            f"tensors per update {got}",
        )
    )
    drifts = [r.get("sync/probe_drift") for r in recs]
    out.append(
        Check(
            f"{name}: probe stays within its calibration (secondary check; the run only warns)",
            bool(recs) and all(_finite(d) and d <= PROBE_TOL and not r.get("sync/probe_warn")
                               for d, r in zip(drifts, recs, strict=True)),
            f"drift {drifts}, mean |Δ| {[r.get('sync/probe_mean_abs_diff') for r in recs]}",
        )
    )  # fmt: skip
    if run.get("expect_opd"):
        fracs = [r.get("opd/token_frac") for r in recs]
        out.append(
            Check(
                f"{name}: OPD trained on static skills (opd/token_frac > 0 every update)",
                bool(recs) and all(_finite(f) and f > 0 for f in fracs),
                f"opd/token_frac {fracs}",
            )
        )
    lrs = {r.get("actor/lr") for r in recs}
    out.append(
        Check(f"{name}: trained at lr {run.get('lr')}", lrs == {run.get("lr")}, f"actor/lr {sorted(map(str, lrs))}")
    )
    if run.get("world", 1) >= 2:
        pad = sum(
            (r.get("dist/padding_forwards_rescore") or 0) + (r.get("dist/padding_micro_batches") or 0) for r in recs
        )
        out.append(
            Check(
                f"{name}: ranks held unequal shares and padded (no hang)",
                pad > 0 and run.get("rc") == 0,
                f"padding {pad}",
            )
        )
    else:
        out.append(Check(f"{name}: ranks held unequal shares and padded (no hang)", None, "one rank"))
    if run.get("self_analyzer"):
        ran = [r.get("timing_s/analyze", 0) for r in recs]
        out.append(
            Check(f"{name}: the self-analyzer ran every update", bool(recs) and all(t > 0 for t in ran), f"{ran}")
        )
    mem_missing = sorted({p for r in recs for p in PHASES if not _finite(r.get(f"mem/{p}/peak_allocated_gib"))})
    out.append(
        Check(f"{name}: GPU memory reported for every phase", bool(recs) and not mem_missing, ", ".join(mem_missing))
    )
    freed = [(r.get("mem/analyze/device_used_gib") or 0) - (r.get("mem/sleep/device_used_gib") or 0) for r in recs]
    out.append(
        Check(
            f"{name}: vLLM sleep hands its memory back (>= {SLEEP_FREES_GIB} GiB)",
            bool(recs) and all(f >= SLEEP_FREES_GIB for f in freed),
            "freed GiB " + ", ".join(f"{f:.1f}" for f in freed),
        )
    )
    peaks = [max((r.get(f"mem/{p}/peak_reserved_gib") or 0) for p in PHASES) for r in recs]
    out.append(
        Check(
            f"{name}: trainer peak fits the card ({card:.0f} GiB)",
            bool(recs) and card > 0 and all(p <= 0.95 * card for p in peaks),
            "peak reserved GiB " + ", ".join(f"{p:.1f}" for p in peaks),
        )
    )
    if run.get("checkpoint_dtype") is not None or run.get("expect_checkpoint_dtype"):
        want_dtype = run.get("expect_checkpoint_dtype", "bfloat16")
        out.append(
            Check(
                f"{name}: checkpoint model saved in {want_dtype}",
                run.get("checkpoint_dtype") == want_dtype,
                f"config dtype {run.get('checkpoint_dtype')}",
            )
        )
    return out


def table(checks: list[Check]) -> str:
    """One line per check: ok / FAIL / skip."""
    mark = {True: "ok", False: "FAIL", None: "skip"}
    return "\n".join(f"[{mark[c.ok]:>4}] {c.name}" + (f"  ({c.detail})" if c.detail else "") for c in checks)


def failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.ok is False]
