"""Setting up one rank of `seed rl`: the process group and its seed, the checkpoint `--resume` continues from, the
task sampler, the environment worker count and the context the phases share (`RLContext`: the plan, the models,
the weight sync with its probe, and the environment's hooks)."""

from __future__ import annotations

import dataclasses
import datetime
import os
import random
from pathlib import Path

import numpy as np
import torch

from seedcli.config import RLConfig
from seedcli.engines.base import pad_token_id
from seedcli.envs import get_env
from seedcli.errors import UserError
from seedcli.images import run_images
from seedcli.precision import compute_dtype_name
from seedcli.rl import distributed as D
from seedcli.rl.checkpoint import CHECKPOINTS, latest_checkpoint, read_checkpoint_state
from seedcli.rl.context import EnvHooks, Plan, RLContext, vision_processor
from seedcli.rl.lora import merged_params, proof_names
from seedcli.rl.sampler import TaskSampler
from seedcli.rl.samples import Reward
from seedcli.rl.weight_sync import ProbeCheck, WeightSync, make_probe, names_for_config
from seedcli.skill_leaks import find_leaks, leak_metrics
from seedcli.stages.common import settings_from


def _start_rank(cfg: RLConfig):
    """Join the process group (one process: a group of one) and seed this rank: torch, and Python's and numpy's
    generators too, whose states every checkpoint saves (unseeded, they came from the OS, so two runs' rng.pt, and a
    resumed run's, differed from an uninterrupted one's)."""
    info = D.init_distributed(
        use_cuda=cfg.gpus > 0,
        fsdp=None if cfg.parallel == "auto" else cfg.parallel == "fsdp",
        timeout=datetime.timedelta(minutes=cfg.collective_timeout_min),
    )
    if info.world > 1 and info.device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // info.world))
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    return info


def _resume_point(cfg: RLConfig, run_dir: Path) -> tuple[Path | None, dict]:
    """The checkpoint `--resume` continues from and its state ({} when starting fresh)."""
    ckpt = latest_checkpoint(run_dir / CHECKPOINTS) if cfg.resume else None
    state = read_checkpoint_state(ckpt) if ckpt else {}
    start_step = int(state.get("step", 0))
    if cfg.resume and start_step >= cfg.steps:
        raise UserError(f"--resume {run_dir}: already at update {start_step} of {cfg.steps}; nothing to train")
    return ckpt, state


def _task_sampler(cfg: RLConfig, env, state: dict):
    sampler = TaskSampler(env.list_tasks(env.resolve_split(cfg.split)), cfg.batch_tasks, cfg.seed, cfg.train_fraction)
    if state.get("sampler"):
        sampler.load_state_dict(state["sampler"])
    return sampler


def _context(cfg: RLConfig, plan: Plan, info, engine, meta: dict, models, env, run_dir: Path) -> RLContext:
    """What the phases share; from the environment only how a skill enters its prompt, its reward convention, its
    leak rule and its rules analyzer (`EnvHooks`)."""
    # the probe's allowed drift beyond its calibration (a warning): float noise when both sides are fp32 (CPU, or a
    # shared model); looser for a bf16 engine (vLLM or hf) against a bf16 trainer (FSDP or autocast)
    fp32 = models.shared or (info.device.type == "cpu" and compute_dtype_name(cfg.dtype, info.device) == "float32")
    sync_tol = cfg.sync_tol or (1e-3 if fp32 else 0.05)
    tokenizer = engine.tokenizer
    pad_id = pad_token_id(tokenizer)
    probe = make_probe(engine, tokenizer, *_probe_texts(cfg.history))
    check_sync = ProbeCheck(
        engine, models.train_model, probe, tol=sync_tol, max_tokens=cfg.micro_batch_tokens, pad_id=pad_id, info=info
    )
    names = names_for_config(models.lm.config, linear=not getattr(engine, "on_cpu", False))
    sync = WeightSync(
        engine, models.lm, info, shared=models.shared, check_sync=check_sync, checksum_names=names,
    )  # fmt: skip
    if cfg.lora:  # the engine serves the merged weights, and the proof covers those the adapter changes
        sync = lora_sync(sync, models.lm)
    hooks = EnvHooks(
        insert_skill=env.insert_skill, insert_step_skill=env.insert_step_skill,
        reward=Reward(env.success_reward, env.invalid_penalty),
        audit_skills=lambda episodes, skills: leak_metrics(env, episodes, skills),
        find_leaks=lambda episodes, skills: find_leaks(env, episodes, skills),
        rules_skill=env.rules_skill, hindsight_skill=env.hindsight_skill, oracle_skill=env.oracle_skill,
    )  # fmt: skip
    return RLContext(
        cfg=cfg, plan=plan, info=info, engine=engine, meta=meta, models=models, hooks=hooks, sync=sync,
        base_settings=settings_from(cfg), vision_processor=vision_processor(engine, models, meta),
        images=run_images(run_dir),  # observation images (visual environments), shared by the ranks of one node
        run_dir=run_dir,  # dump_analyses writes here
    )  # fmt: skip


def lora_sync(sync: WeightSync, lm) -> WeightSync:
    """`lora=true`: stream and checksum the merged view (rl/lora.py), and require the merged weights of the first and
    last layer's adapted modules in every proof (vLLM's CPU backend, which repacks linear weights, keeps a copy of
    those layers' for it: `vllm_engine_kwargs`' keep_linear)."""
    required = proof_names(lm)
    names = list(dict.fromkeys([*sync.checksum_names, *required]))
    return dataclasses.replace(sync, params=merged_params, checksum_names=names, required=required)


def _probe_texts(history: int) -> tuple[str, str]:
    """The fixed (user message, response) of the weight-sync probe: an ALFWorld first turn, whatever the env."""
    alfworld = get_env("alfworld")
    prompt = alfworld.render_prompt(
        "put a clean mug in coffeemachine.",
        "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a countertop 1, "
        "a coffeemachine 1, and a sinkbasin 1.",
        ["go to cabinet 1", "go to countertop 1", "go to coffeemachine 1", "go to sinkbasin 1", "inventory", "look"],
        1,
        [],
        history,
    )
    return prompt, alfworld.format_response("I need a mug; mugs are often on the countertop.", "go to countertop 1")


def env_workers(cfg: RLConfig, world: int) -> int:
    """Environment worker processes per rank: the configured number, else enough for 16 live games (8), capped by
    this rank's share of the CPU cores."""
    if cfg.workers is not None:
        return cfg.workers
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, cores // max(1, world)))
