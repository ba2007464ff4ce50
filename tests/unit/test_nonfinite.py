"""Issue 55 §4: non-finite values never finish "complete". Every float option of every config refuses inf and nan
(one mechanism: `allow_inf_nan=False` in the config base); a loss or weight that turns non-finite while training
stops the run as failed, naming the step and the quantity, with no model exported; metrics.jsonl writes nan and inf
as the strings "nan", "inf", "-inf", never as null."""

from __future__ import annotations

import json
import math
import random
import typing
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
import torch
from typer.testing import CliRunner

from seedcli.artifacts import read_manifest
from seedcli.cli import app
from seedcli.config import STAGE_CONFIGS, build_config
from seedcli.envs import env_class
from seedcli.errors import NonFiniteValue, UserError
from seedcli.loggers import scalars
from seedcli.report.plots import read_metrics
from seedcli.rl.batching import plan_minibatches
from seedcli.rl.distributed import DistInfo
from seedcli.rl.logprobs import Scorer
from seedcli.rl.optimize import LossWeights, train_update
from seedcli.rl.rescore import rescore_samples
from seedcli.rl.run_log import append_record
from seedcli.rl.samples import TurnSample
from seedcli.stages.sft_train import _make_metrics_callback
from seedcli.stages.warmstart_train import train_clone
from tests.helpers_models import build_test_model, tiny_lm

runner = CliRunner()


def _float_fields() -> list[tuple[str, str]]:
    out = []
    for stage, cls in STAGE_CONFIGS.items():
        for name, field in cls.model_fields.items():
            if float in (typing.get_args(field.annotation) or (field.annotation,)):
                out.append((stage, name))
    return out


def test_every_float_option_of_every_config_refuses_inf_and_nan():
    fields = _float_fields()
    assert len(fields) >= 30 and ("rl", "lr") in fields and ("rl", "opd_beta") in fields  # the walk found them
    accepted = []
    for stage, name in fields:
        for value in ("inf", "-inf", "nan", ".inf", ".nan"):
            try:
                build_config(stage, None, {}, [f"{name}={value}"])
                accepted.append(f"{stage}.{name}={value}")
            except UserError as exc:
                assert f"field '{name}'" in str(exc) and "finite" in str(exc) and "\n" not in str(exc)
    assert accepted == []
    # the two: rl's lr=inf (a run that ended "complete" with NaN weights) and opd_beta=inf (nan was refused)
    with pytest.raises(UserError, match=r"field 'lr': Input should be a finite number, not inf"):
        build_config("rl", None, {"lr": float("inf")})
    with pytest.raises(UserError, match=r"field 'opd_beta': Input should be a finite number, not inf"):
        build_config("rl", None, {}, ["opd_beta=inf"])
    # an environment's float options too (search's request timeout)
    with pytest.raises(UserError, match="timeout=inf: input should be a finite number"):
        env_class("search").check_options({"timeout": float("inf")})
    assert build_config("rl", None, {}, ["lr=2e-5", "opd_beta=3"]).lr == 2e-5  # finite values still pass


def test_model_init_and_warmstart_refuse_a_non_finite_lr_before_building(tmp_path):
    out = tmp_path / "m"
    # --lr reaches the warm start's config (its finite check); --noise nan fails Typer's own range check first
    for flag, value, says in (("--lr", "inf", "field 'lr': Input should be a finite number"),
                              ("--noise", "nan", "Invalid value for '--noise'")):  # fmt: skip
        r = runner.invoke(app, ["model", "init", "--out", str(out), "--warm-start", "expert", "--env", "ezpoints",
                                "--tasks", "1", flag, value])  # fmt: skip
        assert r.exit_code == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.output
    r = runner.invoke(app, ["warmstart", "--model", str(out), "--runs-dir", str(tmp_path / "runs"), "lr=inf"])
    assert r.exit_code == 2 and "field 'lr'" in r.stderr and "finite" in r.stderr
    assert not out.exists() and not (tmp_path / "runs").exists()  # nothing was built, no run was made


# ------------------------------------------------------------------------------------------ at run time: rl


def _rescored_samples(lm, n: int = 4) -> list[TurnSample]:
    g = random.Random(0)
    samples = []
    for i in range(n):
        p = [g.randrange(2, 97) for _ in range(5)]
        r = [g.randrange(2, 97) for _ in range(3)]
        samples.append(TurnSample(i // 2, i % 2, f"g{i}", p, r, None, 0.0, advantage=(-1.0) ** i))
    rescore_samples(samples, old_fn=Scorer(lm), ref_fn=Scorer(lm), teacher=False, max_tokens=256, pad_id=0)
    return samples


def test_rl_update_stops_when_the_optimizer_step_makes_the_weights_non_finite():
    # lr=inf (what `lr=inf` did before it was refused): the loss and the grad norm are finite, the step is not
    lm = tiny_lm(0, vocab=97)
    samples = _rescored_samples(lm)
    model = Scorer(lm)
    optimizer = torch.optim.AdamW(model.parameters(), lr=float("inf"))
    plan = plan_minibatches(len(samples), mini_batch=2, world=1, seed=0)
    with pytest.raises(NonFiniteValue) as err:
        train_update(model, optimizer, samples, plan, DistInfo(), weights=LossWeights(opd_coef=0.0),
                     micro_tokens=10_000, grad_clip=1.0, pad_id=0, step=7)  # fmt: skip
    msg = str(err.value)
    assert msg.startswith("update 7: the weights are non-finite") and "mini-batch 1" in msg and "lr inf" in msg
    assert "\n" not in msg and "exports nothing" in msg
    # the same update at a sane lr trains all its mini-batches
    lm2 = tiny_lm(0, vocab=97)
    model2 = Scorer(lm2)
    res = train_update(model2, torch.optim.AdamW(model2.parameters(), lr=1e-3), _rescored_samples(lm2), plan,
                       DistInfo(), weights=LossWeights(opd_coef=0.0), micro_tokens=10_000, grad_clip=1.0, pad_id=0,
                       step=7)  # fmt: skip
    assert res.optimizer_steps == len(plan) and all(torch.isfinite(p).all() for p in lm2.parameters())


# ------------------------------------------------------------------------------------ at run time: warm start


def _examples(n: int = 6) -> list[tuple[list[int], list[int]]]:
    g = random.Random(1)
    return [([g.randrange(3, 90) for _ in range(12)], [g.randrange(3, 90) for _ in range(4)]) for _ in range(n)]


def test_warm_start_loop_stops_at_the_first_non_finite_loss_naming_the_batch():
    lm = tiny_lm(0, vocab=97)
    # lr 1e30: finite, so no config refuses it, but the first step throws the weights to ~1e30 and the next loss is nan
    with pytest.raises(NonFiniteValue) as err:
        train_clone(lm, _examples(), 2, 0, lr=1e30, batch_tokens=40, prompt_weight=0.5, pad_id=0)
    msg = str(err.value)
    assert msg.startswith("the warm start, batch 2 of") and "the loss is nan" in msg and "lower lr (now 1e+30)" in msg
    rows = err.value.rows  # the curve up to the batch that failed, for the failed run's metrics.jsonl
    assert [r["step"] for r in rows] == [1, 2] and math.isfinite(rows[0]["loss"]) and math.isnan(rows[1]["loss"])
    with pytest.raises(NonFiniteValue, match=r"batch 1 of .*: the weights are non-finite .* at lr inf"):
        train_clone(tiny_lm(0, vocab=97), _examples(), 1, 0, lr=float("inf"), batch_tokens=40, prompt_weight=0.5,
                    pad_id=0)  # fmt: skip


def test_a_warm_start_whose_loss_turns_nan_ends_failed_with_no_model(tmp_path):
    model = build_test_model(tmp_path / "base")
    runs = tmp_path / "runs"
    r = runner.invoke(app, ["warmstart", "--model", str(model), "--runs-dir", str(runs), "--env", "ezpoints",
                            "--tasks", "2", "--epochs", "2", "--workers", "0", "--check-turns", "0",
                            "--check-skills", "0", "--cache-dir", str(tmp_path / "cache"), "lr=1e30",
                            "batch_tokens=512"])  # fmt: skip
    assert r.exit_code == 2, r.output
    last = r.stderr.strip().splitlines()[-1]  # the progress lines, then the one error line
    assert last.startswith("error: the warm start, batch 2 of") and "the loss is nan" in last
    [run_dir] = (runs / "warmstart").iterdir()
    manifest = read_manifest(run_dir)
    assert manifest.status == "failed" and "NonFiniteValue" in manifest.error and manifest.outputs == []
    assert not (run_dir / "model").exists() and not (runs / "warmstart" / "latest").exists()  # nothing exported
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["train/loss"] == "nan" and rows[-1]["step"] == 2  # visible, not null


# ------------------------------------------------------------------------------------------- at run time: sft


def test_sft_callback_stops_on_a_nan_loss_or_non_finite_weights(tmp_path):
    callback = _make_metrics_callback(tmp_path / "metrics.jsonl")
    state = SimpleNamespace(global_step=3, epoch=0.5, is_world_process_zero=True, max_steps=10)
    args = SimpleNamespace(learning_rate=1e-5)
    callback.on_log(args, state, None, logs={"loss": 1.25, "learning_rate": 1e-5, "grad_norm": 0.5})
    state.global_step = 4
    with pytest.raises(NonFiniteValue, match=r"sft step 4: loss nan and grad_norm inf; nothing is exported"):
        callback.on_log(args, state, None, logs={"loss": float("nan"), "learning_rate": 1e-5, "grad_norm": math.inf})
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["train/loss"] == 1.25 and rows[-1] == {"step": 4, "train/loss": "nan", "train/grad_norm": "inf"}
    lm = tiny_lm(0, vocab=97)
    callback.on_step_end(args, state, None, model=lm)  # finite weights: nothing happens
    with torch.no_grad():
        next(lm.parameters())[0, 0] = float("nan")
    with pytest.raises(NonFiniteValue, match=r"sft step 4: the weights are non-finite"):
        callback.on_step_end(args, state, None, model=lm)


# ------------------------------------------------------------------------------------------------ metrics.jsonl


def test_metrics_jsonl_spells_out_nan_and_inf_instead_of_null(tmp_path):
    path = tmp_path / "metrics.jsonl"
    append_record(path, {"step": 1, "actor/grad_norm": float("nan"), "opd/gate_mean": math.inf, "x": -math.inf,
                         "nested": {"a": [1.0, float("nan")]}, "ok": 0.5})  # fmt: skip
    raw = path.read_bytes()
    assert b"null" not in raw
    row = orjson.loads(raw)
    assert row == {"step": 1, "actor/grad_norm": "nan", "opd/gate_mean": "inf", "x": "-inf",
                   "nested": {"a": [1.0, "nan"]}, "ok": 0.5}  # fmt: skip
    # the readers: `seed plot` reads the row, the tensorboard/wandb mirror forwards only the finite numbers
    assert read_metrics(Path(path))[0]["actor/grad_norm"] == "nan"
    assert scalars(row) == (1, {"ok": 0.5})
