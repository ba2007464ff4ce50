"""Atomic file writes: a reader never sees a half-written file. A leaf module (it imports nothing of seedcli), so
both the run directories (`seedcli.artifacts`, which re-exports these) and the metric loggers can use it."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temp file and rename, so a reader never sees a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, Ctrl-C: no temp file is left behind, `path` stays as it was
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def overwrite_in_place(path: Path, data: bytes) -> bool:
    """Write `data` over `path`'s own bytes, padded with spaces to its length (JSON allows trailing space), so that
    nothing is allocated: the last write on a full disk, where `atomic_write_bytes` has no room for its temp file.
    False (the file left as it was) when `data` is longer than the file or the write fails."""
    try:
        size = Path(path).stat().st_size
        if len(data) > size:
            return False
        with open(path, "r+b") as fh:
            fh.write(data + b" " * (size - len(data)))
            fh.flush()
            os.fsync(fh.fileno())
    except OSError:
        return False
    return True
