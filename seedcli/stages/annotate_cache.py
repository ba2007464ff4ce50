"""annotate's response cache: responses.jsonl, {key, attempt} → the analyzer's answer, appended and flushed the moment
it arrives, so a crashed or interrupted run pays only for the answers it never got; a damaged line costs one request
again, and the answers of earlier annotate runs of the same collect run are reused."""

from __future__ import annotations

import threading
from pathlib import Path

import orjson

from seedcli.artifacts import MANIFEST, read_manifest
from seedcli.errors import UserError
from seedcli.records import JsonlWriter, repair_tail


class ResponseCache:
    """responses.jsonl: {key, attempt} → the analyzer's answer, appended (and flushed) the moment it arrives."""

    def __init__(self, path: Path):
        self.path = path
        self.entries: dict[tuple[str, int], dict] = {}
        if path.exists():
            repair_tail(path)
            for entry in _tolerant_lines(path):
                self.entries.setdefault((entry["key"], entry["attempt"]), entry)
        self._writer = JsonlWriter(path)
        self._lock = threading.Lock()

    def get(self, key: str, attempt: int) -> dict | None:
        return self.entries.get((key, attempt))

    def put(self, entry: dict) -> None:
        with self._lock:
            if (entry["key"], entry["attempt"]) in self.entries:
                return
            self.entries[(entry["key"], entry["attempt"])] = entry
            self._writer.write(entry)

    def close(self) -> None:
        self._writer.close()


def _tolerant_lines(path: Path):
    """Cache lines that parse; a damaged line only costs one request again."""
    with open(path, "rb") as fh:
        for line in fh:
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(entry, dict) and "key" in entry and "attempt" in entry and "text" in entry:
                yield entry


def _import_earlier(cache: ResponseCache, runs_dir: str, this_run: Path, collect_run_id: str, needed: set[str]) -> int:
    """Copy answers for `needed` keys from earlier annotate runs of the same collect run; returns how many."""
    stage_dir = Path(runs_dir) / "annotate"
    n = 0
    for d in sorted(p for p in stage_dir.iterdir() if p.is_dir() and not p.is_symlink()):
        if d.resolve() == this_run.resolve() or not (d / MANIFEST).exists() or not (d / "responses.jsonl").exists():
            continue
        try:
            m = read_manifest(d)
        except UserError:
            continue
        if not any(i.stage == "collect" and i.run_id == collect_run_id for i in m.inputs):
            continue
        for entry in _tolerant_lines(d / "responses.jsonl"):
            if entry["key"] in needed and cache.get(entry["key"], entry["attempt"]) is None:
                cache.put({**entry, "reused_from": entry.get("reused_from") or m.run_id})
                n += 1
    return n
