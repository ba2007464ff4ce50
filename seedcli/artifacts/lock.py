"""Who writes a run directory now: the writer lock ({pid, host, started, proc_start, argv}), taken when a stage opens
its run and removed when it ends, and whether the process that holds it is still alive (a crashed writer's lock is
stale and may be taken over)."""

from __future__ import annotations

import os
import socket
import sys
from datetime import UTC, datetime
from pathlib import Path

import orjson

from seedcli.errors import UserError

LOCK = "writer.lock"  # who writes the run now: {pid, host, started, proc_start, argv}; removed when the stage ends


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _proc_stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from field 3 (state) on (Linux); None where there is no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()  # the name before ")" may hold spaces


def _proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot; tells a live writer from a reused PID."""
    fields = _proc_stat(pid)
    return fields[19] if fields else None  # field 22 (starttime)


def read_lock_file(path: Path) -> dict | None:
    try:
        data = orjson.loads(Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def read_lock(run_dir: Path) -> dict | None:
    """The writer lock's content, or None when the run has no lock (or it is unreadable: treated as stale)."""
    return read_lock_file(Path(run_dir) / LOCK)


def writer_alive(lock: dict | None) -> bool | None:
    """True when the lock's process runs, False when it is gone, None when it runs on another host (unknowable)."""
    if not lock:
        return False
    if lock.get("host") != socket.gethostname():
        return None
    pid = int(lock.get("pid", 0))
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists
    fields = _proc_stat(pid)
    if fields and fields[0] in ("Z", "X"):  # killed, not yet reaped by its parent: the writer is gone
        return False
    started, now = lock.get("proc_start"), (fields[19] if fields else None)
    return not (started and now and started != now)  # a different start time: the PID was reused


def _describe(lock: dict) -> str:
    return f"PID {lock.get('pid')} on {lock.get('host')} since {lock.get('started')}"


class RunLock:
    """`writer.lock` in the run directory, created exclusively; a lock whose process is gone is taken over."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self.held = False

    def acquire(self, argv: list[str] | None = None) -> None:
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": utc_now(),
            "proc_start": _proc_start(os.getpid()),
            "argv": argv if argv is not None else sys.argv,
        }
        # written in full to a private file, then hard-linked into place: the link is atomic and fails when a lock
        # exists, so no reader ever sees a half-written lock
        tmp = self.path.with_name(f".{LOCK}.{os.getpid()}.tmp")
        tmp.write_bytes(orjson.dumps(info, option=orjson.OPT_INDENT_2))
        try:
            self._take(tmp)
        finally:
            tmp.unlink(missing_ok=True)

    def _take(self, tmp: Path) -> None:
        for _ in range(3):
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                current = read_lock(self.path.parent)
                alive = writer_alive(current)
                if current and alive is not False:
                    where = "" if alive else " (another host: if that process is gone, delete the lock file)"
                    raise UserError(
                        f"{self.path.parent}: the run is being written by {_describe(current)}{where}; "
                        f"wait for it to finish or stop it (kill {current.get('pid')}), then --resume; lock: {self.path}"
                    ) from None
                # stale: its writer is gone. Rename first, so of two processes taking over only one succeeds.
                stale = self.path.with_name(f".{LOCK}.stale.{os.getpid()}")
                try:
                    os.replace(self.path, stale)
                except FileNotFoundError:
                    continue
                if read_lock_file(stale) != current:  # another process took over in between: give its lock back
                    try:
                        os.link(stale, self.path)
                    except FileExistsError:
                        pass
                stale.unlink(missing_ok=True)
                continue
            self.held = True
            return
        raise UserError(f"{self.path}: could not take the run's lock; another process keeps taking it — retry")

    def release(self) -> None:
        if self.held:
            current = read_lock(self.path.parent)
            if current and current.get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)
            self.held = False
