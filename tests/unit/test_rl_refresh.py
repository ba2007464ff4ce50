"""The weight refresh's order of operations and its checks, with a recording stand-in for the vLLM engine
(the real engine is exercised in tests/integration/test_vllm_refresh.py and test_rl.py); the probe, which calibrates
at the first check and then only warns."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from seedcli.config import RLConfig
from seedcli.engines.base import tensor_checksum
from seedcli.rl.context import vllm_engine_kwargs
from seedcli.rl.distributed import DistInfo
from seedcli.rl.weight_sync import ProbeCheck, WeightSync, WeightSyncError, checksum_names, trainer_checksums
from seedcli.stages.rl import env_workers
from tests.helpers_models import tiny_lm


class RecordingEngine:
    """Speaks the VLLMEngine interface the refresh uses; keeps its own copy of the weights."""

    name = "vllm"
    on_cpu = True
    weight_dtype = torch.float32

    def __init__(self, lm, take: int | None = None, load: bool = True):
        self.calls: list[str] = []
        self.state = {k: v.clone() for k, v in lm.state_dict().items()}
        self.take, self.load = take, load

    def wake_up(self, tags=None):
        self.calls.append(f"wake:{','.join(tags) if tags else 'all'}")

    def update_weights(self, weights):
        self.calls.append("update")
        self.sent = []
        for i, (name, tensor) in enumerate(weights):
            self.sent.append(name)
            if self.load:
                self.state[name] = tensor.clone()
            if self.take is not None and i + 1 >= self.take:
                break

    def weight_checksums(self, names):
        self.calls.append("checksums")
        return trainer_checksums(self.state.items(), names, torch.float32)


def refresh(lm, engine, step: int) -> dict[str, float]:
    names = checksum_names(lm.config.num_hidden_layers, linear=False)
    return WeightSync(
        engine, lm, DistInfo(), shared=False, checksum_names=names,
        check_sync=lambda step: {"sync/probe_mean_abs_diff": 0.0},
    ).refresh(step)  # fmt: skip


def nudge(lm, scale=1e-6):
    with torch.no_grad():
        for p in lm.parameters():
            p.add_(scale * torch.sign(torch.randn_like(p)))  # one AdamW step at lr 1e-6 moves every weight ~1e-6


def test_refresh_wakes_weights_then_loads_then_wakes_the_kv_cache_and_proves_it():
    lm = tiny_lm(0)
    engine = RecordingEngine(lm)
    nudge(lm)
    sync = refresh(lm, engine, 1)
    assert engine.calls == ["wake:weights", "update", "wake:kv_cache", "checksums"]
    assert sync["sync/checksum_tensors"] >= 3 and sync["sync/tensors_sent"] == len(lm.state_dict())
    # the tied lm_head is sent too (vLLM's layerwise reload would restore a layer that got nothing from its old copy)
    assert "lm_head.weight" in engine.sent and "model.embed_tokens.weight" in engine.sent


def test_a_refresh_that_loads_nothing_is_caught_at_lr_1e6():
    lm = tiny_lm(0)
    engine = RecordingEngine(lm, load=False)
    nudge(lm)
    with pytest.raises(WeightSyncError, match="exact checksum"):
        refresh(lm, engine, 3)


def test_an_engine_that_stops_reading_the_stream_is_caught():
    lm = tiny_lm(0)
    engine = RecordingEngine(lm, take=2)
    with pytest.raises(WeightSyncError, match="took 2 of the"):
        refresh(lm, engine, 1)


class ProbeEngine:
    """Scores the probe's response tokens at the trainer's log-prob plus `offset` (a lower-precision engine)."""

    def __init__(self, offset: float = 0.0):
        self.offset = offset

    def score(self, prompts, responses):
        return [[-1.0 + self.offset] * len(responses[0])]


class ConstantScorer(torch.nn.Module):
    """A trainer whose log-prob is `value` at every response token."""

    def __init__(self, value: float = -1.0):
        super().__init__()
        self.value = value

    def forward(self, input_ids, attention_mask, response_mask, **_):
        return response_mask.float() * self.value


def probe_check(engine, scorer, tol=0.05) -> ProbeCheck:
    return ProbeCheck(engine, scorer, ([1, 2, 3], [4, 5]), tol=tol, max_tokens=64, pad_id=0, info=DistInfo())


def test_the_probe_calibrates_at_step_0_then_warns_on_drift_and_never_stops(capsys):
    engine, scorer = ProbeEngine(0.08), ConstantScorer()
    check = probe_check(engine, scorer)
    # a bf16 engine on a trained model differs by more than the tolerance for honest reasons: the baseline
    m = check(0)
    assert m["sync/probe_calibration"] == pytest.approx(0.08) and m["sync/probe_warn"] == 0.0
    assert capsys.readouterr().err == ""
    engine.offset = 0.12  # 0.04 beyond the calibration: within the tolerance
    m = check(1)
    assert m["sync/probe_drift"] == pytest.approx(0.04) and m["sync/probe_warn"] == 0.0
    assert m["sync/probe_trainer_shift"] == 0.0 and capsys.readouterr().err == ""
    engine.offset = 0.2  # 0.12 beyond: a metric and one stderr line, no exception
    m = check(2)
    assert m["sync/probe_drift"] == pytest.approx(0.12) and m["sync/probe_warn"] == 1.0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("[rl] warning: update 2:") and "more than at calibration" in err[0]
    assert check.calibration == pytest.approx(0.08)  # the baseline stays the first check's


def test_an_engine_that_misses_the_update_is_a_warning_too(capsys):
    engine, scorer = ProbeEngine(0.0), ConstantScorer(-1.0)
    check = probe_check(engine, scorer, tol=1e-3)
    check(0)
    scorer.value = -1.5  # the update moved the trainer's log-probs by 0.5; the engine still scores the old ones
    m = check(1)
    assert m["sync/probe_trainer_shift"] == pytest.approx(0.5) and m["sync/probe_warn"] == 1.0
    err = capsys.readouterr().err
    assert "may not follow the update" in err and "more than at calibration" in err


def test_a_refresh_with_a_drifting_probe_goes_on_and_a_wrong_checksum_stops_it(capsys):
    lm = tiny_lm(0)
    names = checksum_names(lm.config.num_hidden_layers, linear=False)
    check = probe_check(ProbeEngine(0.0), ConstantScorer())
    check(0)
    check.engine.offset = 0.5
    weight_sync = WeightSync(RecordingEngine(lm), lm, DistInfo(), shared=False, checksum_names=names, check_sync=check)
    sync = weight_sync.refresh(1)
    assert sync["sync/checksum_tensors"] >= 3 and sync["sync/probe_warn"] == 1.0
    assert "[rl] warning: update 1" in capsys.readouterr().err
    stale = RecordingEngine(lm, load=False)
    nudge(lm)
    with pytest.raises(WeightSyncError, match="exact checksum"):
        WeightSync(stale, lm, DistInfo(), shared=False, checksum_names=names, check_sync=check).refresh(2)


def test_checksum_is_exact_and_order_free():
    t = torch.randn(1000)
    u = t.clone()
    u[500] = torch.nextafter(u[500], torch.tensor(float("inf")))  # one ulp
    assert tensor_checksum(t) == tensor_checksum(t.clone()) != tensor_checksum(u)
    assert tensor_checksum(t.to(torch.bfloat16)) != tensor_checksum(t)  # dtype is part of what is checked


def test_each_rank_gets_an_independent_vllm_engine(tmp_path):
    """No vLLM data-parallel group (it all-reduces every engine step and hangs ranks that generate unequally)."""
    from seedcli.errors import UserError

    tiny_lm(0).save_pretrained(tmp_path)
    info = SimpleNamespace(device=torch.device("cuda", 3), world=8, rank=3)
    kw = vllm_engine_kwargs(RLConfig(seed=10), tmp_path, info)
    assert "data_parallel_size" not in kw
    assert kw["distributed_executor_backend"] == "external_launcher" and kw["tensor_parallel_size"] == 1
    assert kw["seed"] == 13 and kw["enable_sleep_mode"] and kw["sleep_level"] == 2 and kw["dtype"] == "bfloat16"
    with pytest.raises(UserError, match="vllm_tensor_parallel=2"):
        vllm_engine_kwargs(RLConfig(vllm_tensor_parallel=2), tmp_path, info)
    cpu = vllm_engine_kwargs(RLConfig(), tmp_path, SimpleNamespace(device=torch.device("cpu"), world=2, rank=1))
    assert cpu["distributed_executor_backend"] == "external_launcher" and "enable_sleep_mode" not in cpu
    alone = vllm_engine_kwargs(RLConfig(), tmp_path, SimpleNamespace(device=torch.device("cpu"), world=1, rank=0))
    assert "distributed_executor_backend" not in alone  # one process: vLLM's in-process "uni" executor


def test_env_workers_default_scales_with_cores():
    assert env_workers(RLConfig(workers=3), 8) == 3
    assert 1 <= env_workers(RLConfig(), 1) <= 8
    assert env_workers(RLConfig(), 10_000) == 1
