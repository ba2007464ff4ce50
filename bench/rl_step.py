"""Per-update time of SEED vs GRPO (and SEED with `opd_contrast=shuffled`) on the tiny model, side by side in one run.

All runs start from the same tiny model with the same seed, so update 1 plays the same games with the same weights
and the same sampling seeds: the difference is the analyzer pass and the skill-context (teacher) re-scoring that
SEED adds and GRPO skips, and the contrast arm's second teacher pass (under another episode's skill). Prints each
phase and the ratio SEED / GRPO. With the default static library every category is given every category's skill
(6 texts each), so the contrast arm finds a differing skill to contrast with; `--no-contrast` leaves that arm out.

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
DEFAULT_LIBRARY = REPO / "data" / "static_skills.json"
PHASES = ("rollout", "analyze", "rescore", "rescore_teacher", "update", "sync", "step")


def run_algo(algo: str, model: Path, runs: Path, args: argparse.Namespace, *extra: str) -> list[dict]:
    cmd = [
        sys.executable, "-m", "seedcli", "rl", "-c", "tiny", "--model", str(model), "--runs-dir", str(runs),
        "--algo", algo, "--steps", str(args.steps), "--batch-tasks", str(args.batch_tasks), "--group", str(args.group),
        "--max-steps", str(args.max_steps), "--seed", "0", "--analyzer", args.analyzer if algo == "seed" else "none",
        "--save-every", str(args.steps), "--json", f"analyzer_max_new_tokens={args.analyzer_tokens}", *extra,
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
    print(f"{' '.join([algo, *extra])}: {len(records)} updates, process wall {wall:.1f}s ({run_dir})", file=sys.stderr)
    return records


def mean(records: list[dict], key: str) -> float:
    return sum(r.get(key, 0.0) for r in records) / len(records)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch-tasks", type=int, default=2)
    ap.add_argument("--group", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=3)
    ap.add_argument("--analyzer", default=f"static:{DEFAULT_LIBRARY}")
    ap.add_argument("--analyzer-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1, help="runs of each algorithm, interleaved; means over all")
    ap.add_argument("--no-contrast", action="store_true", help="leave out the opd_contrast=shuffled arm")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sys.path.insert(0, str(REPO))
        from seedcli.engines.tiny import build_tiny_model
        from seedcli.envs import tokenizer_texts

        model = build_tiny_model(tmp / "model", preset="tiny", seed=0, corpus=tokenizer_texts())
        if args.analyzer == f"static:{DEFAULT_LIBRARY}":  # one text per category: give each category all of them
            given = json.loads(DEFAULT_LIBRARY.read_text())
            texts = [t for v in given.values() for t in (v if isinstance(v, list) else [v])]
            library = tmp / "skills.json"
            library.write_text(json.dumps(dict.fromkeys(given, texts)))
            args.analyzer = f"static:{library}"
        seed, grpo, contrast = [], [], []
        for i in range(args.repeats):  # interleaved, so slow drift on a shared machine hits all alike
            seed += run_algo("seed", model, tmp / f"runs-seed-{i}", args)
            grpo += run_algo("grpo", model, tmp / f"runs-grpo-{i}", args)
            if not args.no_contrast:
                contrast += run_algo("seed", model, tmp / f"runs-contrast-{i}", args, "opd_contrast=shuffled")

    print(
        f"\nper-update seconds, mean over {len(seed)} update(s) (update 1 of the first run in brackets: identical rollouts)"
    )
    arms = [("seed", seed), ("grpo", grpo)] + ([("contrast", contrast)] if contrast else [])
    print(f"{'phase':<18}" + "".join(f"{name:>16}" for name, _ in arms) + f"{'seed/grpo':>12}")
    for phase in PHASES + (("rescore_contrast",) if contrast else ()):
        key = f"timing_s/{phase}"
        cells = "".join(f"{mean(rs, key):>9.2f} [{rs[0].get(key, 0.0):.2f}]" for _, rs in arms)
        s, g = mean(seed, key), mean(grpo, key)
        ratio = f"{s / g:.2f}" if g > 1e-3 else "-"
        print(f"{phase:<18}{cells}{ratio:>12}")
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
    if contrast:
        c_step = mean(contrast, "timing_s/step")
        print(f"ratio per-update time SEED+contrast / SEED: {c_step / s_step:.2f}; contrasted OPD tokens "
              f"{mean(contrast, 'opd/contrast_token_frac'):.2f}")  # fmt: skip
    print(f"turn-samples per update: seed {seed[0]['rollout/turn_samples']}, grpo {grpo[0]['rollout/turn_samples']}; "
          f"seed opd/loss {seed[0]['opd/loss']:.4g}, opd/valid_skill_frac {seed[0]['opd/valid_skill_frac']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
