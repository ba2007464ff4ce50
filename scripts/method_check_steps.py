"""The rl (or eval) steps of every seed × arm of a method check, one "name<TAB>command" line each, for
scripts/method_check.sh's pool. Environment: RUNS (the check's runs directory), START (the model the rl runs start
from), ARMS (only these of the config's arms), SEEDS (only these of its seeds, e.g. "0"), ENGINE (appended as
engine=…), RESUME=1 (an interrupted run of the
same command continues with `--resume`: an rl run from its last checkpoint, when the machine kept runs/; an eval from
the episodes it finished, which the record keeps too).
  python scripts/method_check_steps.py configs/method_check.yaml rl|eval
  python scripts/method_check_steps.py --line eval_warm seed eval -c … --json   # one line, with --resume if due
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml


def _can_continue(stage: str, run: Path) -> bool:
    """Whether an interrupted run left something to continue from: an rl checkpoint, an eval's finished episodes."""
    if stage == "rl":
        return any(run.glob("checkpoints/*/state.json"))
    episodes = run / "episodes.jsonl"
    return episodes.exists() and episodes.stat().st_size > 0


def interrupted(runs: Path, words: list[str]) -> Path | None:
    """The newest run of this same `seed <stage> …` command that did not complete and can be continued."""
    stage = words[1]
    found = []
    for manifest in (runs / stage).glob("*/manifest.json"):
        try:
            m = json.loads(manifest.read_text())
        except ValueError:
            continue
        argv = list(m.get("argv") or [])
        if "--resume" in argv:  # an earlier resume of it: compare the command it continued
            i = argv.index("--resume")
            argv = argv[:i] + argv[i + 2 :]
        run = manifest.parent
        if m.get("status") != "complete" and argv[1:] == words[1:] and _can_continue(stage, run):
            found.append(run)
    return max(found, default=None)


def line(name: str, cmd: str, env: dict) -> str:
    """A pool line; with RESUME=1, `--resume DIR` appended when an interrupted run of the command can continue."""
    run = interrupted(Path(env["RUNS"]), cmd.split()) if env.get("RESUME") == "1" else None
    return f"{name}\t{cmd}" + (f" --resume {run}" if run else "")


def steps(config: str, kind: str, env: dict) -> list[str]:
    mc = yaml.safe_load(Path(config).read_text())["method_check"]
    only = env.get("ARMS", "").split()
    arms = {a: v for a, v in mc["arms"].items() if not only or a in only}
    eo = f" engine={env['ENGINE']}" if env.get("ENGINE") else ""
    runs = env["RUNS"]
    index = json.loads((Path(runs) / "index.json").read_text()) if kind == "eval" else {}
    lines = []
    seeds = [s for s in mc["seeds"] if not env.get("SEEDS") or str(s) in env["SEEDS"].split()]
    for seed in seeds:
        for arm, args in arms.items():
            name = f"{arm}_s{seed}"
            if kind == "rl":
                cmd = f"seed rl -c {config} --runs-dir {runs} --model {env['START']} seed={seed} {args}{eo} --json"
                lines.append(line(f"rl_{name}", cmd, env))
            elif f"rl_{name}" in index and f"eval_{name}" not in index:  # not already evaluated after its run
                cmd = f"seed eval -c {config} --runs-dir {runs} --from {index[f'rl_{name}']}{eo} --json"
                lines.append(line(f"eval_{name}", cmd, env))
    return lines


if __name__ == "__main__":
    if sys.argv[1] == "--line":
        print(line(sys.argv[2], " ".join(sys.argv[3:]), dict(os.environ)))
    else:
        for out in steps(sys.argv[1], sys.argv[2], dict(os.environ)):
            print(out)
