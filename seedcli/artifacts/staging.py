"""A model directory that `seed model init` / `seed model import` write: built in a hidden staging directory beside
the target (`.<name>.partial/model`) under the writer lock the stages take (`artifacts/lock.py`), then renamed into
place. So a model is never overwritten unless asked (`--force`), two writers of one target are refused, and a killed
writer leaves no half-written model at the target: the next writer finds its staging directory, says so, and clears
it (or, when it was killed in the middle of a `--force` replacement, puts the old model back first).

    with model_output(Path("models/agent"), force=False) as build_dir:
        build_tiny_model(build_dir)      # written to models/.agent.partial/model, then renamed to models/agent
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from seedcli.artifacts.lock import LOCK, RunLock, _describe, read_lock
from seedcli.errors import UserError

BUILD = "model"  # the model being written, inside the staging directory
REPLACED = "replaced"  # `--force`: the model the new one replaces, kept until the new one is in place


def staging_dir(out: Path) -> Path:
    """Where the model for `out` is built: a hidden directory beside it, on the same filesystem (one rename)."""
    return out.parent / f".{out.name}.partial"


def check_model_out(out: Path, force: bool) -> None:
    """`--out` names a directory that may be written: absent or empty, or holding something `force` replaces; a
    file is refused either way."""
    if out.is_symlink() and not out.exists():
        raise UserError(f"--out {out}: a broken symbolic link; remove it or choose another directory")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: a file, not a directory; pass a new directory path (the model is written there)")
    if out.parent.exists() and not out.parent.is_dir():
        raise UserError(f"--out {out}: {out.parent} is a file, not a directory; choose another path")
    if force or not out.is_dir() or not any(out.iterdir()):
        return
    what = "holds a model already" if (out / "config.json").exists() else "exists and is not empty"
    raise UserError(
        f"--out {out} {what}; pass --force to replace it (the new model is built beside it and only then takes its "
        "place), or choose a new directory"
    )


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@contextmanager
def model_output(out: Path, force: bool = False, say: Callable[[str], None] = _say) -> Iterator[Path]:
    """The directory to build the model for `out` in (not yet existing); renamed to `out` when the body returns.
    A body that raises (Ctrl-C included) leaves `out` as it was and removes what it built."""
    out = Path(out)
    check_model_out(out, force)
    staging = staging_dir(out)
    lock, before = _take_lock(out, staging)
    try:
        _clear_leftovers(staging, out, before, say)
        check_model_out(out, force)  # again under the lock: another writer may have finished in between
        build = staging / BUILD
        yield build
        if not (build / "config.json").is_file():
            raise RuntimeError(f"the model for {out} was not written to {build}")
        _swap(build, out, staging)
    finally:
        _clear(staging)
        lock.release()
        try:
            staging.rmdir()
        except OSError:
            pass  # another writer took the directory over as the lock was released: it is its own now


def _take_lock(out: Path, staging: Path) -> tuple[RunLock, dict | None]:
    """The writer lock in the staging directory (made here), and the lock of a killed writer it took over (None when
    there was none); a live writer of `out` is refused in one line."""
    for _ in range(3):
        try:
            staging.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"--out {out}: cannot create {staging} ({exc.strerror}); choose another path") from None
        stale = read_lock(staging)
        lock = RunLock(staging)
        try:
            lock.acquire()
        except FileNotFoundError:  # the last writer removed the directory just now: make it again
            continue
        except UserError:
            holder = read_lock(staging) or {}
            cmd = " ".join(str(a) for a in holder.get("argv") or [])
            raise UserError(
                f"--out {out} is being written by {_describe(holder)} (`{cmd}`); wait for it to finish or stop it "
                f"(kill {holder.get('pid')}), then run this again; lock: {staging / LOCK}"
            ) from None
        return lock, stale
    raise UserError(f"--out {out}: could not take {staging / LOCK}; another process keeps removing it — retry")


def _clear_leftovers(staging: Path, out: Path, before: dict | None, say: Callable[[str], None]) -> None:
    """What a killed writer (`before`: its lock) left in the staging directory: the old model of an interrupted
    `--force` replacement is put back at `out`; a partial model is removed. Each said in one line."""
    replaced = staging / REPLACED
    if replaced.is_dir() and not out.exists():
        os.rename(replaced, out)
        say(f"note: restored {out}: a `--force` replacement of it was interrupted before the new model took its place")
    left = [p for p in staging.iterdir() if p.name != LOCK and not p.name.startswith(f".{LOCK}")]
    if not left:
        return
    by = f" (PID {before.get('pid')}, started {before.get('started')})" if before else ""
    _clear(staging)
    say(f"note: removed a partial model for {out} that an interrupted `seed model` command left in {staging}{by}")


def _clear(staging: Path) -> None:
    """Everything in the staging directory but its lock."""
    if not staging.is_dir():
        return
    for p in staging.iterdir():
        if p.name == LOCK:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _swap(build: Path, out: Path, staging: Path) -> None:
    """`build` becomes `out`; what `out` held (`--force`) is moved aside first and removed only once `build` is in
    place (put back if the rename fails)."""
    replaced = staging / REPLACED
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    elif out.exists():
        os.rename(out, replaced)
    try:
        os.rename(build, out)
    except OSError:
        if replaced.exists() and not out.exists():
            os.rename(replaced, out)
        raise
    shutil.rmtree(replaced, ignore_errors=True)
