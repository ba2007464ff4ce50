"""Run `seed` in a subprocess the way a user does, and the whole tiny-model pipeline on one environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def beside_another_worker() -> bool:
    """True in a pytest-xdist worker with other workers beside it on the same cores: there two OpenMP threads per
    process wait at every barrier for a descheduled thread (tests/conftest.py, test_every_stage_runs_on_smollm2)."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1


def seed_cli(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """`seed ARGS` from the repository root (`kw` overrides subprocess.run's options); a failure raises with stderr."""
    kw = {"cwd": REPO, "env": ENV, "timeout": 900, **kw}
    proc = subprocess.run([sys.executable, "-m", "seedcli", *args], capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"seed {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def start_model_init(out: Path, **popen_kw) -> subprocess.Popen:
    """`seed model init --preset tiny --out OUT` started in the background and returned once its build has begun
    (the partial model exists beside --out), for a test that interrupts it; `popen_kw` goes to subprocess.Popen."""
    import time

    from seedcli.artifacts.staging import staging_dir

    cmd = [sys.executable, "-m", "seedcli", "model", "init", "--preset", "tiny", "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, **popen_kw)
    build = staging_dir(out) / "model"
    deadline = time.time() + 120
    while not build.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert build.exists(), "the build never started"
    return proc


def summary(proc: subprocess.CompletedProcess) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_pipeline(tmp: Path, preset: str, rl_args: tuple[str, ...] = ("--algo", "sdar"), eval_limit: int = 5) -> dict:
    """model init → collect → annotate → sft → rl → eval with `-c preset`; the run directories by stage."""
    runs, model = tmp / "runs", tmp / "tiny"
    seed_cli("model", "init", "--preset", "tiny", "--out", str(model))
    common = ["-c", preset, "--runs-dir", str(runs), "--json"]
    out: dict[str, Path] = {"runs": runs}
    for stage, extra in (("collect", ["--model", str(model)]), ("annotate", []), ("sft", []), ("rl", list(rl_args))):
        out[stage] = runs / stage / summary(seed_cli(stage, *common, *extra))["run_id"]
    ev = summary(seed_cli("eval", *common, "--from", str(out["rl"]), "--limit", str(eval_limit)))
    out["eval"] = runs / "eval" / ev["run_id"]
    return out


def load_script(name: str):
    """scripts/<name>.py imported as a module (the scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
