"""GPU smoke test for `seed rl` (run through scripts/gpu_smoke.sh): each check prints one line, [ok] or [FAIL].

1. CUDA and vLLM are importable; the GPU does bf16.
2. A small Qwen2 (4 layers, hidden 512, head_dim 64, the tiny BPE tokenizer) is built in code.
3. vLLM and transformers agree on the log-probs of a fixed probe.
4. vLLM sleep mode frees GPU memory and wake-up restores the engine (greedy output unchanged).
5. `update_weights` really replaces vLLM's weights (the probe then matches the new model, not the old one).
6. `seed rl --gpus 1 --engine vllm`: two SEED updates with FSDP, the colocated engine and the per-update probe check;
   every metric present and finite, OPD non-zero, the probe agreed after each refresh, and the saved checkpoint
   holds trained weights that transformers can load.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SHAPE = dict(
    hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
    max_position_embeddings=8192,
)  # fmt: skip
PROBE_TOL = 0.05  # mean |Δ log-prob|, bf16 engine vs fp32/bf16 trainer
REQUIRED = (
    "reward/mean", "rollout/success_rate", "env/episode_length", "env/invalid_rate", "actor/pg_loss", "actor/kl",
    "actor/entropy", "actor/clip_frac", "actor/grad_norm", "opd/loss", "opd/gate_mean", "opd/delta_mean",
    "opd/valid_skill_frac", "timing_s/rollout", "timing_s/analyze", "timing_s/rescore", "timing_s/update",
    "perf/tokens_per_s", "sync/probe_mean_abs_diff",
)  # fmt: skip

_failed = 0


def check(name: str, ok: bool, detail: str = "") -> bool:
    global _failed
    print(f"[{'ok' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        _failed += 1
    return ok


def mean_abs(a, b) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=False)) / max(len(a), 1) if len(a) == len(b) else math.inf


def hf_score(model_dir: Path, prompt: list[int], response: list[int]) -> list[float]:
    from seedcli.engines.hf import HFEngine

    engine = HFEngine(model_dir, device="cuda", dtype="float32")
    try:
        return engine.score([prompt], [response])[0]
    finally:
        engine.close()


def main() -> int:
    ap = argparse.ArgumentParser(description="GPU smoke test for seed rl")
    ap.add_argument("--out", default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--skip-engine-checks", action="store_true", help="only the two-update rl run")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="seed-gpu-smoke-"))
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    # 1 -------------------------------------------------------------------------------------------- environment
    import torch

    if not check(
        "CUDA available",
        torch.cuda.is_available(),
        torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU",
    ):
        return 1
    check("bf16 supported", torch.cuda.is_bf16_supported())
    try:
        import vllm

        check("vLLM importable", True, vllm.__version__)
    except Exception as exc:  # noqa: BLE001
        check("vLLM importable", False, f"{type(exc).__name__}: {exc}")
        return 1
    print(f"      torch {torch.__version__}, CUDA {torch.version.cuda}, work dir {out}", flush=True)

    # 2 -------------------------------------------------------------------------------------------- model
    from seedcli.engines.tiny import build_tiny_model
    from seedcli.prompts import tokenizer_corpus

    t0 = time.time()
    model = build_tiny_model(out / "model", preset="tiny", seed=0, corpus=tokenizer_corpus(), **SHAPE)
    other = build_tiny_model(out / "model_b", preset="tiny", seed=1, corpus=tokenizer_corpus(), **SHAPE)
    check("small Qwen2 built in code", (model / "config.json").exists(), f"{SHAPE} in {time.time() - t0:.0f}s")

    if not args.skip_engine_checks:
        from seedcli.engines.vllm import VLLMEngine
        from seedcli.stages.rl import _probe

        engine = VLLMEngine(model, gpu_memory_utilization=0.3, enable_sleep_mode=True, max_model_len=4096)
        prompt, response = _probe(engine, engine.tokenizer, 5)

        # 3 ---------------------------------------------------------------------------------------- agreement
        v = engine.score([prompt], [response])[0]
        h = hf_score(model, prompt, response)
        d = mean_abs(v, h)
        check("vLLM vs transformers log-probs on the probe", d < PROBE_TOL, f"mean |Δ| = {d:.4g} over {len(h)} tokens")

        # 4 ---------------------------------------------------------------------------------------- sleep mode
        before = engine.generate([prompt], temperature=0.0, max_new_tokens=24)[0].token_ids
        free_awake = torch.cuda.mem_get_info()[0]
        engine.sleep()
        free_asleep = torch.cuda.mem_get_info()[0]
        engine.wake_up()
        after = engine.generate([prompt], temperature=0.0, max_new_tokens=24)[0].token_ids
        freed = (free_asleep - free_awake) / 2**30
        check("sleep frees GPU memory", freed > 0.5, f"{freed:.1f} GiB freed")
        check("wake-up restores the engine (greedy output unchanged)", before == after)

        # 5 ---------------------------------------------------------------------------------------- weight refresh
        from transformers import AutoModelForCausalLM

        b = AutoModelForCausalLM.from_pretrained(other, dtype=torch.float32)
        engine.update_weights(b.state_dict())
        v_b = engine.score([prompt], [response])[0]
        h_b = hf_score(other, prompt, response)
        check(
            "update_weights replaces vLLM's weights",
            mean_abs(v_b, h_b) < PROBE_TOL and mean_abs(v_b, h) > PROBE_TOL,
            f"mean |Δ| to the new model {mean_abs(v_b, h_b):.4g}, to the old one {mean_abs(v_b, h):.4g}",
        )
        engine.close()
        del engine, b
        torch.cuda.empty_cache()

    # 6 -------------------------------------------------------------------------------------------- two updates
    runs = out / "runs"
    cmd = [
        sys.executable, "-m", "seedcli", "rl", "--model", str(model), "--runs-dir", str(runs), "--gpus", "1",
        "--engine", "vllm", "--steps", "2", "--batch-tasks", "2", "--group", "4", "--max-steps", "3",
        "--max-new-tokens", "48", "--mini-batch", "8", "--lr", "1e-4", "--save-every", "1", "--val-every", "2",
        "--val-games", "2", "--workers", "4", "--analyzer", f"static:{REPO / 'data' / 'static_skills.json'}",
        "--json", "analyzer_max_new_tokens=64",
    ]  # fmt: skip
    print("      $ " + " ".join(cmd), flush=True)
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.time() - t0
    if not check(
        "seed rl --gpus 1 --engine vllm: two updates", proc.returncode == 0, f"exit {proc.returncode} in {wall:.0f}s"
    ):
        print(proc.stderr[-6000:], file=sys.stderr)
        return 1
    summary = json.loads(proc.stdout.strip().splitlines()[-1])["metrics"]
    check(
        "FSDP on one GPU",
        summary.get("parallel") == "fsdp" and summary.get("world_size") == 1,
        str(summary.get("parallel")),
    )
    run = next(d for d in (runs / "rl").iterdir() if d.is_dir() and not d.is_symlink())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    check("metrics.jsonl has updates 1 and 2", [r["step"] for r in records] == [1, 2])
    missing = sorted({k for r in records for k in REQUIRED if k not in r})
    check("every required metric present", not missing, ", ".join(missing))
    bad = sorted({k for r in records for k in REQUIRED if k in r and (r[k] is None or not math.isfinite(r[k]))})
    check("metrics finite", not bad, ", ".join(bad))
    check("OPD non-zero with static skills", all(r.get("opd/loss") not in (None, 0.0) for r in records),
          ", ".join(f"{r.get('opd/loss'):.4g}" for r in records))  # fmt: skip
    diffs = [r.get("sync/probe_mean_abs_diff", math.inf) for r in records]
    check("weights refreshed and verified after every update (probe)", all(d < PROBE_TOL for d in diffs),
          ", ".join(f"{d:.4g}" for d in diffs))  # fmt: skip
    check("validation ran", "val/success_rate" in records[-1], f"{records[-1].get('val/games')} games")
    ckpt = run / "checkpoints" / "step_000002"
    check("checkpoint written (model, sharded optimizer, RNG, state)",
          all((ckpt / p).exists() for p in ("model/config.json", "model/model.safetensors", "optimizer", "rng.pt", "state.json")))  # fmt: skip
    from seedcli.engines.hf import HFEngine
    from seedcli.stages.rl import _probe

    hf0 = HFEngine(model, device="cuda", dtype="float32")
    prompt, response = _probe(hf0, hf0.tokenizer, 5)
    before = hf0.score([prompt], [response])[0]
    hf0.close()
    trained = hf_score(ckpt / "model", prompt, response)
    check(
        "the checkpoint holds trained weights",
        mean_abs(trained, before) > 1e-4,
        f"probe moved {mean_abs(trained, before):.4g}",
    )
    for r in records:
        phases = ", ".join(f"{k.split('/')[1]} {r[k]:.1f}s" for k in sorted(r) if k.startswith("timing_s/"))
        print(f"      update {r['step']}: {phases}", flush=True)

    print(
        f"\n{'all checks passed' if not _failed else f'{_failed} check(s) FAILED'} in {time.time() - t_start:.0f}s",
        flush=True,
    )
    return 1 if _failed else 0


if __name__ == "__main__":
    sys.exit(main())
