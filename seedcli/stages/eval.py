"""`seed eval`: play every game of valid_seen (140) or valid_unseen (134) once, with the ordinary agent prompt only
(never a skill), and report success per task type and its macro-average — the paper's headline number.

One GPU:
    seed eval --split unseen --from runs/rl/<id> --engine vllm
Check the harness (must be 134/134 and 140/140) and get the floor:
    seed eval --split unseen --policy expert
    seed eval --split seen --policy random
Quick partial look on CPU (marked partial everywhere):
    seed eval --split seen --model /tmp/m --limit 12
"""

from __future__ import annotations

import time
from pathlib import Path

from seedcli.artifacts import Manifest, open_run, read_manifest, verify_run
from seedcli.config import EvalConfig
from seedcli.envs.alfworld import list_games, resolve_data_root, resolve_split, select_games
from seedcli.errors import UserError
from seedcli.rollout import EpisodeSpec, ExpertPolicy, ModelPolicy, RandomPolicy
from seedcli.stages.collect import check_model_dir, load_policy_engine, play_to_file, settings_from


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
        manifest = verify_run(run_dir, ("sft", "rl")) if ckpt is None else read_manifest(run_dir)
        if manifest.stage not in ("sft", "rl"):
            raise UserError(f"--from {path}: a {manifest.stage} run; eval takes an sft or rl run (or --model DIR)")
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
        return model, (manifest.stage, run_dir, manifest)
    return check_model_dir(cfg.model), None


def run(cfg: EvalConfig) -> Manifest:
    from seedcli.reporting import summarize_episodes, write_eval_outputs

    root = resolve_data_root(cfg.data_root)
    split = resolve_split(cfg.split)
    if split == "train":
        raise UserError("seed eval --split train: evaluation uses seen (valid_seen) or unseen (valid_unseen)")
    games = list_games(root, split)
    expected = len(games)
    partial = cfg.limit is not None and cfg.limit < expected
    if partial:
        games = select_games(games, cfg.limit, cfg.seed)  # type-balanced, so a partial result covers every type
    specs = [EpisodeSpec(episode_id=f"e{i:04d}", group_id=f"e{i:04d}", game=g) for i, g in enumerate(games)]

    source = None
    if cfg.policy == "model":
        model_dir, source = resolve_model(cfg)
    elif cfg.model or cfg.from_run:
        raise UserError(f"--policy {cfg.policy} plays without a model; drop --model/--from")

    settings = settings_from(cfg)
    with open_run("eval", cfg) as run:
        if source is not None:
            run.add_input(source[0], source[1], source[2])
        engine = None
        if cfg.policy == "model":
            engine, meta = load_policy_engine(cfg, model_dir)
            policy = ModelPolicy(engine, settings, cfg.gen_batch)
            desc = f"{model_dir} ({cfg.engine}, T={cfg.temperature})"
        else:
            meta = {"engine": "none", "model_id": cfg.policy, "model_hash": "", "policy": cfg.policy}
            policy = ExpertPolicy() if cfg.policy == "expert" else RandomPolicy(cfg.seed)
            desc = f"{cfg.policy} policy"
        t0 = time.time()
        try:
            episodes, _ = play_to_file(
                f"eval {cfg.split}", specs, policy, cfg, meta, run.file("episodes.jsonl"), expert=cfg.policy == "expert"
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
        )
        results["model"] = desc
        write_eval_outputs(run.path, results, run_id=run.id, title=f"ALFWorld {split}")
        metrics = {
            k: results[k]
            for k in ("macro_success", "micro_success", "mean_episode_length", "invalid_action_rate", "partial")
            if k in results
        }
        metrics["wins"] = sum(e.won for e in episodes)
        metrics["games"] = len(episodes)
        metrics["by_type"] = {t: f"{v['wins']}/{v['games']}" for t, v in results["task_types"].items() if v["games"]}
        return run.complete(
            {"episodes.jsonl": len(episodes), "results.json": None, "report.md": None, "success_by_type.png": None},
            metrics,
        )
