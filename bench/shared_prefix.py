"""The scorer's shared prefix (`share_prefix`, rl/logprobs.py) side by side in one run: one `seed rl` update from the
same model and seed with it off, then on. Generation does not use it, so both play the same episodes; the re-scoring
(ℓ_old, ℓ_ref, the teacher) and the update (forward + backward) differ only by it. An agent's turn-samples repeat their
prompt's beginning (text EZPoints: the chat template and the rules up to the cards, and within one game 370 of ~475
SmolLM2 tokens), and with the option on the samples of one game share a micro-batch and that micro-batch runs its
common prefix once.

Reported per setting: the phases' seconds; then the ratios, whether the two played the same episodes, and how far
the update's loss, KL and gradient norm moved (float rounding: the computation is the same up to it). The rollout is
the same work in both, so its ratio says how much the machine's load differed between them (1.00x on a quiet one);
`--first on` runs the settings in the other order. The dtype stands beside "same episodes": in bf16 an async rollout's
batches follow thread timing and parts them; pass `deterministic=true` there (both runs then play lockstep).

    .venv/bin/python bench/shared_prefix.py --model runs/method-check/models/agent  # a SmolLM2 warm start, EZPoints
    .venv/bin/python bench/shared_prefix.py --tiny                                  # the tiny model built in code

Last line: `shared prefix bench: rescore <x>x | update <y>x | rescore+update <z>x | same episodes (<dtype>): yes | ...`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PHASES = ("rollout", "rescore", "update", "step")
COMPARED = ("actor/pg_loss", "actor/kl", "actor/grad_norm", "actor/entropy")


def one_update(args: argparse.Namespace, model: Path, runs: Path, share: bool) -> dict:
    cmd = [
        sys.executable, "-m", "seedcli", "rl", "-c", args.config, "--model", str(model), "--runs-dir", str(runs),
        "--algo", args.algo, "--analyzer", args.analyzer, "--json", f"engine={args.engine}", "steps=1", "seed=0",
        "save_every=0", "val_every=0", f"share_prefix={str(share).lower()}", *args.extra,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"share_prefix={share}: seed rl failed:\n{proc.stderr[-3000:]}")
    run = sorted((runs / "rl").glob("2*"), key=lambda p: p.stat().st_mtime)[-1]
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    times = {p: record.get(f"timing_s/{p}", 0.0) for p in PHASES}
    print(
        f"share_prefix={str(share).lower():5s}: " + "  ".join(f"{p} {t:7.1f}s" for p, t in times.items())
        + f"  (process {time.perf_counter() - t0:.0f}s, {run.name})",
        flush=True,
    )  # fmt: skip
    # what the rollout played: the same episodes give the same counts, tokens, rewards and advantages' shape
    played = {k: v for k, v in record.items() if k.startswith(("rollout/", "adv/"))}
    from seedcli.precision import compute_dtype_name

    dtype = compute_dtype_name(json.loads((run / "manifest.json").read_text())["config"].get("dtype"), "cpu")
    return {"times": times, "record": record, "played": played, "dtype": dtype}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="a model directory (default: the tiny model with --tiny)")
    ap.add_argument("--config", default="configs/method_check.yaml")
    ap.add_argument("--tiny", action="store_true", help="the tiny model built in code on the tiny config (seconds)")
    ap.add_argument("--engine", default="hf")
    ap.add_argument("--algo", default="grpo")
    ap.add_argument("--analyzer", default="none")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--first", choices=("off", "on"), default="off", help="which setting runs first")
    ap.add_argument("extra", nargs="*", help="more key=value options for both runs")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="shared-prefix-") as tmp:
        model = args.model
        if args.tiny:
            args.config = "tiny"
            model = Path(tmp) / "tiny"
            subprocess.run(
                [sys.executable, "-m", "seedcli", "model", "init", "--preset", "tiny", "--out", str(model)],
                cwd=REPO, check=True, capture_output=True,
            )  # fmt: skip
        if model is None or not (model / "config.json").exists():
            print("error: --model DIR (a model directory) or --tiny", file=sys.stderr)
            return 2
        runs = {}
        for share in (False, True) if args.first == "off" else (True, False):
            runs[share] = one_update(args, model, Path(tmp) / str(share), share)
        off, on = runs[False], runs[True]
    ratio = {p: off["times"][p] / max(on["times"][p], 1e-9) for p in PHASES}
    both = (off["times"]["rescore"] + off["times"]["update"]) / max(on["times"]["rescore"] + on["times"]["update"], 1e-9)
    same = "yes" if off["played"] == on["played"] and off["played"] else "NO"
    moved = max(
        abs(on["record"][k] - off["record"][k]) / max(abs(off["record"][k]), 1e-12)
        for k in COMPARED
        if k in off["record"] and k in on["record"]
    )
    print(
        f"shared prefix bench: rescore {ratio['rescore']:.2f}x | update {ratio['update']:.2f}x | rescore+update "
        f"{both:.2f}x | whole update {ratio['step']:.2f}x | rollout {ratio['rollout']:.2f}x (the same work: how much "
        f"the machine's load differed) | same episodes ({off['dtype']}): {same} | max relative change of "
        f"{'/'.join(k.split('/')[1] for k in COMPARED)} {moved:.1e}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
