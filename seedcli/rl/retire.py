"""A teacher that retires: RetireOPD's Adaptive Retirement (arXiv 2609.20784, "RetireOPD: Self-Retiring On-Policy
Distillation for Agentic Reinforcement Learning", 2026).

The paper's rule, as its abstract states it: the student drops the teacher on its own once their discrepancy stops
shrinking and it reaches a target fraction of the teacher's success rate; training then proceeds with RL alone. Its
code is not public (ZJU-REAL/SDAR, the codebase it names, holds none at commit 8b85c23), so these parts are seedcli's
reading, not the authors' (docs/parity.md):
  - the discrepancy: the per-token estimate of KL(π_old ‖ teacher) on the student's own samples, ℓ_old − ℓ_skill
    averaged over the tokens with a skill (−`opd/shift_mean`), averaged over the updates since the last validation
  - "stops shrinking": `patience` validations in a row without a new smallest discrepancy
  - the student's success: `val/success_rate` at the validation (`val_every`); the teacher's: a number the user gives
    (`retire_teacher_success`): the paper trains a skill-conditioned teacher and measures it, seedcli's teacher is
    π_old reading a hindsight skill and never plays
  - retirement is decided only at validations, is permanent, and sets λ_opd to 0 from the next update on (no teacher
    pass either, as `opd_stop_after_steps`); no decay
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Retirement:
    """The state of the rule over a run (saved in each checkpoint, so a resumed run decides as an uninterrupted one)."""

    teacher_success: float
    fraction: float = 0.9
    patience: int = 1
    retired_at: int | None = None  # the validation step after which λ_opd is 0
    best_gap: float | None = None  # the smallest discrepancy seen at a validation
    stale: int = 0  # validations in a row since the discrepancy last reached a new smallest value
    window: list[float] = field(default_factory=list)  # discrepancies of the updates since the last validation

    @property
    def target(self) -> float:
        return self.fraction * self.teacher_success

    def observe_update(self, record: dict[str, Any]) -> None:
        """Keep the update's discrepancy (−opd/shift_mean) while the teacher still scores (λ_opd > 0)."""
        if self.retired_at is None and record.get("opd/coef", 0.0) > 0:
            self.window.append(-float(record.get("opd/shift_mean", 0.0)))

    def observe_validation(self, step: int, success: float) -> dict[str, float]:
        """Decide at the validation after update `step`; returns its `opd/retire_*` metrics."""
        gap = sum(self.window) / len(self.window) if self.window else None
        self.window = []
        if self.retired_at is None and gap is not None:
            if self.best_gap is None or gap < self.best_gap:
                self.best_gap, self.stale = gap, 0
            else:
                self.stale += 1
            if self.stale >= self.patience and success >= self.target:
                self.retired_at = step
        out = {
            "opd/retire_target": self.target,
            "opd/retire_stale": float(self.stale),
            "opd/retired": float(self.retired_at is not None),
        }
        if gap is not None:
            out["opd/retire_gap"] = gap
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"retired_at": self.retired_at, "best_gap": self.best_gap, "stale": self.stale, "window": self.window}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.retired_at = state.get("retired_at")
        self.best_gap = state.get("best_gap")
        self.stale = int(state.get("stale", 0))
        self.window = [float(x) for x in state.get("window", [])]


def retirement_for(cfg: Any, state: dict[str, Any] | None = None) -> Retirement | None:
    """The rule of an `opd_retire: adaptive` run (None otherwise), restored from a checkpoint's `state`."""
    if cfg.opd_retire != "adaptive":
        return None
    rule = Retirement(cfg.retire_teacher_success, cfg.retire_fraction, cfg.retire_patience)
    if state:
        rule.load_state_dict(state)
    return rule
