"""`--logger tensorboard,wandb`: every numeric metric of metrics.jsonl reaches them with the same name and step
(TensorBoard read back from its event files; W&B in offline mode read back from the offline run's history)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import orjson
import pytest

from seedcli.artifacts import open_run
from seedcli.config import CollectConfig
from seedcli.errors import UserError
from seedcli.loggers import check_installed, parse_loggers, scalars

ROWS = [
    {"step": 1, "actor/pg_loss": 0.5, "opd/valid_skill_frac": 0.0, "timing_s/gen": 2.0, "note": "text stays in jsonl"},
    {"step": 2, "actor/pg_loss": -0.25, "opd/valid_skill_frac": 0.5, "val/success": True},
    {"step": 3, "actor/pg_loss": 0.125, "reward/mean": float("nan")},
]


def _write_metrics(run_dir: Path, rows: list[dict]) -> None:
    """As a stage does: append rows to metrics.jsonl while the run is open."""
    with open(run_dir / "metrics.jsonl", "ab") as fh:
        for row in rows:
            fh.write(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")


def _expected() -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for row in ROWS:
        step, values = scalars(row)
        for k, v in values.items():
            out.setdefault(k, []).append((step, v))
    return out


def test_scalars_keep_numbers_and_booleans_and_drop_text_and_nan():
    assert scalars(ROWS[0]) == (1, {"actor/pg_loss": 0.5, "opd/valid_skill_frac": 0.0, "timing_s/gen": 2.0})
    assert scalars(ROWS[1])[1]["val/success"] == 1.0
    assert scalars(ROWS[2]) == (3, {"actor/pg_loss": 0.125})


def test_logger_names_are_checked_and_jsonl_is_always_on(monkeypatch):
    assert parse_loggers("tensorboard, wandb") == ["jsonl", "tensorboard", "wandb"]
    assert parse_loggers(None) == ["jsonl"]
    with pytest.raises(UserError, match="--logger mlflow: unknown logger; use any of jsonl, tensorboard, wandb"):
        parse_loggers("mlflow")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a))
    with pytest.raises(
        UserError, match=r"--logger wandb: the wandb package is not installed; pip install 'seedcli\[wandb\]'"
    ):
        check_installed(["jsonl", "wandb"])


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="pip install 'seedcli[tensorboard]'")
def test_tensorboard_event_files_hold_the_same_names_and_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = CollectConfig(runs_dir=str(tmp_path), logger="tensorboard")
    with open_run("collect", cfg, argv=[]) as run:
        _write_metrics(run.path, ROWS[:1])
        _write_metrics(run.path, ROWS[1:])
    acc = EventAccumulator(str(run.path / "tensorboard"))
    acc.Reload()
    got = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    expected = _expected()
    assert sorted(got) == sorted(expected)
    for tag, points in expected.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points]
        assert all(math.isclose(a, b, rel_tol=1e-6) for (_, a), (_, b) in zip(got[tag], points, strict=True))


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="pip install 'seedcli[wandb]'")
def test_wandb_offline_run_history_holds_the_same_names_and_steps(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    cfg = CollectConfig(runs_dir=str(tmp_path / "runs"), logger="wandb")
    with open_run("collect", cfg, argv=[]) as run:
        _write_metrics(run.path, ROWS)
    (run_file,) = (run.path / "wandb").glob("offline-run-*/run-*.wandb")
    history = _read_wandb_history(run_file)
    expected = _expected()
    for tag, points in expected.items():
        got = [(row["_step"], row[tag]) for row in history if tag in row]
        assert [s for s, _ in got] == [s for s, _ in points], tag
        assert all(math.isclose(a, b, rel_tol=1e-6) for (_, a), (_, b) in zip(got, points, strict=True))
    assert {k for row in history for k in row if not k.startswith("_")} == set(expected)


def _read_wandb_history(path: Path) -> list[dict]:
    """The history records of an offline W&B run file: a 7-byte header (":W&B", magic, version), then LevelDB-log
    records (checksum u32, length u16, type u8; full=1, first=2, middle=3, last=4) in 32 KiB blocks, each a protobuf
    `Record`."""
    import json
    import struct

    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending, rows = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little room left in this block for a header: the rest is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(pending)
            if rec.WhichOneof("record_type") == "history":
                rows.append(
                    {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item}
                )
    return rows
