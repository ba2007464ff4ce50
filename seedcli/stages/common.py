"""What the stages that play an environment share (collect, eval, rl): the model directory and whether it can see
the environment's observations, the environment and rollout settings a config names, the policy's engine, and
playing episodes into a resumable trajectories file."""

from __future__ import annotations

import time
from pathlib import Path

from seedcli.artifacts import Manifest, Run
from seedcli.config import RolloutConfig
from seedcli.engines import load_engine
from seedcli.engines.base import check_model_dir, is_vision_model  # noqa: F401 - the stages take check_model_dir here
from seedcli.engines.tiny import model_hash
from seedcli.envs import TextEnv, entry, get_env
from seedcli.envs.base import Environment
from seedcli.envs.pool import EnvPool
from seedcli.errors import UserError
from seedcli.hub import hub_fields, hub_origin
from seedcli.images import IMAGES_DIR, run_images
from seedcli.progress import StageProgress
from seedcli.records import JsonlWriter, Trajectory, iter_jsonl, repair_tail, write_jsonl
from seedcli.rollout import EpisodeSpec, RolloutSettings, play_episodes


def chain_model(run: Run, model_dir: Path, source: tuple[Path, Manifest] | None) -> None:
    """Record in `run`'s manifest the model it plays or trains from: the run it came from as an input (`source`,
    verified by `artifacts.model_run` or `--from`), and, where that run's manifest does not vouch for these very files
    (a model directory outside any run, a checkpoint of a run still going), the weights' sha256 as `inputs/model_hash`
    beside `inputs/model`, and for a Hub model its repository and resolved commit (`inputs/model_repo`,
    `inputs/model_commit`). A resumed run refuses a model whose weights changed since it started."""
    if source is not None:
        run.add_input(source[1].stage, source[0], source[1])
        if _vouched(model_dir, *source):
            return
    digest = model_hash(model_dir)
    before = run.manifest.metrics.get("inputs/model_hash")
    if before is not None and before != digest:
        was, origin = run.manifest.metrics.get("inputs/model_commit"), hub_origin(model_dir)
        moved = (
            f" ({origin[0]} now resolves to commit {origin[1][:12]}, the run started from {was[:12]})"
            if (was and origin)
            else ""
        )
        raise UserError(
            f"{model_dir}: the model's weights changed since this run started (sha256 {digest[:12]}, the run "
            f"recorded {before[:12]}){moved}; restore that model, or start a new run without --resume"
        )
    run.manifest.metrics.update(
        {"inputs/model": str(model_dir.absolute()), "inputs/model_hash": digest, **hub_fields(model_dir)}
    )
    run.save()


def _vouched(model_dir: Path, run_dir: Path, manifest: Manifest) -> bool:
    """Whether a complete run's manifest lists the files of `model_dir` among its outputs (its model/, its last
    checkpoint), so that verifying the run verified the model."""
    try:
        rel = Path(model_dir).resolve().relative_to(Path(run_dir).resolve()).as_posix()
    except ValueError:
        return False
    return manifest.status == "complete" and any(o.path.startswith(f"{rel}/") for o in manifest.outputs)


def check_model_sees(env: Environment, model_dir: Path, flag: str = "--model") -> None:
    """Refuse, in one line, a text-only model on an environment that shows images: it would play blind (the prompt's
    image placeholder is all it reads) and the run would still end complete."""

    if env.frame_size() is not None and not is_vision_model(model_dir):
        raise UserError(
            f"{flag} {model_dir}: a text-only model (no vision tower) cannot see {env.title}'s image observations "
            "(env_options observation: image) and would play blind; use a vision-language model (e.g. `seed model "
            "init --preset tiny-vl --out DIR`) or text observations (--env-options '{observation: text}')"
        )


def make_env(cfg: RolloutConfig) -> Environment:
    """The environment a rollout config names, with its data root and options. A plug-in (`--env module:Class`, an
    entry point) plays one step of the config's split first (`TextEnv.check_plays`), so a class that breaks the
    protocol is one line before any model loads."""
    env = get_env(cfg.env, data_root=cfg.data_root, **cfg.env_options)
    if isinstance(env, TextEnv) and not entry(cfg.env).origin.startswith("built in"):
        env.check_plays(env.resolve_split(getattr(cfg, "split", None) or env.train_split))
    return env


def settings_from(cfg: RolloutConfig) -> RolloutSettings:
    return RolloutSettings(
        max_steps=cfg.max_steps,
        history=cfg.history,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
        rollout="lockstep" if cfg.deterministic else cfg.rollout,  # a fixed batch make-up (bf16: the same sums)
    )


def load_policy_engine(cfg: RolloutConfig, model_dir: Path):
    """Engine + the metadata every trajectory records about the model."""

    extra = {"prefix_cache_mb": cfg.prefix_cache_mb, "max_batch": cfg.hf_batch} if cfg.engine == "hf" else {}
    engine = load_engine(cfg.engine, model_dir, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed, **extra)
    meta = {"engine": cfg.engine, "model_id": str(model_dir), "model_hash": model_hash(model_dir), "policy": "model"}
    return engine, meta


def read_done(path: Path) -> dict[str, Trajectory]:
    """Episodes already on disk (a resumed run keeps them). A half-written last line (a crash, a full disk) is
    dropped, and duplicate episodes (which no normal run writes) collapse to the first copy, rewriting the file."""
    if not path.exists():
        return {}
    repair_tail(path, Trajectory)
    done: dict[str, Trajectory] = {}
    lines = 0
    for t in iter_jsonl(path, Trajectory):
        lines += 1
        done.setdefault(t.episode_id, t)
    if lines != len(done):
        write_jsonl(path, done.values())
    return done


def play_to_file(
    label: str,
    specs: list[EpisodeSpec],
    policy,
    cfg: RolloutConfig,
    meta: dict,
    out: Path,
    expert: bool = False,
    env: Environment | None = None,
) -> tuple[list[Trajectory], int]:
    """Play the episodes of `specs` not yet in `out`, appending each to it as it finishes (so a killed run resumes
    where it stopped). Returns every episode in the order it finished (those already on disk first) and how
    many were already on disk. Shared by collect and eval. A record on disk from another environment or task is
    refused (the file belongs to another run)."""
    env = env or make_env(cfg)
    done = read_done(out)
    wanted = {s.episode_id: s.task.task_id for s in specs}
    for ep in done.values():
        if ep.env != env.name or wanted.get(ep.episode_id, ep.task_id) != ep.task_id:
            raise UserError(
                f"{out}: episode {ep.episode_id} is {ep.env} task {ep.task_id}, not what this run plays "
                f"({env.name}); resume it with the config it was made with, or start a new run"
            )
    todo = [s for s in specs if s.episode_id not in done]
    episodes = [done[s.episode_id] for s in specs if s.episode_id in done]
    settings = settings_from(cfg)
    t0 = time.time()
    wins = sum(e.won for e in episodes)
    steps = 0
    with (
        EnvPool(env, cfg.workers, expert=expert) as pool,
        JsonlWriter(out) as writer,
        StageProgress(label, len(specs)) as progress,
    ):
        progress.advance(len(episodes))

        def on_done(traj: Trajectory) -> None:
            nonlocal wins, steps
            writer.write(traj)
            episodes.append(traj)
            wins += traj.won
            steps += traj.length
            progress.advance(1, success=wins / len(episodes), steps_per_s=steps / max(time.time() - t0, 1e-9))

        images = run_images(out.parent)
        play_episodes(todo, policy, pool, settings, meta, on_done, cfg.gen_batch, images=images)
    return episodes, len(done)


def image_outputs(run_dir: Path) -> dict[str, None]:
    """The `images/` folder as a manifest output when the run stored observation images (visual environments)."""
    return {IMAGES_DIR: None} if (run_dir / IMAGES_DIR).is_dir() else {}
