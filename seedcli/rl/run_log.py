"""The rl run's logs, metrics.jsonl and samples.jsonl: one record per update appended and fsynced (non-finite values
become null), and cut back to a checkpoint's step when a run resumes."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import orjson

from seedcli.artifacts import atomic_write_bytes


def read_records_upto(path: Path, step: int) -> list[dict]:
    """Records of `path` whose step ≤ `step` (a resumed run forgets what came after its checkpoint)."""
    if not path.exists():
        return []
    keep = []
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # a half-written last line from a killed run
        if isinstance(rec, dict) and rec.get("step", math.inf) <= step:
            keep.append(rec)
    return keep


def rewrite_records(path: Path, records: list[dict]) -> None:
    """Replace `path` (atomically) with `records`, one JSON line each."""
    atomic_write_bytes(path, b"".join(_dumps(r) for r in records))


def append_record(path: Path, record: dict) -> None:
    """Append one record and fsync: a killed run keeps every update it logged."""
    with open(path, "ab") as fh:
        fh.write(_dumps(record))
        fh.flush()
        os.fsync(fh.fileno())


def _dumps(record: dict) -> bytes:
    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return orjson.dumps(clean(record)) + b"\n"
