"""Per-update time of SEED vs GRPO on the tiny model, measured side by side in one run.

Both runs start from the same tiny model with the same seed, so update 1 plays the same games with the same weights
and the same sampling seeds: the difference is the analyzer pass and the skill-context (teacher) re-scoring that
SEED adds and GRPO skips. Prints each phase and the ratio SEED / GRPO.

    .venv/bin/python bench/rl_step.py                          # static skills (the teacher pass always runs)
    .venv/bin/python bench/rl_step.py --analyzer self          # π_old writes the skills (the paper's SEED)
    .venv/bin/python bench/rl_step.py --steps 3 --group 4      # more updates / bigger groups
    .venv/bin/python bench/rl_step.py --repeats 3              # less noise on a shared machine
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
PHASES = ("rollout", "analyze", "rescore", "rescore_teacher", "update", "sync", "step")


def run_algo(algo: str, model: Path, runs: Path, args: argparse.Namespace) -> list[dict]:
    cmd = [
        sys.executable, "-m", "seedcli", "rl", "-c", "tiny", "--model", str(model), "--runs-dir", str(runs),
        "--algo", algo, "--steps", str(args.steps), "--batch-tasks", str(args.batch_tasks), "--group", str(args.group),
        "--max-steps", str(args.max_steps), "--seed", "0", "--analyzer", args.analyzer if algo == "seed" else "none",
        "--save-every", str(args.steps), "--json", f"analyzer_max_new_tokens={args.analyzer_tokens}",
    ]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    )
    if proc.returncode != 0:
        sys.exit(f"{algo} run failed:\n{proc.stderr[-3000:]}")
    wall = time.perf_counter() - t0
    run_dir = sorted((runs / "rl").glob("2*"))[-1]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    print(f"{algo}: {len(records)} updates, process wall {wall:.1f}s ({run_dir})", file=sys.stderr)
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch-tasks", type=int, default=2)
    ap.add_argument("--group", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=3)
    ap.add_argument("--analyzer", default=f"static:{REPO / 'data' / 'static_skills.json'}")
    ap.add_argument("--analyzer-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1, help="runs of each algorithm, interleaved; means over all")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sys.path.insert(0, str(REPO))
        from seedcli.engines.tiny import build_tiny_model
        from seedcli.envs import tokenizer_texts

        model = build_tiny_model(tmp / "model", preset="tiny", seed=0, corpus=tokenizer_texts())
        seed, grpo = [], []
        for i in range(args.repeats):  # interleaved, so slow drift on a shared machine hits both alike
            seed += run_algo("seed", model, tmp / f"runs-seed-{i}", args)
            grpo += run_algo("grpo", model, tmp / f"runs-grpo-{i}", args)

    print(
        f"\nper-update seconds, mean over {len(seed)} update(s) (update 1 of the first run in brackets: identical rollouts)"
    )
    print(f"{'phase':<18}{'seed':>14}{'grpo':>14}{'seed/grpo':>12}")
    for phase in PHASES:
        key = f"timing_s/{phase}"
        s = sum(r.get(key, 0.0) for r in seed) / len(seed)
        g = sum(r.get(key, 0.0) for r in grpo) / len(grpo)
        s1, g1 = seed[0].get(key, 0.0), grpo[0].get(key, 0.0)
        ratio = f"{s / g:.2f}" if g > 1e-3 else "-"
        print(f"{phase:<18}{s:>8.2f} [{s1:.2f}]{g:>8.2f} [{g1:.2f}]{ratio:>12}")
    # rollouts are the same work for both (update 1: the same tokens), so their timing noise is left out here
    extra = ("analyze", "rescore", "update", "sync")
    s_train = sum(r.get(f"timing_s/{k}", 0.0) for r in seed for k in extra) / len(seed)
    g_train = sum(r.get(f"timing_s/{k}", 0.0) for r in grpo for k in extra) / len(grpo)
    print(
        f"\nanalyze + rescore + update + sync: seed {s_train:.2f}s, grpo {g_train:.2f}s, ratio {s_train / g_train:.2f}"
    )
    s_step = sum(r["timing_s/step"] for r in seed) / len(seed)
    g_step = sum(r["timing_s/step"] for r in grpo) / len(grpo)
    print(f"ratio per-update time SEED / GRPO: {s_step / g_step:.2f}  (update 1: "
          f"{seed[0]['timing_s/step'] / grpo[0]['timing_s/step']:.2f})")  # fmt: skip
    print(f"turn-samples per update: seed {seed[0]['rollout/turn_samples']}, grpo {grpo[0]['rollout/turn_samples']}; "
          f"seed opd/loss {seed[0]['opd/loss']:.4g}, opd/valid_skill_frac {seed[0]['opd/valid_skill_frac']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
