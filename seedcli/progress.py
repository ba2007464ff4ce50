"""Progress reporting: a rich bar on a terminal, plain periodic lines otherwise (CI logs, nohup, pipes)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from seedcli.errors import UserError


class StageProgress:
    """`with StageProgress("collect", total) as p: p.advance(1, success=0.3)`; extra fields show beside the bar."""

    def __init__(self, label: str, total: int, enabled: bool = True, every_s: float | None = None):
        self.label = label
        self.total = total
        self.done = 0
        self.fields: dict[str, Any] = {}
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        # plain lines at most this often (off a terminal); $SEEDCLI_PROGRESS_S sets it for every stage
        self._every = every_s if every_s is not None else _env_interval()
        self._last = 0.0
        self._t0 = time.time()
        self._progress: Progress | None = None
        self._task = None

    def __enter__(self) -> StageProgress:
        if self.enabled and self.tty:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
                console=Console(stderr=True),
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=self.total, info="")
        return self

    def _info(self) -> str:
        parts = []
        for k, v in self.fields.items():
            if v is None:  # a field cleared (rl's `now` between updates)
                continue
            parts.append(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}")
        return " ".join(parts)

    def advance(self, n: int = 1, **fields: Any) -> None:
        self.done += n
        self.fields.update(fields)
        if not self.enabled:
            return
        if self._progress is not None:
            self._progress.update(self._task, advance=n, info=self._info())
            return
        now = time.time()
        if now - self._last >= self._every or self.done >= self.total:
            self._last = now
            elapsed = now - self._t0
            left = f" ~{elapsed / self.done * (self.total - self.done):.0f}s left" if 0 < self.done < self.total else ""
            print(f"[{self.label}] {self.done}/{self.total} {elapsed:.0f}s{left} {self._info()}", file=sys.stderr,
                  flush=True)  # fmt: skip

    def update(self, **fields: Any) -> None:
        self.advance(0, **fields)

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()


def _env_interval(default: float = 30.0) -> float:
    """Seconds between plain progress lines from $SEEDCLI_PROGRESS_S (unset or empty: `default`)."""
    text = os.environ.get("SEEDCLI_PROGRESS_S", "").strip()
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:  # also NaN
        raise UserError(f"SEEDCLI_PROGRESS_S={text!r} is not a number of seconds >= 0: set it to e.g. 10, or unset it")
    return seconds
