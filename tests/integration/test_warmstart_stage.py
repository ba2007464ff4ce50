"""`seed warmstart` on text Sokoban with a tiny model: the same inputs give bit-identical weights to the warm start
before it was a stage (the checksums below were computed from the code at 42b0f98, before this change, on the same
inputs), `seed model init --warm-start expert` still gives them, and the run directory holds a manifest that chains
its inputs and a model/ that collect takes as --model (and chains in its own manifest)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from seedcli.artifacts import read_manifest, verify_run
from seedcli.config import WarmStartConfig
from seedcli.engines.tiny import build_tiny_model, model_hash
from seedcli.envs import sample_texts
from seedcli.stages.warmstart import WARMSTART_FILE, warm_start
from tests.helpers_cli import ENV, seed_cli, summary
from tests.helpers_models import SMALL_SHAPE

# sha256 over the trained tensors (names sorted, raw bytes), from the pre-stage warm_start(...) / `seed model init`
# at commit 42b0f98 on torch 2.13.0 (CPU, one thread, fp32, ../shared beside the repo as in CI), one set per CPU
# kernel family torch dispatches to (`torch.backends.cpu.get_cpu_capability()`): the same code rounds differently
# on an AVX-512 CPU (the Intel machines these were first taken on) and an AVX2 one (AMD EPYC, 2026-12-03). Within the
# AVX-512 family an Intel Xeon with AMX and AVX512-FP16 (2026-12-05) rounds the fp32 sums differently again (its second
# value below, taken with the code at 594b1e0, which gives 42b0f98's values on the other CPUs): each entry lists every
# value a known CPU of that family gives, and a CPU that rounds a third way fails until its value is added
GOLDEN_TORCH = "2.13.0"
GOLDEN = {
    "AVX512": {
        # warm_start(games=4, epochs=2, seed=0, shape=None, noise=0.3, workers=0, lr=3e-3, check_turns=2,
        # check_skills=1, env="sokoban") on the tiny preset with SMALL_SHAPE (seed 0): prompt weight 0.5, skill writing
        "small": (
            "6b1312a3f2adac36a9fcb311da9bb193ee07251739d527c8e6fdf0cd1c1ae6cb",
            "836d1e1a469bb66706d5be8458a1860e7b49865bcf1589b77f0677a5be64d546",
        ),
        # the same with prompt_weight=0.0, skill_writing=False: the response-only loss through rl/logprobs.py
        "small_response_only": (
            "1be64ec876dd20a1a01910aef2f2ff6233cc04c1428e829879b6d35f97a9014b",
            "3c5cfa4a19056d24ce8b1ea7ea1d8a0589f3e3a3760918a747ac8b33bbe67011",
        ),
        # seed model init --preset tiny --seed 0 --warm-start expert --env sokoban --tasks 4 --epochs 1 (AGENT_SHAPE)
        "model_init": (
            "ec9fcc8a6165b709235ab899520757426c4406e85e6a65678f3e00b7aca77675",
            "4b5a373de717313e10a56631fa4b24fc576dc47889c434e4d743a5435ae98a56",
        ),
    },
    "AVX2": {
        "small": ("01dbc3befd9e46539dd9ecdd3fc5980f2adab11df7a19f01023763586e8fb335",),
        "small_response_only": ("87a7ac5b5895f1fbd5d0afa49194ee55805f3aaa2c627bfc0ad34bd63f877afd",),
        "model_init": ("dcf7788734435c4acf9070c10af1956ccf8743d02842ed0251c6055175e1e76b",),
    },
}
SMALL = ["games=4", "epochs=2", "noise=0.3", "workers=0", "lr=3e-3", "check_turns=2", "check_skills=1"]


def weights_sha256(model_dir: Path) -> str:
    state = load_file(str(model_dir / "model.safetensors"))
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _golden(key: str) -> tuple[str, ...]:
    if not torch.__version__.startswith(GOLDEN_TORCH):
        pytest.skip(f"golden checksums are from torch {GOLDEN_TORCH}, this is {torch.__version__}")
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in GOLDEN:
        pytest.skip(f"golden checksums are for {' and '.join(GOLDEN)} CPUs, this one runs torch's {capability} kernels")
    return GOLDEN[capability][key]


def _small_model(path: Path) -> Path:
    return build_tiny_model(path, preset="tiny", seed=0, corpus=sample_texts(), **SMALL_SHAPE)


@pytest.fixture(scope="module")
def stage_run(tmp_path_factory):
    """One `seed warmstart` run on the small model, then a one-episode collect from its model/."""
    tmp = tmp_path_factory.mktemp("ws")
    base, runs = _small_model(tmp / "base"), tmp / "runs"
    common = ["--runs-dir", str(runs), "--env", "sokoban", "--json"]
    ws = summary(seed_cli("warmstart", "--model", str(base), *common, *SMALL, f"cache_dir={tmp / 'demos'}"))
    run_dir = runs / "warmstart" / ws["run_id"]
    col = summary(
        seed_cli(
            "collect", "--model", str(run_dir / "model"), *common, "--tasks", "1", "--rollouts", "1",
            "--max-steps", "1", "--max-new-tokens", "8", "--workers", "0",
        )
    )  # fmt: skip
    return {"tmp": tmp, "base": base, "ws": ws, "run": run_dir, "collect": runs / "collect" / col["run_id"]}


@pytest.mark.slow
def test_the_stage_gives_the_weights_of_the_warm_start_before_it(stage_run):
    assert weights_sha256(stage_run["run"] / "model") in _golden("small")


def test_the_response_only_loss_gives_the_same_weights_as_before(tmp_path):
    model = _small_model(tmp_path / "m")
    kw = dict(model=str(model), games=4, epochs=2, noise=0.3, workers=0, lr=3e-3, check_turns=2, env="sokoban")
    cfg = WarmStartConfig(**kw, prompt_weight=0.0, skill_writing=False, cache_dir=str(tmp_path / "demos"))
    record = warm_start(model, cfg)
    assert record["skill_examples"] == 0 and record["prompt_weight"] == 0.0
    assert weights_sha256(model) in _golden("small_response_only")


@pytest.mark.slow  # a second warm start
def test_model_init_warm_start_gives_the_same_weights_as_before(tmp_path):
    out = tmp_path / "agent"
    env = {**ENV, "SEEDCLI_CACHE": str(tmp_path / "cache")}
    seed_cli("model", "init", "--preset", "tiny", "--out", str(out), "--seed", "0", "--warm-start", "expert",
             "--env", "sokoban", "--tasks", "4", "--epochs", "1", env=env)  # fmt: skip
    assert json.loads((out / WARMSTART_FILE).read_text())["rebuilt_with_agent_shape"] is True
    assert weights_sha256(out) in _golden("model_init")
    assert not (tmp_path / "runs").exists()  # the short form trains --out in place: no run directory


@pytest.mark.slow
def test_the_run_directory_chains_its_inputs(stage_run):
    run_dir, ws = stage_run["run"], stage_run["ws"]
    manifest = verify_run(run_dir, "warmstart")  # complete, every output's sha256 as recorded
    assert ws["status"] == "complete" and manifest.config["env"] == "sokoban" and manifest.config["tasks"] == 4
    metrics = manifest.metrics
    assert metrics["inputs/base_model"] == str(stage_run["base"])
    assert metrics["inputs/base_model_hash"] == model_hash(stage_run["base"])
    assert metrics["model_hash"] == model_hash(run_dir / "model") != metrics["inputs/base_model_hash"]
    games = [json.loads(line) for line in (run_dir / "games.jsonl").read_text().splitlines()]
    assert (
        len(games) == metrics["data/games"] == 4 and sum(g["won"] for g in games) == metrics["data/games_won_by_expert"]
    )
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    record = json.loads((run_dir / "model" / WARMSTART_FILE).read_text())
    assert [r["train/response_nll"] for r in rows] == [c["response_nll"] for c in record["curve"]]
    outputs = {o.path for o in manifest.outputs}
    assert {"games.jsonl", "metrics.jsonl", "model/model.safetensors", f"model/{WARMSTART_FILE}"} <= outputs
    assert (run_dir / "config.yaml").exists() and (run_dir.parent / "latest").resolve() == run_dir.resolve()


@pytest.mark.slow
def test_collect_takes_the_model_and_chains_the_warm_start_run(stage_run):
    collect = read_manifest(stage_run["collect"])
    assert collect.status == "complete"
    assert [(i.stage, i.run_id) for i in collect.inputs] == [("warmstart", stage_run["ws"]["run_id"])]
