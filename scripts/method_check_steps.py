"""The rl (or eval) steps of every seed × arm of a method check, one "name<TAB>command" line each, for
scripts/method_check.sh's pool. Environment: RUNS (the check's runs directory), START (the model the rl runs start
from), ARMS (only these of the config's arms), ENGINE (appended as engine=…), RESUME=1 (an rl run of the same command
that stopped after a checkpoint is continued with `--resume`, when the machine kept runs/).
  python scripts/method_check_steps.py configs/method_check.yaml rl|eval
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml


def interrupted(runs: Path, words: list[str]) -> Path | None:
    """The newest rl run of this same command that did not complete and has a checkpoint to continue from."""
    found = []
    for manifest in (runs / "rl").glob("*/manifest.json"):
        try:
            m = json.loads(manifest.read_text())
        except ValueError:
            continue
        argv = list(m.get("argv") or [])
        if "--resume" in argv:  # an earlier resume of it: compare the command it continued
            i = argv.index("--resume")
            argv = argv[:i] + argv[i + 2 :]
        run = manifest.parent
        if m.get("status") != "complete" and argv[1:] == words[1:] and any(run.glob("checkpoints/*/state.json")):
            found.append(run)
    return max(found, default=None)


def steps(config: str, kind: str, env: dict) -> list[str]:
    mc = yaml.safe_load(Path(config).read_text())["method_check"]
    only = env.get("ARMS", "").split()
    arms = {a: v for a, v in mc["arms"].items() if not only or a in only}
    eo = f" engine={env['ENGINE']}" if env.get("ENGINE") else ""
    runs = env["RUNS"]
    index = json.loads((Path(runs) / "index.json").read_text()) if kind == "eval" else {}
    lines = []
    for seed in mc["seeds"]:
        for arm, args in arms.items():
            name = f"{arm}_s{seed}"
            if kind == "rl":
                cmd = f"seed rl -c {config} --runs-dir {runs} --model {env['START']} seed={seed} {args}{eo} --json"
                run = interrupted(Path(runs), cmd.split()) if env.get("RESUME") == "1" else None
                lines.append(f"rl_{name}\t{cmd}" + (f" --resume {run}" if run else ""))
            elif f"rl_{name}" in index:
                lines.append(f"eval_{name}\tseed eval -c {config} --runs-dir {runs} --from {index[f'rl_{name}']}{eo} --json")
    return lines


if __name__ == "__main__":
    for line in steps(sys.argv[1], sys.argv[2], dict(os.environ)):
        print(line)
