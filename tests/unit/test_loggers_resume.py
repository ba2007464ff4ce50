"""A resumed run's logger mirror does not send earlier steps again: TensorBoard read back holds each step once."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import orjson
import pytest

from seedcli.artifacts import atomic_write_bytes, open_run
from seedcli.config import CollectConfig

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None, reason="pip install 'seedcli[tensorboard]'"
)


def _rows(steps: range, scale: float) -> list[dict]:
    return [{"step": s, "actor/pg_loss": scale * s} for s in steps]


def _append(run_dir: Path, rows: list[dict]) -> None:
    with open(run_dir / "metrics.jsonl", "ab") as fh:
        fh.writelines(orjson.dumps(r) + b"\n" for r in rows)


def _scalars(run_dir: Path) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars("actor/pg_loss")]


def test_resume_that_rewrites_metrics_sends_each_step_once(tmp_path):
    cfg = CollectConfig(runs_dir=str(tmp_path), logger="tensorboard")
    with pytest.raises(KeyboardInterrupt), open_run("collect", cfg, argv=[]) as run:
        _append(run.path, _rows(range(1, 4), 1.0))  # steps 1..3 reach TensorBoard, then the run is killed
        raise KeyboardInterrupt
    # the resume rewrites metrics.jsonl back to its checkpoint (step 2), as sft and rl do, and logs 3..4 again
    resumed = CollectConfig(runs_dir=str(tmp_path), logger="tensorboard", resume=str(run.path))
    with open_run("collect", resumed, argv=[]) as again:
        kept = b"".join(orjson.dumps(r) + b"\n" for r in _rows(range(1, 3), 1.0))
        atomic_write_bytes(again.path / "metrics.jsonl", kept)
        _append(again.path, _rows(range(3, 5), 1.0))
    # before the fix, the new process sent 1..3 again: steps [1, 2, 3, 1, 2, 3, 4]
    assert [s for s, _ in _scalars(run.path)] == [1, 2, 3, 4]
    assert [v for _, v in _scalars(run.path)] == [1.0, 2.0, 3.0, 4.0]


def test_rewrite_within_one_process_is_not_sent_again(tmp_path):
    cfg = CollectConfig(runs_dir=str(tmp_path), logger="tensorboard")
    with open_run("collect", cfg, argv=[]) as run:
        from seedcli.loggers import MetricsMirror, TensorBoardSink

        mirror = MetricsMirror(run.path, {"tensorboard": TensorBoardSink(tmp_path / "own")}, poll_s=3600)
        _append(run.path, [{**r, "note": "text stays in metrics.jsonl " * 3} for r in _rows(range(1, 4), 1.0)])
        mirror.drain()
        # replaced (a resume rewrote 1..3, then logged 4..6): the old reader, seeing a shorter file, sent 1..3 again;
        # the new file is read from its start and only 4..6 are new
        rewritten = b"".join(orjson.dumps(r) + b"\n" for r in _rows(range(1, 7), 0.123456789))
        atomic_write_bytes(run.path / "metrics.jsonl", rewritten)
        mirror.drain()
        mirror.sinks["tensorboard"].close()
    got = _scalars(tmp_path / "own")
    assert [s for s, _ in got] == [1, 2, 3, 4, 5, 6]
    expected = [1.0, 2.0, 3.0] + [0.123456789 * s for s in (4, 5, 6)]  # steps 1..3 keep their first value
    assert [v for _, v in got] == pytest.approx(expected, rel=1e-6)


def test_a_logger_added_on_resume_gets_the_earlier_rows(tmp_path):
    cfg = CollectConfig(runs_dir=str(tmp_path))  # jsonl only
    with pytest.raises(KeyboardInterrupt), open_run("collect", cfg, argv=[]) as run:
        _append(run.path, _rows(range(1, 3), 1.0))
        raise KeyboardInterrupt
    resumed = CollectConfig(runs_dir=str(tmp_path), logger="tensorboard", resume=str(run.path))
    with open_run("collect", resumed, argv=[]) as again:
        _append(again.path, _rows(range(3, 4), 1.0))
    assert _scalars(run.path) == [(1, 1.0), (2, 2.0), (3, 3.0)]
