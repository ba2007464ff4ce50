"""`seed collect`: the policy plays an environment's tasks; every episode lands in `trajectories.jsonl` as it ends.

One GPU (the paper's Stage-1 data: 180 ALFWorld games × 8 rollouts):
    seed collect --env alfworld --model Qwen2.5-3B-Instruct/ --engine vllm --tasks 180 --rollouts 8
CPU smoke run on a tiny model (any env: alfworld | webshop | search):
    seed model init --preset tiny --out /tmp/m
    seed collect --model /tmp/m --tasks 6 --rollouts 2 --max-steps 4 --max-new-tokens 48
    seed collect --env webshop --model /tmp/m --tasks 6 --rollouts 2 --max-new-tokens 48
Eight GPUs: run one collect per GPU on disjoint `--task-types` (categories; collection is embarrassingly parallel)
or use vLLM with tensor parallelism on one large model.
"""

from __future__ import annotations

import time

from seedcli.artifacts import Manifest, model_run, open_run
from seedcli.config import CollectConfig
from seedcli.images import check_images
from seedcli.rollout import EpisodeSpec, ModelPolicy, episode_metrics
from seedcli.stages.common import (
    chain_model,
    check_model_dir,
    check_model_sees,
    image_outputs,
    load_policy_engine,
    make_env,
    play_to_file,
    settings_from,
)


def run(cfg: CollectConfig) -> Manifest:
    env = make_env(cfg)
    split = env.resolve_split(cfg.split)
    games = env.select_tasks(env.list_tasks(split), cfg.tasks, cfg.seed, cfg.categories)
    model_dir = check_model_dir(cfg.model)
    check_model_sees(env, model_dir)
    specs = [
        EpisodeSpec(episode_id=f"g{gi:04d}-r{r:02d}", group_id=f"g{gi:04d}", task=task)
        for gi, task in enumerate(games)
        for r in range(cfg.rollouts)
    ]
    source = model_run(model_dir)  # a warm start's (or any run's) model/: chain that run
    with open_run("collect", cfg) as run:
        chain_model(run, model_dir, source)
        engine, meta = load_policy_engine(cfg, model_dir)
        t0 = time.time()
        try:
            policy = ModelPolicy(engine, settings_from(cfg), cfg.gen_batch)
            episodes, resumed = play_to_file(
                "collect", specs, policy, cfg, meta, run.file("trajectories.jsonl"), env=env
            )
        finally:
            engine.close()
        metrics = episode_metrics(episodes)
        metrics.update(
            env=env.name,
            games=len(games),
            rollouts=cfg.rollouts,
            split=split,
            resumed_episodes=resumed,
            wall_time_s=round(time.time() - t0, 2),
            model_hash=meta["model_hash"],
            prompt_version=episodes[0].prompt_version if episodes else None,
        )
        metrics["images"] = check_images(run.path, episodes)
        return run.complete({"trajectories.jsonl": len(episodes), **image_outputs(run.path)}, metrics)
