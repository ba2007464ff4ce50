"""`seed eval`: play every task of an evaluation split once, with the ordinary agent prompt only (never a skill),
and report the environment's metrics per category beside the paper's numbers. ALFWorld: valid_seen (140) or
valid_unseen (134), success per task type and its macro-average; WebShop: test goals 0-499, score and success;
search: exact match per data source and their average (`--categories nq,bamboogle` chooses sources).

One GPU:
    seed eval --split unseen --from runs/rl/<id> --engine vllm
    seed eval --env webshop --split test --from runs/rl/<id> --engine vllm
Check the harness (ALFWorld: must be 134/134 and 140/140; WebShop: the ceiling of its search engine) and the floor:
    seed eval --split unseen --policy expert
    seed eval --env webshop --split test --policy expert
    seed eval --split seen --policy random
Quick partial look on CPU (marked partial everywhere):
    seed eval --split seen --model /tmp/m --limit 12
    seed eval --env search --split test --categories nq,bamboogle --limit 20 --policy expert   # 20 per data source
"""

from __future__ import annotations

import time
from pathlib import Path

from seedcli.artifacts import Manifest, model_run, open_run, read_manifest, verify_run
from seedcli.config import EvalConfig
from seedcli.envs.base import Environment, Task
from seedcli.errors import UserError
from seedcli.images import check_images
from seedcli.report.commands import write_eval_outputs
from seedcli.report.markdown import metric_text
from seedcli.report.results import summarize_episodes
from seedcli.rollout import EpisodeSpec, ExpertPolicy, ModelPolicy, RandomPolicy
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

FROM_STAGES = ("sft", "rl", "warmstart")  # the runs `--from` takes: each holds a model/ (rl: or checkpoints)


def resolve_model(cfg: EvalConfig) -> tuple[Path, tuple[str, Path, Manifest] | None]:
    """The model directory to evaluate, and the run it came from (to chain the manifest)."""
    if cfg.from_run:
        path = Path(cfg.from_run)
        if not path.exists():
            raise UserError(f"--from {path}: no such directory")
        run_dir, ckpt = path, None
        if not (path / "manifest.json").exists():
            # a checkpoint inside an rl/sft run: runs/rl/<id>/checkpoints/step_000120
            run_dir = path.parent.parent
            ckpt = path
            if not (run_dir / "manifest.json").exists():
                raise UserError(f"--from {path}: neither a run directory nor a checkpoint inside one")
        manifest = read_manifest(run_dir)
        if ckpt is None or manifest.status == "complete":  # a checkpoint of a run still going is hashed instead
            manifest = verify_run(run_dir, FROM_STAGES)
        if manifest.stage not in FROM_STAGES:
            raise UserError(
                f"--from {path}: a {manifest.stage} run; eval takes an sft, rl or warmstart run (or --model DIR)"
            )
        if ckpt is not None:
            model = ckpt / "model"
        elif (run_dir / "model").is_dir():
            model = run_dir / "model"
        else:
            steps = sorted((run_dir / "checkpoints").glob("step_*"))
            if not steps:
                raise UserError(f"--from {run_dir}: no model/ and no checkpoints/step_*; the run saved no model")
            model = steps[-1] / "model"
        if not (model / "config.json").exists():
            raise UserError(f"--from {path}: {model} holds no model (config.json missing); pick another checkpoint")
        if cfg.model and check_model_dir(cfg.model).resolve() != model.resolve():
            raise UserError(
                f"--model {cfg.model}, but --from {path} evaluates the run's own model ({model}); pass one of them"
            )
        return model, (manifest.stage, run_dir, manifest)
    model = check_model_dir(cfg.model)
    run = model_run(model)  # a run's model/ given as --model: chain that run
    return model, ((run[1].stage, run[0], run[1]) if run is not None else None)


def only_categories(env: Environment, tasks: list[Task], wanted: list[str]) -> list[Task]:
    """The tasks of the categories named in `--categories` (aliases allowed); an absent one is a UserError."""
    present = list(dict.fromkeys(t.category for t in tasks))
    chosen = []
    for name in wanted:
        cat = name if name in present else env.canonical_category(name)
        if cat not in present:
            raise UserError(
                f"--categories {name}: the split has no such {env.card.category_label}; it has {', '.join(present)}"
            )
        chosen.append(cat)
    return [t for t in tasks if t.category in set(chosen)]


def limit_tasks(env: Environment, tasks: list[Task], limit: int | None, seed: int) -> tuple[list[Task], bool]:
    """(the tasks `--limit` keeps, whether that is fewer than all): N balanced over categories, or N per category
    where the environment says so (search: per data source); seeded, so reruns play the same tasks."""
    if limit is None:
        return tasks, False
    if not env.limit_per_category:
        # balanced, so a partial result covers every category
        return (env.select_tasks(tasks, limit, seed), True) if limit < len(tasks) else (tasks, False)
    by_cat: dict[str, list[Task]] = {}
    for t in tasks:
        by_cat.setdefault(t.category, []).append(t)
    kept = [t for group in by_cat.values() for t in env.select_tasks(group, limit, seed)]
    return kept, len(kept) < len(tasks)


def env_setup(env: Environment, cfg: EvalConfig) -> dict:
    """What the numbers depend on beyond the model: the data root and the env options (search: the retriever)."""
    try:
        root = str(env.resolve_data_root())
    except UserError:
        root = None  # an environment served entirely by options (search with search_url) may have no data root
    return {"data_root": root, "env_options": dict(cfg.env_options)}


def headline_metrics(env: Environment, results: dict) -> dict:
    """The metrics of the run's summary, the environment's headline first (ALFWorld: macro success; WebShop: score;
    search: exact match averaged over data sources), then the rest."""
    headline = next(iter(env.card.metric_labels))
    value = metric_text(results, headline)
    metrics: dict = {"env": env.name, "headline": f"{env.card.metric_labels[headline]} {value} ({headline})"}
    keys = (
        *env.card.metric_labels,
        "macro_success",
        "micro_success",
        "mean_score",
        "mean_episode_length",
        "mean_reward",
        "invalid_action_rate",
        "partial",
    )
    for k in keys:
        if k in results and k not in metrics:
            metrics[k] = results[k]
    return metrics


def run(cfg: EvalConfig) -> Manifest:
    env = make_env(cfg)
    split = env.resolve_split(cfg.split)
    if split not in env.eval_splits:
        raise UserError(
            f"seed eval --split {cfg.split}: {env.title} evaluates on {' or '.join(env.eval_splits)}; pick one of them"
        )
    games = env.list_tasks(split)
    if cfg.categories:
        games = only_categories(env, games, cfg.categories)
    expected = len(games)
    games, partial = limit_tasks(env, games, cfg.limit, cfg.seed)
    specs = [EpisodeSpec(episode_id=f"e{i:04d}", group_id=f"e{i:04d}", task=g) for i, g in enumerate(games)]

    source = None
    if cfg.policy == "model":
        model_dir, source = resolve_model(cfg)
        check_model_sees(env, model_dir, "--from" if cfg.from_run else "--model")
    elif cfg.model or cfg.from_run:
        raise UserError(f"--policy {cfg.policy} plays without a model; drop --model/--from")

    settings = settings_from(cfg)
    with open_run("eval", cfg) as run:
        if cfg.policy == "model":
            chain_model(run, model_dir, source[1:] if source is not None else None)
        engine = None
        if cfg.policy == "model":
            engine, meta = load_policy_engine(cfg, model_dir)
            policy = ModelPolicy(engine, settings, cfg.gen_batch)
            desc = f"{model_dir} ({cfg.engine}, T={cfg.temperature})"
        else:
            meta = {"engine": "none", "model_id": cfg.policy, "model_hash": "", "policy": cfg.policy}
            policy = ExpertPolicy(env) if cfg.policy == "expert" else RandomPolicy(cfg.seed, env)
            desc = f"{cfg.policy} policy"
        t0 = time.time()
        try:
            episodes, _ = play_to_file(
                f"eval {cfg.split}",
                specs,
                policy,
                cfg,
                meta,
                run.file("episodes.jsonl"),
                expert=cfg.policy == "expert",
                env=env,
            )
        finally:
            if engine is not None:
                engine.close()

        results = summarize_episodes(
            episodes,
            split=split,
            partial=partial,
            expected_games=expected,
            wall_time_s=round((run.manifest.wall_time_s or 0.0) + time.time() - t0, 2),
            env=env.name,
        )
        results["model"] = desc
        results["setup"] = env_setup(env, cfg)
        write_eval_outputs(run.path, results, run_id=run.id, title=f"{env.title} {split}")
        metrics = headline_metrics(env, results)
        metrics["wins"] = sum(e.won for e in episodes)
        metrics["games"] = len(episodes)
        metrics["by_type"] = {t: f"{v['wins']}/{v['games']}" for t, v in results["categories"].items() if v["games"]}
        metrics["images"] = check_images(run.path, episodes)
        outputs = {
            "episodes.jsonl": len(episodes),
            "results.json": None,
            "report.md": None,
            "success_by_type.png": None,
        }
        return run.complete({**outputs, **image_outputs(run.path)}, metrics)
