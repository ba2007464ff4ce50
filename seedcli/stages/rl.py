"""`seed rl`: GRPO + self-evolving on-policy distillation (docs/design.md §1, Stage 2), one update repeated `--steps` times.

One update (`rl.update.update`, the paper's Algorithm 1), each phase one call:
  roll out     π_old plays `batch_tasks` training games `group` times each (`_Rollout.play`, seedcli.rollout)
  analyse      π_old writes a hindsight skill for every finished episode, greedy (`rl.analyse.analyse`)
  rescore      every turn's response tokens without gradient under the ordinary prompt (ℓ_old), the skill-augmented
               prompt (ℓ_skill) and the frozen starting model (ℓ_ref); group-normalised advantages of
               `10·won − 0.1·invalid` (`rl.rescore.rescore`; the reward in `rl.samples.Reward`)
  update       one epoch of dual-clip PPO + k3 KL − entropy + λ_opd·OPD (`rl.optimize.train_update`)
  refresh      the rollout engine gets the new weights and proves it, exact checksums and a fixed probe
               (`rl.weight_sync.WeightSync.refresh`)
  validate / checkpoint when due (`validate`, `rl.checkpoint.save_checkpoint`)
The stage hands the lower layers what they need of the environment once, as `rl.context.EnvHooks` (how a skill
enters a prompt, its reward convention, its leak rule and rules analyzer) and `_Rollout` (how games are played);
nothing under rl/ imports an environment.

One GPU (vLLM rollouts colocated with FSDP training, sleep mode between phases):
    seed rl --config paper_qwen25_3b --from runs/sft/<id> --gpus 1
Eight GPUs (the paper's setting; `torchrun` is launched for you):
    seed rl --config paper_qwen25_3b --from runs/sft/<id> --gpus 8
Two nodes: run on each node with its rank, the same rendezvous and a shared runs directory:
    seed rl -c paper_qwen25_3b --gpus 8 --torchrun-args "--nnodes 2 --node-rank 0 --rdzv-endpoint host0:29500 --rdzv-id seed"
CPU smoke run (tiny model, two updates, DDP over gloo with two processes; `parallel=fsdp` runs the GPU code path):
    seed rl -c tiny --model /tmp/m --analyzer static:data/static_skills.json --nproc 2
First thing on a GPU machine: `bash scripts/gpu_smoke.sh` (two updates, vLLM, FSDP, probe, sleep/wake).
One GPU with a LoRA adapter (rl/lora.py; `--print-memory-plan` shows full and LoRA training side by side):
    seed rl --config paper_qwen25_3b_lora --from runs/sft/<id>
Baselines: `--algo grpo` (λ_opd = 0, no analyzer or teacher pass), `--algo gigpo` (GRPO with GiGPO's step credit,
rl/advantages.py), `--algo sdar` (static skills, same gate), `--algo opsd` (β = 0); `--algo seed step_advantage=gigpo`
is SEED's OPD on GiGPO's advantages; `opd_retire=adaptive` retires the teacher (RetireOPD, rl/retire.py). Continue a stopped run with `--resume` and the same options.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from seedcli.artifacts import REPO_ROOT, Manifest, atomic_write_bytes, model_run, open_run, resolve_input, utc_now
from seedcli.config import RLConfig
from seedcli.engines.base import check_gpus
from seedcli.envs import env_class, get_env
from seedcli.envs.base import Environment
from seedcli.envs.pool import EnvPool
from seedcli.errors import UserError
from seedcli.images import IMAGES_DIR
from seedcli.progress import StageProgress
from seedcli.rl import distributed as D
from seedcli.rl.checkpoint import (
    CHECKPOINTS,
    checkpoint_dtype,
    latest_checkpoint,
    load_optimizer_and_rng,
    read_checkpoint_state,
    save_checkpoint,
    step_dir_name,
)
from seedcli.rl.context import (
    Plan,
    RLContext,
    load_models,
    load_rollout_engine,
    update_seed,
)
from seedcli.rl.distributed import launch, torchrun_command
from seedcli.rl.lora import ADAPTER_DIR
from seedcli.rl.memory_plan import config_comparison
from seedcli.rl.metrics import StallWatch
from seedcli.rl.optimize import NonFiniteGuard
from seedcli.rl.retire import retirement_for
from seedcli.rl.run_log import append_record, read_records_upto, rewrite_records
from seedcli.rl.skill_library import SkillCategories, default_library_path, load_skill_library
from seedcli.rl.update import update
from seedcli.rollout import EpisodeSpec, ModelPolicy, episode_metrics, play_episodes
from seedcli.stages.common import chain_model, check_model_dir, check_model_sees, make_env
from seedcli.stages.rl_setup import _context, _resume_point, _start_rank, _task_sampler, env_workers  # noqa: F401

DEFAULT_STATIC_SKILLS = REPO_ROOT / "data" / "static_skills.json"
WORKER_FILE = "worker.json"
WORKER_ERROR = "worker_error.txt"
SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"
MAX_NONFINITE = 3


# --------------------------------------------------------------------------------------------- plan


def resolve_plan(cfg: RLConfig) -> Plan:
    """The analyzer, skill library and OPD coefficients that `--algo` and `--analyzer` choose."""
    spec = cfg.analyzer.strip()
    if cfg.algo in ("grpo", "gigpo"):  # GiGPO is GRPO with step credit: no analyzer, no teacher
        return Plan("none", None, 0.0, cfg.opd_beta)
    beta = 0.0 if cfg.algo == "opsd" else cfg.opd_beta
    if spec.startswith("static:"):
        library = load_skill_library(spec.split(":", 1)[1], skill_categories(cfg.env, cfg.env_options))
        return Plan("static", library, cfg.opd_coef, beta)
    if spec == "self":
        if cfg.algo == "sdar":  # SDAR distils from a fixed skill library, never from the live analyzer
            library = load_skill_library(sdar_library(cfg.env), skill_categories(cfg.env, cfg.env_options))
            return Plan("static", library, cfg.opd_coef, beta)
        return Plan("self", None, cfg.opd_coef, beta)
    if spec == "none":
        if cfg.algo == "sdar":
            shipped = default_library_path(cfg.env)
            default = f" (default: data/{shipped.name})" if shipped.is_file() else ""
            raise UserError(f"--algo sdar needs skills: use --analyzer static:FILE{default}")
        return Plan("none", None, cfg.opd_coef, beta)
    if spec == "rules":
        if cfg.algo == "sdar":
            raise UserError("--algo sdar distils from a fixed library: use --analyzer static:FILE, not rules")
        return Plan("rules", None, cfg.opd_coef, beta)
    if spec == "hindsight":
        if cfg.algo == "sdar":
            raise UserError("--algo sdar distils from a fixed library: use --analyzer static:FILE, not hindsight")
        env = get_env(cfg.env, data_root=cfg.data_root, **cfg.env_options)
        if True not in env.expert_modes:
            raise UserError(
                f"--analyzer hindsight replays each episode against the environment's expert, and {env.title} has "
                "none; use --analyzer self, rules or static:FILE"
            )
        return Plan("hindsight", None, cfg.opd_coef, beta)
    if spec == "oracle":
        if cfg.algo == "sdar":
            raise UserError("--algo sdar distils from a fixed library: use --analyzer static:FILE, not oracle")
        env = get_env(cfg.env, data_root=cfg.data_root, **cfg.env_options)
        if type(env).oracle_skill is Environment.oracle_skill and env.no_expert():  # the default oracle: its plan
            raise UserError(
                f"--analyzer oracle: {env.no_expert()}, so there is no plan to give the teacher (the run would be "
                "plain GRPO); use --analyzer self, rules or static:FILE, or an environment with an expert"
            )
        return Plan("oracle", None, cfg.opd_coef, beta)
    raise UserError(f"--analyzer {spec!r}: use self | rules | hindsight | oracle | static:FILE | none")


def sdar_library(env_name: str) -> Path:
    """The skill library seedcli ships for `--algo sdar` on this environment; one line naming the environment when it
    ships none (SDAR's libraries cover ALFWorld, WebShop and search only)."""
    path = default_library_path(env_name)
    if not path.is_file():
        shipped = sorted(f"data/{p.name}" for p in path.parent.glob("static_skills*.json"))
        title = env_class(env_name).title
        raise UserError(
            f"--algo sdar distils from a fixed skill library, and seedcli ships none for {title} ({', '.join(shipped)} "
            f"are other environments'); pass one for {title} with --analyzer static:FILE (an annotate run's "
            "skills.jsonl, or JSON mapping each category to skills), or use --algo seed"
        )
    return path


def skill_categories(env_name: str, env_options: dict | None = None) -> SkillCategories:
    """What a static skill library needs of the environment's categories (the library never sees the environment);
    the options count where they choose the categories (TextArena's games, reasoning-gym's datasets)."""

    env = get_env(env_name, **(env_options or {}))
    return SkillCategories(env.canonical_category, tuple(env.categories), env.card.category_label, env.title)


def resolve_start_model(cfg: RLConfig) -> tuple[Path, tuple[Path, Manifest] | None]:
    """The starting model (actor and frozen reference): --model DIR, or the model/ of an sft run (or, given as
    --from, of a warm start's run: RL from the cloned expert without Stage 1)."""

    if cfg.model and cfg.from_run:
        raise UserError("pass either --from RUN (an sft run) or --model DIR, not both")
    if cfg.model:
        return check_model_dir(cfg.model), None
    path, manifest = resolve_input(("sft", "warmstart") if cfg.from_run else "sft", cfg.from_run, cfg.runs_dir)
    model = path / "model"
    if not (model / "config.json").exists():
        raise UserError(
            f"{path}: the {manifest.stage} run holds no model/ (config.json missing); rerun `seed {manifest.stage}`"
        )
    return model, (path, manifest)


def world_size(cfg: RLConfig) -> int:
    if cfg.gpus > 0 and cfg.nproc > 1:
        raise UserError("pass --gpus N (GPU, FSDP) or --nproc N (CPU, DDP over gloo), not both")
    if cfg.gpus > 0:
        check_gpus(cfg.gpus, "on CPU use --nproc N (or drop --gpus)", local=not cfg.torchrun_args)
        return cfg.gpus
    return cfg.nproc


# --------------------------------------------------------------------------------------------- the stage


def run(cfg: RLConfig) -> Manifest:
    if cfg.print_memory_plan:  # before anything is resolved or written
        sys.stdout.write(config_comparison(cfg))
        raise SystemExit(0)
    plan = resolve_plan(cfg)
    model_dir, source = resolve_start_model(cfg)
    world = world_size(cfg)
    env = make_env(cfg)
    if not env.list_tasks(env.resolve_split(cfg.split)):  # missing data is a UserError here, before any launch
        raise UserError(f"no {cfg.split} tasks for {env.title}; check --data-root")

    check_model_sees(env, model_dir, "--from" if source is not None else "--model")
    if cfg.group == 1:  # (--algo grpo and gigpo refuse it: config/rl.py)
        lone = (
            "GiGPO's episode advantage keeps each episode's raw score (verl-agent's rule for a group of one) and its "
            "step advantage is 0 for unshared states"
            if cfg.step_advantage == "gigpo"
            else "there is no baseline and every advantage is 0; only the OPD term (and the KL and entropy terms) trains"
        )
        print(f"[rl] note: group=1: each episode is its own group: {lone}", file=sys.stderr)
    multi_node = bool(cfg.torchrun_args)
    if node_rank(cfg.torchrun_args) > 0:
        return _follower_node(cfg, model_dir, world)

    chained = source or model_run(model_dir)  # --model runs/warmstart/<id>/model chains that run too
    with open_run("rl", cfg) as run:
        chain_model(run, model_dir, chained)
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
        if cfg.save_every:  # 0 saves nothing, not even the last update
            outputs[f"{CHECKPOINTS}/{step_dir_name(cfg.steps)}"] = None
        if run.file(IMAGES_DIR).is_dir():  # the observation images the samples refer to (visual environments)
            outputs[IMAGES_DIR] = None
        summary.pop("_sample_records", None)
        summary["analyzer"] = plan.analyzer + (f":{plan.library.path}" if plan.library else "")
        if plan.analyzer == "oracle":  # what a report of this run must not read as SEED's
            summary["analyzer"] = "oracle (privileged information, not SEED: the bound on the OPD channel)"
        return run.complete(outputs, summary)


def node_rank(torchrun_args: str | None) -> int:
    """The `--node-rank` in the torchrun options (0 when absent)."""

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


def train(cfg: RLConfig, run_dir: Path, model_dir: Path) -> dict:
    """The training loop on this process (rank); rank 0 writes metrics, samples, checkpoints and summary.json."""

    plan = resolve_plan(cfg)
    info = _start_rank(cfg)
    run_dir = Path(D.broadcast_object(str(run_dir), info))  # multi-node: every rank uses node 0's run directory
    ckpt, state = _resume_point(cfg, run_dir)
    start_step = int(state.get("step", 0))

    # the rollout engine (π_old), the actor θ and the frozen reference
    t_load = time.perf_counter()
    start_dir = ckpt / "model" if ckpt else Path(model_dir)
    env = make_env(cfg)
    engine, meta = load_rollout_engine(cfg, start_dir, info, env.frame_size())
    adapter_dir = ckpt / ADAPTER_DIR if ckpt and cfg.lora else None  # lora: the trained adapter, on the starting model
    models = load_models(cfg, info, engine, start_dir, Path(model_dir), adapter_dir)
    if ckpt is not None:
        load_optimizer_and_rng(ckpt, models.optimizer, models.train_model, info)
    timing_load = time.perf_counter() - t_load

    # the games
    sampler = _task_sampler(cfg, env, state)
    val_games = []
    if cfg.val_every:
        val_games = env.select_tasks(env.list_tasks(env.resolve_split(cfg.val_split)), cfg.val_tasks, cfg.seed)
    guard = NonFiniteGuard(MAX_NONFINITE, int(state.get("nonfinite_streak", 0)))
    if info.is_main:  # a resumed run forgets what its logs hold beyond the checkpoint
        rewrite_records(run_dir / METRICS, read_records_upto(run_dir / METRICS, start_step))
        if (run_dir / SAMPLES).exists():
            rewrite_records(run_dir / SAMPLES, read_records_upto(run_dir / SAMPLES, start_step))
    D.barrier(info)
    ctx = _context(cfg, plan, info, engine, meta, models, env, run_dir)
    # RetireOPD's rule, where a resumed run left it (every rank decides the same: its inputs are all-reduced)
    ctx = dataclasses.replace(ctx, retirement=retirement_for(cfg, state.get("retirement")))
    restore_probe_calibration(ctx, state)
    loop = _TrainingLoop(ctx, sampler, val_games, guard, run_dir, start_step, timing_load)
    return loop.run(env)


def restore_probe_calibration(ctx: RLContext, state: dict) -> None:
    """A resumed run keeps the weight-sync probe's calibration of the run's first check (its rank's entry of the
    checkpoint's), rather than re-measuring it on the checkpoint's weights: `sync/probe_calibration` and
    `sync/probe_drift` then read as in an uninterrupted run."""
    saved = state.get("probe_calibration") or []
    if ctx.info.rank < len(saved) and saved[ctx.info.rank] is not None:
        ctx.sync.check_sync.calibration = float(saved[ctx.info.rank])


@dataclasses.dataclass
class _TrainingLoop:
    """The updates of this session, from the step after the checkpoint to `--steps`."""

    ctx: RLContext
    sampler: Any
    val_games: list
    guard: NonFiniteGuard
    run_dir: Path
    start_step: int
    timing_load: float
    stall: StallWatch = dataclasses.field(default_factory=StallWatch)

    def run(self, env) -> dict:
        ctx, cfg, info = self.ctx, self.ctx.cfg, self.ctx.info
        sample_every = cfg.sample_every or cfg.val_every or 1
        trained, finished, t_run = 0, False, time.perf_counter()
        try:
            with (
                EnvPool(env, env_workers(cfg, info.world)) as pool,
                StageProgress("rl", cfg.steps, enabled=info.is_main) as progress,
            ):
                progress.advance(self.start_step)
                # before any update: a broken engine fails now, not after an hour of rollouts
                ctx.sync.prove_start(self.start_step)
                rollout = _Rollout(ctx, pool, progress)
                for step in range(self.start_step + 1, cfg.steps + 1):
                    record = self.step(rollout, step, want_sample=step % sample_every == 0)
                    trained += 1
                    progress.advance(
                        1,
                        reward=record["reward/mean"],
                        success=record["rollout/success_rate"],
                        opd=record["opd/loss"],
                        now=None,
                    )
            self.guard.at_end(cfg.steps)  # the last update skipped: its weights made the loss non-finite
            summary = _write_summary(cfg, info, self.run_dir, self.start_step, trained, t_run) if info.is_main else {}
            if trained == 0:
                raise UserError(
                    f"{self.run_dir}: no update was trained in this session (resumed at {self.start_step} of {cfg.steps})"
                )
            finished = True
            return summary
        finally:
            ctx.engine.close()
            if finished:  # after a failure the other ranks may be gone: torchrun tears the group down
                D.shutdown(info)

    def step(self, rollout: _Rollout, step: int, want_sample: bool) -> dict:
        """One update, then validation and a checkpoint when due; rank 0 appends the logs. Returns the record."""
        ctx, cfg, info = self.ctx, self.ctx.cfg, self.ctx.info
        t_step = time.perf_counter()
        record, sample = update(ctx, rollout, self.sampler, step, want_sample)
        if record["actor/skipped"] and info.is_main:
            print(f"[rl] warning: update {step} skipped: {record.get('actor/skip_cause')}", file=sys.stderr)
        self.guard.observe(step, bool(record["actor/skipped"]), record.get("actor/skip_cause"))
        stalled = self.stall.observe(step, record)
        if stalled and info.is_main:
            print(f"[rl] warning: {stalled}", file=sys.stderr, flush=True)
        retire = ctx.retirement  # opd_retire adaptive: the teacher-student discrepancy of this update
        if retire is not None:
            retire.observe_update(record)
        if self.val_games and step % cfg.val_every == 0:
            t0 = time.perf_counter()
            record.update(validate(ctx, rollout.pool, self.val_games, step))
            record["timing_s/val"] = time.perf_counter() - t0
            if retire is not None:  # RetireOPD decides at validations; λ_opd is 0 from the next update once retired
                record.update(retire.observe_validation(step, record["val/success_rate"]))
        record["timing_s/step"] = time.perf_counter() - t_step
        if step == self.start_step + 1:
            record["timing_s/load"] = self.timing_load
        if info.is_main:
            append_record(self.run_dir / METRICS, record)
            if sample is not None:
                append_record(self.run_dir / SAMPLES, sample)
        if cfg.save_every and (step % cfg.save_every == 0 or step == cfg.steps):
            self.checkpoint(step, record)
        return record

    def checkpoint(self, step: int, record: dict) -> None:
        """`checkpoints/step_NNNNNN/` (every rank): the actor, optimizer, RNG states and the sampler position,
        non-finite streak and the update's metrics."""
        ctx, models = self.ctx, self.ctx.models
        t0 = time.perf_counter()
        state = {
            "sampler": self.sampler.state_dict(),
            "nonfinite_streak": self.guard.streak,
            **({"retirement": ctx.retirement.state_dict()} if ctx.retirement is not None else {}),
            # every rank's weight-sync probe calibration (collective), so a resume logs the probe as it would have
            "probe_calibration": D.all_gather_object(getattr(ctx.sync.check_sync, "calibration", None), ctx.info),
            "metrics": {k: v for k, v in record.items() if isinstance(v, (int, float))},
        }
        path = save_checkpoint(
            self.run_dir / CHECKPOINTS,
            step,
            lm=models.lm,
            tokenizer=ctx.tokenizer,
            optimizer=models.optimizer,
            train_module=models.train_model,
            info=ctx.info,
            state=state,
            keep=ctx.cfg.keep_checkpoints,
            model_dtype=checkpoint_dtype(ctx.cfg, ctx.info),
            processor=ctx.vision_processor,
        )
        if ctx.info.is_main:
            print(
                f"[rl] update {step}: checkpoint {path} ({time.perf_counter() - t0:.1f}s)", file=sys.stderr, flush=True
            )


# --------------------------------------------------------------------------------------------- the games


@dataclasses.dataclass
class _Rollout:
    """How this rank plays the games of an update (`rl.update.Rollout`): seedcli.rollout over the environment pool."""

    ctx: RLContext
    pool: Any
    progress: Any = None  # a StageProgress: the update's phase and its rollout's finished episodes beside the bar

    def phase(self, step: int, name: str) -> None:
        if self.progress is not None:
            self.progress.update(now=f"update {step}: {name}")

    def play(self, games: list, step: int, followups: Any) -> list:
        """This rank's episodes of the update: its share of `games`, `group` times each, played by π_old."""
        ctx = self.ctx
        cfg, info = ctx.cfg, ctx.info
        ctx.models.lm.eval()
        specs = [
            EpisodeSpec(episode_id=f"u{step:04d}-g{gi:03d}-r{r:02d}", group_id=f"u{step:04d}-g{gi:03d}", task=game)
            for gi, game in enumerate(games)
            if gi % info.world == info.rank
            for r in range(cfg.group)
        ]
        settings = dataclasses.replace(ctx.base_settings, seed=update_seed(cfg.seed, step, "rollout", info.rank))
        mine: list = []
        meta = {**ctx.meta, "model_hash": f"{ctx.meta.get('model_hash', '')[:16]}+update{step - 1}"}
        policy = ModelPolicy(ctx.engine, settings, cfg.gen_batch)

        def done(trajectory) -> None:
            mine.append(trajectory)
            if self.progress is not None:
                won = sum(t.won for t in mine)
                self.progress.update(now=f"update {step}: rollout {len(mine)}/{len(specs)} episodes, {won} won")

        play_episodes(specs, policy, self.pool, settings, meta, done, images=ctx.images, followups=followups)
        return mine

    def summary(self, episodes) -> dict:
        """Success by category, length and invalid rate of `episodes` (what collect and eval report too)."""
        return episode_metrics(episodes)


def validate(ctx: RLContext, pool, games: list, step: int) -> dict:
    """Success on a fixed, type-balanced sample of validation games (ordinary prompt, no skill), one episode each."""

    cfg, info = ctx.cfg, ctx.info
    ctx.models.lm.eval()
    settings = dataclasses.replace(
        ctx.base_settings, temperature=cfg.val_temperature, seed=update_seed(cfg.seed, step, "val", info.rank)
    )
    specs = [
        EpisodeSpec(episode_id=f"v{step:04d}-{i:03d}", group_id=f"v{step:04d}-{i:03d}", task=g)
        for i, g in enumerate(games)
        if i % info.world == info.rank
    ]
    mine: list = []
    policy = ModelPolicy(ctx.engine, settings, cfg.gen_batch)
    play_episodes(specs, policy, pool, settings, ctx.meta, mine.append, images=ctx.images)
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


def _write_summary(cfg: RLConfig, info, run_dir: Path, start_step: int, trained: int, t_run: float) -> dict:
    """summary.json of the run so far (rank 0), from metrics.jsonl; `run` adds it to the manifest."""
    records = read_records_upto(run_dir / METRICS, cfg.steps)
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
        **({"lora": f"r={cfg.lora_r} alpha={cfg.lora_alpha} target={cfg.lora_target}"} if cfg.lora else {}),
        "final_reward_mean": last.get("reward/mean"),
        "final_success_rate": last.get("rollout/success_rate"),
        "final_opd_loss": last.get("opd/loss"),
        "final_val_success_rate": vals[-1]["val/success_rate"] if vals else None,
        "skipped_updates": sum(1 for r in records if r.get("actor/skipped")),
        "updates_without_a_win": sum(1 for r in records if not r.get("rollout/success_rate")),
        "wall_time_s_session": round(time.perf_counter() - t_run, 2),
        "_metrics_records": len(records),
        "_sample_records": len(read_records_upto(run_dir / SAMPLES, cfg.steps)),
    }
    atomic_write_bytes(run_dir / SUMMARY, orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    return summary


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
