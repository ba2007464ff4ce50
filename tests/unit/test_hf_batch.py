"""`hf_batch`: the hf engine's continuous-batching rows, set per stage (collect, eval, rl); 16 by default."""

from __future__ import annotations

from pathlib import Path

import pytest

from seedcli.config import build_config
from seedcli.rl.context import load_rollout_engine
from seedcli.rl.distributed import DistInfo
from seedcli.stages.common import load_policy_engine
from tests.helpers_models import build_test_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_test_model(tmp_path_factory.mktemp("m") / "model")


@pytest.mark.parametrize("stage", ["collect", "eval"])
def test_rollout_stages_pass_it_to_the_engine(model_dir, stage):
    default = build_config(stage, None, {"env": "ezpoints"})
    assert default.hf_batch == 16
    cfg = build_config(stage, None, {"env": "ezpoints"}, overrides=["hf_batch=5"])
    assert cfg.config_hash() == default.config_hash()  # how many rows decode together changes no completion
    engine, _ = load_policy_engine(cfg, model_dir)
    try:
        assert engine.max_batch == 5 and engine.batcher().max_rows == 5
    finally:
        engine.close()


def test_rl_passes_it_to_its_rollout_engine(model_dir):
    cfg = build_config("rl", None, {"env": "ezpoints"}, overrides=["hf_batch=7"])
    engine, _ = load_rollout_engine(cfg, model_dir, DistInfo())
    try:
        assert engine.max_batch == 7
    finally:
        engine.close()


def test_it_must_be_positive():
    with pytest.raises(Exception, match="hf_batch"):
        build_config("eval", None, {"env": "ezpoints"}, overrides=["hf_batch=0"])
