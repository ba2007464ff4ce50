"""bench/cpu_dtype.py stops with one line where bf16 has no fast path, instead of measuring for hours."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "cpu_dtype.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_cpu_dtype", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_bf16_flags_and_a_slow_bf16_matmul_stop_the_bench():
    why = _bench().slow_bf16(0.18e12, 0.004e12, ())
    assert why is not None and "\n" not in why
    assert "0.004" in why and "0.18" in why and "--force" in why


def test_bf16_flags_or_a_fast_bf16_matmul_run_it():
    slow_bf16 = _bench().slow_bf16
    assert slow_bf16(0.31e12, 1.80e12, ("amx_bf16", "avx512_bf16")) is None  # the AMX machine's figures
    assert slow_bf16(0.18e12, 0.004e12, ("avx512_bf16",)) is None  # the CPU says it has bf16: measure it
    assert slow_bf16(0.18e12, 0.05e12, ()) is None  # a quarter of fp32's or more: worth measuring
