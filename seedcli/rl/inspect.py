"""`seed inspect runs/rl/<id> --step N`: one sampled episode of an update with its hindsight skill and, for every
response token, the score shift ℓ_skill − ℓ_old (how much more likely the skill context makes the token the
policy sampled) and the OPD gate σ(β·shift) — the paper's "score shift for the same sampled actions under ordinary
and skill contexts". Green tokens are endorsed by the skill context, red ones rejected; stronger colour, larger shift.
Spans of the skill that the environment's leak rule finds are shown struck through on red (`skill_leaks`), and tokens
whose policy entropy is in the update's top 20% (forking positions, `entropy_threshold`) are underlined.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from seedcli.errors import UserError
from seedcli.records import read_jsonl

SAMPLES = "samples.jsonl"
SATURATE_NATS = 2.0  # |shift| at which the colour is fully saturated
LEAK_STYLE = "bold strike white on red"
HIGH_ENTROPY = "underline"


def read_samples(run: str | Path) -> list[dict]:
    """The samples.jsonl records of an rl run (the run directory or the file)."""
    path = Path(run)
    if path.is_dir():
        path = path / SAMPLES
    if not path.exists():
        raise UserError(
            f"{path}: not found; `seed inspect` takes an rl run directory (runs/rl/<id>/) whose updates logged "
            "samples (every `sample_every` updates)"
        )
    records = read_jsonl(path)
    if not records:
        raise UserError(f"{path}: no samples logged yet; inspect again after the run's first sampled update")
    return records


def pick_sample(records: list[dict], step: int | None) -> dict:
    """The record of update `step` (the latest when None); a missing step is a one-line error listing those present."""
    if step is None:
        return records[-1]
    for rec in records:
        if rec.get("step") == step:
            return rec
    steps = ", ".join(str(r.get("step")) for r in records)
    raise UserError(f"no sample logged at update {step}; updates with samples: {steps}")


def shift_style(shift: float | None) -> str:
    """Background colour for one token: green for ℓ_skill > ℓ_old, red for <, white-ish near 0."""
    if shift is None:
        return ""
    x = max(-1.0, min(1.0, shift / SATURATE_NATS))
    level = int(235 - 175 * abs(x))
    if x >= 0:
        return f"black on rgb({level},235,{level})"
    return f"black on rgb(235,{level},{level})"


def skill_text(skill: str, leaks: list) -> Any:
    """The skill as rich Text, each leaked [start, end) span styled LEAK_STYLE."""

    text = Text(skill, style="italic")
    for start, end in leaks:
        text.stylize(LEAK_STYLE, int(start), int(end))
    return text


def render_sample(rec: dict[str, Any]):
    """Rich renderables for one sample record."""

    out = []
    head = Text()
    head.append(f"update {rec.get('step')}  ", style="bold")
    head.append(f"{rec.get('category', rec.get('task_type', ''))}  ")  # task_type: samples written before env plug-ins
    head.append("WON" if rec.get("won") else "lost", style="bold green" if rec.get("won") else "bold red")
    score = rec.get("score")
    if isinstance(score, (int, float)) and not isinstance(score, bool) and 0.0 < score < 1.0:
        head.append(f"  score {score:.2f}")
    head.append(f"  ({len(rec.get('turns', []))} turns, episode {rec.get('episode_id', '?')})\n")
    head.append(f"task: {rec.get('task', '')}\n")
    skill = rec.get("skill")
    head.append("skill: ", style="bold")
    if skill:
        head.append_text(skill_text(skill, rec.get("skill_leaks") or []))
        if rec.get("skill_leaks"):
            guard = rec.get("leak_guard", "off")
            head.append(
                f"\n{len(rec['skill_leaks'])} leaked span(s) (struck through); leak_guard: {guard}", style="dim"
            )
    else:
        head.append(f"(none: {rec.get('skill_reason') or 'no valid skill'})", style="italic")
    out.append(Panel(head, title="seed inspect", expand=True))
    threshold = rec.get("entropy_threshold")

    for turn in rec.get("turns", []):
        shifts = turn.get("shift")
        gates = turn.get("gate")
        line = Text()
        line.append(f"turn {turn.get('turn')}: ", style="bold")
        line.append(f"action '{turn.get('action', '')}' ")
        line.append("valid" if turn.get("valid") else "INVALID", style="green" if turn.get("valid") else "red")
        line.append(f"  advantage {(turn.get('advantage') or 0.0) + 0.0:+.3f}")
        if shifts:
            line.append(f"  mean shift {sum(shifts) / len(shifts):+.3f}")
            line.append(f"  mean gate {sum(gates) / len(gates):.3f}")
        entropy = turn.get("entropy")
        high = [e >= threshold for e in entropy] if (entropy and threshold is not None) else []
        if high:  # after the shift figures, so a narrow terminal wraps this part, not them
            line.append(f"  high-entropy tokens {sum(high)}/{len(high)}")
        out.append(line)
        body = Text()
        for i, tok in enumerate(turn.get("tokens", [])):
            shown = tok.replace("\n", "⏎\n") or "∅"
            style = shift_style(shifts[i] if shifts and i < len(shifts) else None)
            if i < len(high) and high[i]:
                style = f"{style} {HIGH_ENTROPY}".strip()
            body.append(shown, style=style)
        out.append(body)
        if shifts:
            # the most endorsed and most rejected tokens, with numbers, for terminals without colour
            ranked = sorted(range(len(shifts)), key=lambda i: shifts[i])
            tokens = turn.get("tokens", [])

            def fmt(i: int, tokens=tokens, shifts=shifts, gates=gates) -> str:
                return f"{tokens[i]!r} {shifts[i]:+.2f} (g={gates[i]:.2f})"

            extra = Text(f"  most endorsed: {', '.join(fmt(i) for i in ranked[::-1][:3])}\n", style="dim")
            extra.append(f"  most rejected: {', '.join(fmt(i) for i in ranked[:3])}", style="dim")
            out.append(extra)
        out.append(Text(""))
    legend = Text("legend: ")
    legend.append(" ℓ_skill > ℓ_old ", style=shift_style(SATURATE_NATS))
    legend.append(" ≈ 0 ", style=shift_style(0.0))
    legend.append(" ℓ_skill < ℓ_old ", style=shift_style(-SATURATE_NATS))
    legend.append(f"  (saturates at ±{SATURATE_NATS:g} nats; gate = σ(β·shift), β = {rec.get('opd_beta', '?')})")
    if threshold is not None:
        legend.append("  ")
        legend.append("underlined", style=HIGH_ENTROPY)
        legend.append(f": entropy ≥ {threshold:.3f} (the update's top 20%)")
    out.append(legend)
    return out


def show_samples(run_dir: str | Path, step: int | None = None, console=None) -> dict:
    """Print the sample of update `step` (default: the latest) of an rl run; returns the record shown."""

    rec = pick_sample(read_samples(run_dir), step)
    console = console or Console()
    for item in render_sample(rec):
        console.print(item)
    return rec
