"""The positive control for SEED's channel (docs/positive-control.md): from one start model, every arm ×
seed of the config's `positive_control` section trained by `seed rl`, then read three ways against that start:
success on the same held-out test tasks (`seed eval`), and absorption (`seed probe --measure absorption`) on two
panels of expert-played states, the tasks the seed's rl runs trained on and held-out test tasks.

    python scripts/positive_control.py -c configs/positive_control.yaml --runs runs/pc        # everything left to do
    python scripts/positive_control.py -c configs/positive_control.yaml --runs runs/pc --arms grpo signed_oracle \
        --seeds 0                                                                             # only these
    python scripts/positive_control.py -c configs/positive_control.yaml --runs runs/pc --report-only

Resumable: every finished step is named in RUNS/index.json with its run directory and kept on the next call (delete
an entry to redo it); an rl run killed mid-way continues from its last checkpoint. Two drivers may share RUNS (other
arms side by side, started once the first has made the panels). Each command, its wall time and its
exit code go to RUNS/commands.jsonl, its output to RUNS/logs/<step>.log. The document is regenerated at the end
(scripts/positive_control_report.py).

The training panel of seed s is the pool `seed rl seed=s` draws its tasks from (`train_tasks` of the split, through
`train_fraction`), played by the expert (scripts/expert_panel.py); every arm of seed s trains on exactly those tasks.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


class Steps:
    """RUNS/index.json (step → run directory) and the commands' log."""

    def __init__(self, runs: Path):
        self.runs = runs
        (runs / "logs").mkdir(parents=True, exist_ok=True)
        self.path = runs / "index.json"
        self.index = json.loads(self.path.read_text()) if self.path.exists() else {}

    def done(self, name: str) -> str | None:
        return self._read().get(name)

    def _read(self) -> dict:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def _record(self, name: str, run: str) -> None:
        """Add one entry to index.json under a lock, re-read first: two drivers on the same RUNS (other arms, side
        by side) keep each other's entries."""
        with open(self.runs / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.index = {**self._read(), name: run}
            self.path.write_text(json.dumps(self.index, indent=1))

    def run(self, name: str, words: list[str], resume_stage: str | None = None) -> str:
        """Run `words` (a `seed … --json` command, or a script printing its run directory last) unless done; returns
        the run directory it made."""
        self.index = self._read()
        if name in self.index:
            return self.index[name]
        if resume_stage:
            prior = _interrupted(self.runs, resume_stage, words)
            if prior is not None:
                words = [*words, "--resume", str(prior)]
        print(f"== {name}: {shlex.join(words)}", flush=True)
        t0 = time.time()
        with open(self.runs / "logs" / f"{name}.log", "w") as log:
            proc = subprocess.run(words, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True, check=False)
        seconds = round(time.time() - t0, 1)
        lines = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()]
        run = None
        if proc.returncode == 0 and lines:
            try:
                summary = json.loads(lines[-1])
                run = str(Path(summary.get("runs_dir") or self._runs_dir(words)) / summary["stage"] / summary["run_id"])
            except (ValueError, KeyError):
                run = lines[-1].strip()
        with open(self.runs / "commands.jsonl", "a") as f:
            f.write(json.dumps({"name": name, "command": shlex.join(words), "seconds": seconds,
                                "rc": proc.returncode, "run": run}) + "\n")  # fmt: skip
        if proc.returncode != 0 or run is None:
            tail = (self.runs / "logs" / f"{name}.log").read_text().strip().splitlines()[-5:]
            raise SystemExit(f"step {name} failed (rc {proc.returncode}): see {self.runs}/logs/{name}.log\n" +
                             "\n".join(tail))  # fmt: skip
        self._record(name, run)
        print(f"   {name}: {seconds:.0f}s → {run}", flush=True)
        return run

    @staticmethod
    def _runs_dir(words: list[str]) -> str:
        return words[words.index("--runs-dir") + 1] if "--runs-dir" in words else "runs"


def _interrupted(runs: Path, stage: str, words: list[str]) -> Path | None:
    """The newest run of this same command that did not complete and left a checkpoint (rl) or episodes (eval)."""
    found = []
    for manifest in runs.glob(f"**/{stage}/*/manifest.json"):
        try:
            m = json.loads(manifest.read_text())
        except ValueError:
            continue
        argv = list(m.get("argv") or [])
        if "--resume" in argv:
            i = argv.index("--resume")
            argv = argv[:i] + argv[i + 2 :]
        run = manifest.parent
        left = any(run.glob("checkpoints/*/state.json")) if stage == "rl" else (run / "episodes.jsonl").exists()
        if m.get("status") != "complete" and argv[1:] == words[2:] and left:
            found.append(run)
    return max(found, default=None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", required=True)
    ap.add_argument("--runs", required=True)
    ap.add_argument("--arms", nargs="*", help="only these arms (default: all of the config's)")
    ap.add_argument("--seeds", nargs="*", type=int, help="only these seeds (default: the config's)")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--doc", default="docs/positive-control.md")
    args = ap.parse_args()
    cfg = yaml.safe_load(Path(args.config).read_text())
    pc = cfg["positive_control"]
    env = cfg["env"]
    runs = Path(args.runs)
    steps = Steps(runs)
    seeds = args.seeds if args.seeds is not None else pc["seeds"]
    arms = {a: v for a, v in pc["arms"].items() if not args.arms or a in args.arms}
    seed = [sys.executable, "-m", "seedcli"]
    c = ["-c", args.config]
    if not args.report_only:
        start = pc["start"]
        # the start's figures: success on the held-out test tasks, absorption on the held-out panel
        steps.run("eval_start", [*seed, "eval", *c, "--runs-dir", str(runs), "--model", start, "--json"], "eval")
        heldout = steps.run("panel_heldout", [*seed, "eval", *c, "--runs-dir", str(runs / "panel-heldout"),
                                              "--policy", "expert", f"limit={pc.get('heldout_limit', pc['heldout_panel'])}",
                                              "--json"])  # fmt: skip
        probe = [*seed, "probe", *c, "--runs-dir", str(runs), "--measure", "absorption"]
        base_heldout = steps.run("absorb_start_heldout", [*probe, "--from", heldout, "--model", start,
                                                          f"episodes={pc['heldout_panel']}", "--json"])  # fmt: skip
        n_train = pc["train_tasks"]
        for s in seeds:
            fraction = _train_fraction(env, cfg, n_train)
            train = steps.run(f"panel_train_s{s}", [sys.executable, "scripts/expert_panel.py", "--env", env, "--seed",
                                                    str(s), "--train-fraction", repr(fraction), "--runs-dir",
                                                    str(runs / f"panel-train-s{s}"), *_panel_overrides(cfg)])  # fmt: skip
            base_train = steps.run(f"absorb_start_train_s{s}", [*probe, "--from", train, "--model", start,
                                                                f"episodes={n_train}", "--json"])  # fmt: skip
            for arm, spec in arms.items():
                name = f"{arm}_s{s}"
                rl = steps.run(f"rl_{name}", [*seed, "rl", *c, "--runs-dir", str(runs), "--model", start,
                                              f"seed={s}", f"train_fraction={fraction!r}", *shlex.split(spec),
                                              "--json"], "rl")  # fmt: skip
                model = _final_model(Path(rl))
                steps.run(f"eval_{name}", [*seed, "eval", *c, "--runs-dir", str(runs), "--from", rl, "--json"],
                          "eval")  # fmt: skip
                steps.run(f"absorb_{name}_train", [*probe, "--from", train, "--model", model, "--baseline",
                                                   base_train, f"episodes={n_train}", "--json"])  # fmt: skip
                steps.run(f"absorb_{name}_heldout", [*probe, "--from", heldout, "--model", model, "--baseline",
                                                     base_heldout, f"episodes={pc['heldout_panel']}", "--json"])  # fmt: skip
    report = [sys.executable, "scripts/positive_control_report.py", "--runs", str(runs), "-c", args.config,
              "--out", args.doc]  # fmt: skip
    return subprocess.run(report, cwd=ROOT, check=False).returncode


def _final_model(rl: Path) -> str:
    """The model an rl run ended with: its model/, or its last checkpoint's (`seed eval --from` reads it alike)."""
    if (rl / "model" / "config.json").exists():
        return str(rl / "model")
    steps = sorted(rl.glob("checkpoints/step_*/model/config.json"))
    if not steps:
        raise SystemExit(f"{rl}: no model/ and no checkpoint with a model")
    return str(steps[-1].parent)


def _train_fraction(env: str, cfg: dict, n: int) -> float:
    """The `train_fraction` whose pool holds `n` tasks of the rl split (TaskSampler keeps round(fraction × size))."""
    sys.path.insert(0, str(ROOT))
    from seedcli.config import build_config
    from seedcli.stages.common import make_env

    rl = build_config("rl", None, {"env": env, **{k: v for k, v in (cfg.get("rl") or {}).items()
                                                   if k in ("split", "env_options", "data_root")}})  # fmt: skip
    e = make_env(rl)
    size = len(e.list_tasks(e.resolve_split(rl.split)))
    return n / size


def _panel_overrides(cfg: dict) -> list[str]:
    """The eval settings the expert's panel shares with the rl runs' episodes (the prompt's history, the turns)."""
    rl = cfg.get("rl") or {}
    return [f"{k}={rl[k]}" for k in ("history", "max_steps") if k in rl]


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
