"""What `seed probe` reports (seedcli/stages/probe.py measures it): for each context a skill can give the teacher,
how far it moves the log-prob of each response token the policy sampled, Δ = ℓ_ctx − ℓ_none, on the tokens of the
action and on the others, split by won and lost episodes; how each episode's mean Δ goes with its advantage; and,
when the tasks were played again with the skill in the prompt, the success against playing without it.

Pure functions of the scores (lists and tensors): `summarise` makes probe.json's numbers, `table` the printed table,
`plot` probe.png.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.table import Table

# the contexts the probe compares with the ordinary prompt ("none"), in report order
CONTEXTS = ("null", "own", "shuffled", "oracle", "oracle_shuffled")
LABELS = {
    "none": "no skill",
    "null": "null (neutral text)",
    "own": "own skill",
    "shuffled": "own skill of another task",
    "oracle": "oracle (privileged)",
    "oracle_shuffled": "oracle of another task",
}
BIG = 1.0  # nats: the share of tokens moved by more than this is reported


@dataclass
class TurnScores:
    """One re-scored reply: its episode, the episode's outcome and advantage, which response tokens spell the action,
    and the log-prob of each response token under each context it was scored in."""

    episode: int
    won: bool
    advantage: float
    action: list[bool]
    logp: dict[str, torch.Tensor] = field(default_factory=dict)


def _part_stats(turns: Sequence[TurnScores], ctx: str, part: str) -> dict[str, Any]:
    """Δ = ℓ_ctx − ℓ_none over the `part` tokens (action | other | all) of `turns` scored under `ctx`."""
    deltas, absmax, logp, base = [], [], [], []
    for t in turns:
        if ctx not in t.logp:
            continue
        sel = torch.tensor(t.action) if part == "action" else ~torch.tensor(t.action) if part == "other" else None
        d = t.logp[ctx] - t.logp["none"]
        if sel is not None:
            d, lc, ln = d[sel], t.logp[ctx][sel], t.logp["none"][sel]
        else:
            lc, ln = t.logp[ctx], t.logp["none"]
        if d.numel() == 0:
            continue
        deltas.append(d)
        logp.append(lc)
        base.append(ln)
        absmax.append(float(d.abs().max()))
    if not deltas:
        return {"tokens": 0, "replies": 0}
    d, lc, ln = torch.cat(deltas).double(), torch.cat(logp).double(), torch.cat(base).double()
    return {
        "tokens": int(d.numel()),
        "replies": len(absmax),
        "delta_mean": float(d.mean()),
        "reply_absmax_mean": sum(absmax) / len(absmax),  # each reply's largest |Δ|, averaged over replies
        "share_over_1": float((d.abs() > BIG).double().mean()),
        "logp_mean": float(lc.mean()),  # ℓ_ctx itself, and ℓ_none on the same tokens
        "logp_none_mean": float(ln.mean()),
    }


def pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    """The correlation of two equal-length sequences; None with fewer than 3 pairs or a constant side."""
    if len(x) < 3:
        return None
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sx = math.sqrt(sum((a - mx) ** 2 for a in x))
    sy = math.sqrt(sum((b - my) ** 2 for b in y))
    if sx == 0 or sy == 0:
        return None
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / (sx * sy)


def summarise(turns: Sequence[TurnScores], contexts: Sequence[str] = CONTEXTS) -> dict[str, Any]:
    """probe.json's `contexts`: per context, Δ on action / other / all tokens for all, won and lost episodes, and the
    correlation of each episode's mean Δ (over its response tokens) with its advantage."""
    out: dict[str, Any] = {}
    for ctx in contexts:
        scored = [t for t in turns if ctx in t.logp]
        if not scored:
            continue
        entry: dict[str, Any] = {"episodes": len({t.episode for t in scored}), "replies": len(scored)}
        for part in ("action", "other", "all"):
            entry[part] = {
                outcome: _part_stats([t for t in scored if outcome == "all" or t.won == (outcome == "won")], ctx, part)
                for outcome in ("all", "won", "lost")
            }
        by_episode: dict[int, list[torch.Tensor]] = {}
        advantage: dict[int, float] = {}
        for t in scored:
            by_episode.setdefault(t.episode, []).append(t.logp[ctx] - t.logp["none"])
            advantage[t.episode] = t.advantage
        means = {e: float(torch.cat(ds).double().mean()) for e, ds in by_episode.items() if sum(map(len, ds))}
        entry["corr_delta_advantage"] = pearson([means[e] for e in means], [advantage[e] for e in means])
        out[ctx] = entry
    return out


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """The mean of paired differences (one per episode or task) and its standard error; nan with one value."""
    n = len(values)
    mean = sum(values) / n
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n) if n > 1 else float("nan")


# (context, its control): what the skill's own information does, beyond any skill's presence, is the first minus the
# second on the same action tokens
CONTRASTS = (("own", "shuffled"), ("oracle", "oracle_shuffled"))


def contrasts(turns: Sequence[TurnScores], pairs: Sequence[tuple[str, str]] = CONTRASTS) -> dict[str, Any]:
    """probe.json's `contrasts`: per (context, control) pair, each episode's mean of ℓ_ctx − ℓ_control over its
    action tokens scored under both, then the mean over episodes, its paired standard error, and how many episodes
    each way. A skill that carries nothing the model reads gives 0 within its SE."""
    out: dict[str, Any] = {}
    for ctx, control in pairs:
        by_episode: dict[int, list[torch.Tensor]] = {}
        for t in turns:
            if ctx in t.logp and control in t.logp and any(t.action):
                sel = torch.tensor(t.action)
                by_episode.setdefault(t.episode, []).append((t.logp[ctx] - t.logp[control])[sel])
        means = [float(torch.cat(ds).double().mean()) for ds in by_episode.values()]
        if not means:
            continue
        mean, se = mean_se(means)
        out[f"{ctx}-{control}"] = {"episodes": len(means), "action_delta_mean": mean, "action_delta_se": se,
                                   "up": sum(m > 0 for m in means), "down": sum(m < 0 for m in means)}  # fmt: skip
    return out


def paired_gap(base: dict[str, bool], other: dict[str, bool]) -> dict[str, Any]:
    """Success with a context against without it over the tasks both played (task id → won): the rates, the mean
    paired difference in points and its standard error, and how many tasks each way."""
    tasks = sorted(set(base) & set(other))
    if not tasks:
        return {"tasks": 0}
    diffs = [float(other[t]) - float(base[t]) for t in tasks]
    n = len(diffs)
    mean, se = mean_se(diffs)
    return {
        "tasks": n,
        "success_none": sum(base[t] for t in tasks) / n,
        "success": sum(other[t] for t in tasks) / n,
        "gap_points": 100 * mean,
        "gap_se_points": 100 * se,
        "gained": sum(d > 0 for d in diffs),
        "lost": sum(d < 0 for d in diffs),
    }


def _fmt(x: Any, spec: str = "+.3f") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def table(result: dict[str, Any]):
    """A rich Table of probe.json: one row per context."""
    t = Table(title=f"seed probe: Δ = ℓ_ctx − ℓ_none (nats a token), {result['episodes']} episodes")
    for col in ("context", "eps", "Δ action won", "Δ action lost", "Δ other", "max|Δ| action", ">1 nat action",
                "ℓ action", "corr(Δ, A)", "success gap"):  # fmt: skip
        t.add_column(col, justify="left" if col == "context" else "right")
    for ctx, e in result["contexts"].items():
        act, other = e["action"], e["other"]
        gap = result.get("play", {}).get(ctx)
        gap_text = (
            f"{gap['gap_points']:+.1f} ± {gap['gap_se_points']:.1f} ({gap['tasks']})"
            if gap and gap.get("tasks")
            else "—"
        )
        t.add_row(
            LABELS.get(ctx, ctx),
            str(e["episodes"]),
            _fmt(act["won"].get("delta_mean")),
            _fmt(act["lost"].get("delta_mean")),
            _fmt(other["all"].get("delta_mean")),
            _fmt(act["all"].get("reply_absmax_mean"), ".3f"),
            _fmt(act["all"].get("share_over_1"), ".1%"),
            _fmt(act["all"].get("logp_mean"), ".3f"),
            _fmt(e["corr_delta_advantage"], "+.2f"),
            gap_text,
        )
    for name, c in result.get("contrasts", {}).items():
        t.caption = (t.caption + "\n" if t.caption else "") + (
            f"{name.replace('-', ' − ')} on action tokens: {c['action_delta_mean']:+.3f} ± {c['action_delta_se']:.3f} "
            f"nats ({c['episodes']} episodes, {c['up']} up, {c['down']} down)"
        )
    return t


def plot(result: dict[str, Any], out: Path) -> None:
    """probe.png: mean Δ on action tokens per context for won and lost episodes, and (when played) the success under
    each context beside none's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ctxs = list(result["contexts"])
    played = {c: g for c, g in result.get("play", {}).items() if g.get("tasks")}
    fig, axes = plt.subplots(1, 2 if played else 1, figsize=(11 if played else 6.5, 3.8), squeeze=False)
    ax = axes[0][0]
    width = 0.38
    for k, outcome in enumerate(("won", "lost")):
        values = [result["contexts"][c]["action"][outcome].get("delta_mean") or 0.0 for c in ctxs]
        ax.bar([i + (k - 0.5) * width for i in range(len(ctxs))], values, width, label=outcome)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(ctxs)), [LABELS.get(c, c) for c in ctxs], rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("mean Δ on action tokens (nats)")
    ax.set_title("what the skill does to the teacher")
    ax.legend(fontsize=8)
    if played:
        ax2 = axes[0][1]
        names = list(played)
        ax2.bar(range(len(names)), [100 * played[c]["success"] for c in names], 0.6, label="with the context")
        ax2.scatter(range(len(names)), [100 * played[c]["success_none"] for c in names], color="black", zorder=3,
                    label="without (same tasks)")  # fmt: skip
        ax2.set_xticks(range(len(names)), [LABELS.get(c, c) for c in names], rotation=25, ha="right", fontsize=8)
        ax2.set_ylabel("success (%)")
        ax2.set_title("playing with the context in the prompt")
        ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------------- absorption
# What distillation moves, read off the student itself on a fixed panel of states (expert-played episodes): the
# student's log-prob, with no skill in its prompt, of the expert's action tokens (a student that absorbed what the
# oracle-informed teacher prefers writes the expert's action more likely), and the teacher gap on the student's own
# samples at those states, ℓ_oracle − ℓ_none (a student that absorbed it has less left to be taught: the gap closes;
# on samples drawn at temperature 1 it is −KL(π_none ‖ π_oracle) ≤ 0, so it rises toward 0).
# Each is one number per panel episode, so two models on the same panel pair episode by episode.

ABSORPTION = ("expert_action_logp", "expert_final_action_logp", "own_gap", "own_gap_action")


def _mean_over(tensors: Sequence[torch.Tensor]) -> tuple[float | None, int]:
    """The mean of every element of `tensors` together, and how many there were (None, 0 when none)."""
    flat = [t.double() for t in tensors if t.numel()]
    if not flat:
        return None, 0
    cat = torch.cat(flat)
    return float(cat.mean()), int(cat.numel())


def absorption_rows(
    episode_ids: Sequence[str], expert: Sequence[TurnScores], own: Sequence[TurnScores]
) -> list[dict[str, Any]]:
    """One row per panel episode (`TurnScores.episode` indexes `episode_ids`):
    - expert_action_logp: the mean of ℓ_none over the expert's action tokens (`expert`: the expert's replies scored
      with no skill, in turn order), the episode's tokens pooled; expert_final_action_logp: the same over its last
      turn's action alone (search: the answer; a turn the oracle names outright), and expert_turns each turn's;
    - own_gap: the mean of ℓ_oracle − ℓ_none over every token of the student's own samples at the episode's states
      (`own`: scored under none and oracle); own_gap_action: the same over the tokens that spell each sample's action.
    A measure the episode has no token for is None."""
    rows = []
    for e, episode_id in enumerate(episode_ids):
        mine = [t for t in expert if t.episode == e]
        logp, n_expert = _mean_over([t.logp["none"][torch.tensor(t.action, dtype=torch.bool)] for t in mine])
        per_turn = [_mean_over([t.logp["none"][torch.tensor(t.action, dtype=torch.bool)]])[0] for t in mine]
        final = next((m for m in reversed(per_turn) if m is not None), None)
        samples = [t for t in own if t.episode == e and "oracle" in t.logp]
        gaps = [t.logp["oracle"] - t.logp["none"] for t in samples]
        gap, n_own = _mean_over(gaps)
        gap_action, n_action = _mean_over(
            [g[torch.tensor(t.action, dtype=torch.bool)] for g, t in zip(gaps, samples, strict=True)]
        )
        rows.append({"episode_id": episode_id, "expert_action_logp": logp, "expert_action_tokens": n_expert,
                     "expert_final_action_logp": final, "expert_turns": per_turn, "own_gap": gap, "own_tokens": n_own,
                     "own_gap_action": gap_action, "own_action_tokens": n_action})  # fmt: skip
    return rows


def absorption_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per measure: the mean over the panel's episodes that have it, its standard error and N."""
    out: dict[str, Any] = {}
    for key in ABSORPTION:
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            mean, se = mean_se(values)
            out[key] = {"mean": mean, "se": se, "episodes": len(values)}
    return out


def absorption_paired(base: Sequence[dict[str, Any]], other: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """`other` − `base` per measure over the panel episodes both have it for (matched by episode id): the mean
    paired difference, its standard error, N, and the episodes up and down. Absorption shows as expert_action_logp
    up and own_gap toward 0 (up from below)."""
    by_id = {r["episode_id"]: r for r in base}
    out: dict[str, Any] = {}
    for key in ABSORPTION:
        diffs = [
            r[key] - by_id[r["episode_id"]][key]
            for r in other
            if r.get(key) is not None and by_id.get(r["episode_id"], {}).get(key) is not None
        ]
        if diffs:
            mean, se = mean_se(diffs)
            out[key] = {"mean": mean, "se": se, "episodes": len(diffs), "up": sum(d > 0 for d in diffs),
                        "down": sum(d < 0 for d in diffs)}  # fmt: skip
    return out


def absorption_table(result: dict[str, Any]):
    """A rich Table of probe.json's absorption: per measure the panel's mean ± SE, and against the baseline probe
    when one was given."""
    t = Table(title=f"seed probe: absorption on {len(result['absorption']['episodes'])} panel episodes")
    paired = result.get("absorption_vs_baseline") or {}
    for col in ("measure", "mean ± SE", "episodes", "− baseline (paired)", "up/down"):
        t.add_column(col, justify="left" if col == "measure" else "right")
    names = {"expert_action_logp": "ℓ of the expert's action tokens, no skill",
             "expert_final_action_logp": "  … of its last action alone",
             "own_gap": "teacher gap on own samples (oracle − none)",
             "own_gap_action": "  … on their action tokens"}  # fmt: skip
    for key, s in result["absorption"]["summary"].items():
        p = paired.get(key)
        t.add_row(names[key], f"{s['mean']:+.3f} ± {_fmt(s['se'], '.3f')}", str(s["episodes"]),
                  f"{p['mean']:+.3f} ± {_fmt(p['se'], '.3f')}" if p else "—",
                  f"{p['up']}/{p['down']}" if p else "—")  # fmt: skip
    return t
