"""Metric loggers: `metrics.jsonl` always; TensorBoard and Weights & Biases when asked (`--logger tensorboard,wandb`).

Stages write their metrics to `metrics.jsonl` only. While a run is open, a mirror thread follows that file and hands
every new row to the other loggers, so they see exactly the names and steps of metrics.jsonl — whichever process
(a torchrun rank, a trainer callback) wrote it. Numbers go to the loggers; strings and nested values stay in the file.

    seed rl -c tiny --logger tensorboard          # tensorboard --logdir runs/rl/<id>/tensorboard
    WANDB_MODE=offline seed rl -c tiny --logger wandb   # later: wandb sync runs/rl/<id>/wandb/offline-run-*
"""

from __future__ import annotations

import importlib.util
import math
import os
import threading
from pathlib import Path
from typing import Protocol

import orjson

from seedcli.atomic import atomic_write_bytes
from seedcli.errors import UserError

LOGGERS = ("jsonl", "tensorboard", "wandb")
METRICS_FILE = "metrics.jsonl"
STATE_FILE = ".loggers.json"  # {logger: {metric: last step forwarded}}; survives a resume
INSTALL = {
    "tensorboard": "pip install 'seedcli[tensorboard]' (or pip install tensorboard)",
    "wandb": "pip install 'seedcli[wandb]' (or pip install wandb)",
}


def parse_loggers(value: str | list[str] | None) -> list[str]:
    """'tensorboard,wandb' → ['jsonl', 'tensorboard', 'wandb']; jsonl is always on; an unknown name is a UserError."""
    names = value.split(",") if isinstance(value, str) else list(value or [])
    out = ["jsonl"]
    for name in (n.strip().lower() for n in names):
        if not name or name in out:
            continue
        if name not in LOGGERS:
            raise UserError(f"--logger {name}: unknown logger; use any of {', '.join(LOGGERS)} (comma-separated)")
        out.append(name)
    return out


def check_installed(names: list[str]) -> None:
    """Fail before a run starts when an asked-for logger's package is missing, saying how to install it."""

    for name in names:
        module = {"tensorboard": "torch.utils.tensorboard", "wandb": "wandb"}.get(name)
        if module is None:
            continue
        try:
            found = importlib.util.find_spec(module) is not None
            if name == "tensorboard":
                found = found and importlib.util.find_spec("tensorboard") is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise UserError(f"--logger {name}: the {name} package is not installed; {INSTALL[name]}")


def scalars(row: dict) -> tuple[int | None, dict[str, float]]:
    """(step, numeric metrics) of one metrics.jsonl row; booleans count as 0/1, NaN and strings are left out."""
    step = row.get("step")
    out: dict[str, float] = {}
    for key, value in row.items():
        if key == "step":
            continue
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[key] = float(value)
    return (int(step) if isinstance(step, (int, float)) else None), out


class Sink(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    """Event files under `<run>/tensorboard/`: one scalar per metric, at the row's step."""

    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class WandbSink:
    """A W&B run under `<run>/wandb/`, named by the run id, config attached; `WANDB_MODE=offline` needs no network."""

    def __init__(self, run_dir: Path, run_id: str, stage: str, config: dict):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project="seedcli",
            name=f"{stage}/{run_id}",
            id=f"{stage}-{run_id}".replace(".", "-"),
            resume="allow",  # a resumed seedcli run continues the same W&B run
            dir=str(run_dir),
            config=config,
            job_type=stage,
            reinit="create_new",
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()
        # wandb-core writes the run file in its own process: shut it down so everything is on disk when we return
        self.wandb.teardown()


class MetricsMirror:
    """Follows `<run>/metrics.jsonl` and forwards each complete new row to the sinks; `close()` drains the rest.

    Each metric goes to each logger at most once per step, across resumes too: the last step forwarded per logger and
    metric is kept in `<run>/.loggers.json`, and a row at or below it (an earlier row read again after a resume, or a
    step logged again after the checkpoint it resumed from) is skipped, so every curve stays single-valued."""

    def __init__(self, run_dir: Path, sinks: dict[str, Sink], poll_s: float = 1.0):
        self.path = Path(run_dir) / METRICS_FILE
        self.state_path = Path(run_dir) / STATE_FILE
        self.sinks = sinks
        self.poll_s = poll_s
        self.offset = 0
        self.inode: int | None = None
        self.row = 0
        # per logger: one added on resume gets the earlier rows too, one that had them does not get them again
        self.sent: dict[str, dict[str, int]] = {name: self._load_state().get(name, {}) for name in sinks}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="metrics-mirror", daemon=True)

    def _load_state(self) -> dict[str, dict[str, int]]:
        try:
            state = orjson.loads(self.state_path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        return {k: v for k, v in state.items() if isinstance(v, dict)} if isinstance(state, dict) else {}

    def _save_state(self) -> None:
        atomic_write_bytes(self.state_path, orjson.dumps({**self._load_state(), **self.sent}))

    def start(self) -> MetricsMirror:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.drain()

    def drain(self) -> None:
        """Forward every complete line written since the last call (a half-written last line waits)."""
        try:
            fh = open(self.path, "rb")
        except FileNotFoundError:
            return
        with fh:
            inode = os.fstat(fh.fileno()).st_ino
            size = fh.seek(0, 2)
            # replaced (a resume rewrites it atomically) or cut shorter: read the new file from its start
            if inode != self.inode or size < self.offset:
                self.offset, self.row, self.inode = 0, 0, inode
            fh.seek(self.offset)
            data = fh.read()
        end = data.rfind(b"\n")
        if end < 0:
            return
        forwarded = False
        for line in data[: end + 1].splitlines():
            self.offset += len(line) + 1
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(row, dict):
                continue
            step, values = scalars(row)
            self.row += 1
            step = step if step is not None else self.row
            for name, sink in self.sinks.items():
                sent = self.sent[name]
                fresh = {k: v for k, v in values.items() if step > sent.get(k, -math.inf)}
                if fresh:
                    sink.log(step, fresh)
                    sent.update(dict.fromkeys(fresh, step))
                    forwarded = True
        if forwarded:
            self._save_state()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.drain()
        for sink in self.sinks.values():
            sink.close()


def start_mirror(run_dir: Path, names: list[str], run_id: str, stage: str, config: dict) -> MetricsMirror | None:
    """The mirror for the asked-for loggers beyond jsonl, started; None when only jsonl is asked for."""
    sinks: dict[str, Sink] = {}
    for name in names:
        if name == "tensorboard":
            sinks[name] = TensorBoardSink(run_dir)
        elif name == "wandb":
            sinks[name] = WandbSink(run_dir, run_id, stage, config)
    return MetricsMirror(run_dir, sinks).start() if sinks else None
