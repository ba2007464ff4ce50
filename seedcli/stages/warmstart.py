"""`seed warmstart`: behaviour-clone an environment's expert into a model, so that on CPU some games are won and
GRPO / SEED get non-zero rewards to learn from (a random tiny model wins nothing). A stage like the others: a
`WarmStartConfig`, a run directory runs/warmstart/<id>/ whose manifest chains the base model, the environment and
the expert's games, and a `model/` that collect, sft, rl and eval take as `--model` (rl and eval also as `--from`).

The tiny agent on ALFWorld, trained in place (the short form: `seed model init` builds the preset, then this stage's
`warm_start` trains it where it lies, with no run directory):
    seed model init --preset tiny --out runs/models/agent --warm-start expert --tasks 240 --epochs 3
The same as a run (a tiny base is rebuilt with the warm-start shape, `--shape agent`):
    seed warmstart --model runs/models/base --shape agent --tasks 240 --epochs 3
A pretrained model (its own shape, a small lr, no loss on the prompt tokens) on Sokoban, from a config's section:
    seed warmstart -c method_check_tiny --model models/smollm2 --env sokoban lr=5e-5 prompt_weight=0
The warm start trains in this process, on one GPU when one is visible (`device`: auto | cpu | cuda), or with
`nproc=N` on N data-parallel CPU processes under torchrun, started by the launcher sft and rl use
(`stages/warmstart_train.py`). The demonstrations are played by `--workers` environment processes.

The demonstrator (`seedcli/stages/demos.py`) is the environment's expert playing from the first step; ALFWorld's is
its hand-coded searching expert (EnvPool(expert="search")): it does not know where anything is and searches the
receptacles where the object class can be, so its choices depend only on what the agent sees. (A clone of the stored
walkthroughs walks to where the object was in its own game: it won 37.5% of its training episodes and 0 of 140 seen
games.) With probability `noise` a turn executes a random admissible action instead (DART-style noise injection);
every turn is labelled with the expert's action *at that state*, so the clone also sees how to recover from states
the expert alone never visits. Sokoban's is the shortest plan by breadth-first search; every environment's plays
its training tasks through the generic EnvPool.

Two kinds of examples, both rendered exactly as the rollout engines render them:
- acting: the agent prompt collect would show for that state → `format_response(<short template think>, <label>)`,
  from the episodes the expert won;
- skill writing: the analysis prompt of each demonstration episode (the prompt `--analyzer self` renders in rl,
  `analysis_max_chars` as there) → the `rules` analyzer's JSON for it, so the policy can write a parseable skill
  about its own episodes (SEED's self-analyzer) before Stage 1's SFT; `skill_writing=False` leaves them out (a run
  whose skills come from `--analyzer rules` needs none).

The model is trained with next-token NLL on the response tokens (+ <|im_end|>) plus a down-weighted NLL on the prompt
tokens (a model from random weights has to learn the game's language before it can copy an admissible action out of
the prompt), in length-grouped batches packed and padded by `rl/batching.py`, with a linear warm-up and a cosine
decay of the lr; then saved in place (Hugging Face format) with `warmstart.json` beside it: games, epochs, the loss
curve, greedy checks (acting and skill writing) and the wall time.

Outputs under runs/warmstart/<id>/:
    model/          the clone in Hugging Face format, with its tokenizer and warmstart.json
    games.jsonl     the expert's demonstration games: episode, task id, won, turns (in the order they were played)
    metrics.jsonl   one row per batch: step, epoch, train/response_nll, train/loss
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from seedcli.analyzers import analysis_messages
from seedcli.analyzers.parse import parse_skill
from seedcli.analyzers.policy import PolicyAnalyzer
from seedcli.artifacts import Manifest, model_run, open_run, sha256_file
from seedcli.config import WarmStartConfig
from seedcli.engines.base import check_device, pad_token_id
from seedcli.engines.hf import HFEngine
from seedcli.engines.tiny import QWEN_VOCAB_SIZE, build_tiny_model, model_hash
from seedcli.envs import get_env, tokenizer_texts
from seedcli.envs.base import Environment
from seedcli.errors import NonFiniteValue, UserError
from seedcli.hub import hub_fields
from seedcli.precision import compute_dtype_name
from seedcli.prompts import ANALYSIS_PROMPT_VERSION
from seedcli.records import visible_floats, write_jsonl
from seedcli.stages.common import check_model_dir
from seedcli.stages.demos import (
    DEMO_VERSION,
    DemoEpisode,
    analysis_example_texts,
    analysis_examples,
    demo_examples,
    env_demonstrations,
    env_or_alfworld,
    expert_demonstrations,
    log,
    usable,
)
from seedcli.stages.warmstart_train import train_clone, train_on_ranks

# The model shape `seed model init --preset tiny --warm-start expert` trains (`--shape agent`; Qwen2Config fields
# for build_tiny_model): 1.3M parameters with the ALFWorld BPE. On two shared CPU cores (one thread each: two threads
# ran 4x slower under contention) it trains at ~4k tokens/s, so 120 games × 8 epochs of ~620-token prompts take
# ~15 min and an RL update stays at minutes. Four layers: copying an action out of the prompt needs an induction
# circuit (two layers at least) on top of reading the observation. head_dim stays 32 for vLLM's CPU attention.
AGENT_SHAPE: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}

WARMSTART_FILE = "warmstart.json"
MODEL_DIR = "model"


# --------------------------------------------------------------------------------------------- the stage


def run(cfg: WarmStartConfig) -> Manifest:
    """Copy the base model into runs/warmstart/<id>/model/ and clone the expert into it there (`warm_start`); the
    manifest chains the base model (and the run it came from), the environment and the expert's games. `--resume`
    starts the clone over from the base: the warm start keeps no checkpoints (same inputs, same weights)."""
    base = check_model_dir(cfg.model)
    source = model_run(base)
    base_hash = model_hash(base)
    with open_run("warmstart", cfg) as run:
        if source is not None:
            run.add_input(source[1].stage, *source)
        model_dir = run.file(MODEL_DIR)
        if model_dir.exists():
            shutil.rmtree(model_dir)
        shutil.copytree(base, model_dir)
        try:
            record, demos = clone(model_dir, cfg)
        except NonFiniteValue as exc:  # the run ends failed with the loss curve up to the step that failed ...
            write_jsonl(run.file("metrics.jsonl"), [visible_floats(r) for r in _metric_rows(exc.rows)])
            shutil.rmtree(model_dir)  # ... and no model that `--model` could take
            raise
        games = [
            {"episode_id": d.trajectory.episode_id, "task_id": d.trajectory.task_id, "won": d.trajectory.won,
             "turns": len(d.trajectory.turns)}
            for d in demos
        ]  # fmt: skip
        n_games = write_jsonl(run.file("games.jsonl"), games)
        n_rows = write_jsonl(run.file("metrics.jsonl"), _metric_rows(record["curve"]))
        metrics = {
            "env": record["env"],
            "inputs/base_model": str(base),
            "inputs/base_model_hash": base_hash,
            **hub_fields(base, "inputs/base_model"),  # a Hub model: its repository and resolved commit
            "inputs/demos": record["demos_cache"],
            "inputs/demos_sha256": sha256_file(Path(record["demos_cache"])),
            **_summary(record),
            "model_hash": model_hash(model_dir),
        }
        return run.complete({MODEL_DIR: None, "games.jsonl": n_games, "metrics.jsonl": n_rows}, metrics)


def _metric_rows(curve: list[dict]) -> list[dict]:
    """metrics.jsonl's rows of a loss curve (one per batch)."""
    return [
        {"step": c["step"], "epoch": c["epoch"], "train/response_nll": c["response_nll"], "train/loss": c["loss"]}
        for c in curve
    ]


def _summary(record: dict) -> dict[str, Any]:
    """The manifest's metrics from a warmstart.json record (the whole record stays in model/warmstart.json)."""
    check, skills = record["check"], record["skill_check"]
    return {
        "data/games": record["games"],
        "data/games_won_by_expert": record["games_won_by_expert"],
        "data/acting_turns": record["turns"],
        "data/skill_examples": record["skill_examples"],
        "data/response_tokens": record["response_tokens"],
        "train/epochs": record["epochs"],
        "train/first_response_nll": record["first_response_nll"],
        "train/last_response_nll": record["last_response_nll"],
        "train/epoch_response_nll": record["epoch_response_nll"],
        "check/valid_rate": check["valid_rate"],
        "check/admissible_rate": check["admissible_rate"],
        "check/expert_action_rate": check["expert_action_rate"],
        "check/skills_kept": skills["kept"],
        "check/skill_episodes": skills["episodes"],
        "parameters": record["parameters"],
        "rebuilt_with_agent_shape": record["rebuilt_with_agent_shape"],
        "compute_dtype": record["compute_dtype"],
        "timing_s/demos": record["demos_s"],
        "timing_s/train": record["train_s"],
        "timing_s/warmstart": record["wall_time_s"],
    }


# --------------------------------------------------------------------------------------------- the clone


def warm_start(model_dir: str | os.PathLike, cfg: WarmStartConfig) -> dict:
    """Behaviour-clone the expert into the model at `model_dir` (trained in place) as `cfg` says and write
    warmstart.json beside it; returns that record. `seed model init --warm-start expert` calls this on the model it
    builds beside --out (renamed into place once trained: `artifacts/staging.py`)."""
    return clone(Path(model_dir), cfg)[0]


def clone(model_dir: Path, cfg: WarmStartConfig) -> tuple[dict, list[DemoEpisode]]:
    """(the warmstart.json record, the demonstrations) of cloning the expert into `model_dir` in place: with
    `cfg.shape` agent a model of another shape is first rebuilt there with AGENT_SHAPE (same tokenizer preset and
    seed). `cfg.dtype` (auto: bf16 on a CPU with bf16 instructions) is the compute dtype: fp32 master weights and
    AdamW state, bf16 matmuls under autocast."""
    torch.set_num_threads(cfg.threads or int(os.environ.get("OMP_NUM_THREADS", "1")))
    device = _device(cfg)  # before the expert plays: a GPU that is not there is one line at once
    t_start = time.time()
    rebuilt = _ensure_shape(model_dir, AGENT_SHAPE if cfg.shape == "agent" else None, cfg.seed)
    environment = get_env(cfg.env, data_root=cfg.data_root) if cfg.data_root is not None else get_env(cfg.env)
    demos, cache_path, max_steps, history = play_demonstrations(cfg, environment)
    # the last few episodes are held out of skill writing, to check it on prompts the model has not seen
    check_skills = cfg.check_skills if cfg.skill_writing else 0
    held_out = demos[-check_skills:] if check_skills else []
    skill_pairs = (
        analysis_example_texts(demos[: len(demos) - len(held_out)], cfg.analysis_max_chars, environment)
        if cfg.skill_writing
        else []
    )
    t_demos = time.time() - t_start
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    acting = demo_examples(demos, tokenizer, environment)
    writing = analysis_examples(skill_pairs, tokenizer)
    if not acting:
        raise UserError(f"the expert won none of the {len(demos)} demonstration games; nothing to clone")
    examples = acting + writing
    _log_examples(demos, acting, writing, model)

    t_train = time.time()
    compute = compute_dtype_name(cfg.dtype, device)
    settings = {"lr": cfg.lr, "batch_tokens": cfg.batch_tokens, "prompt_weight": cfg.prompt_weight,
                "pad_id": pad_token_id(tokenizer), "dtype": compute}  # fmt: skip
    if cfg.nproc > 1:  # data-parallel ranks train the weights at model_dir in place
        curve = train_on_ranks(model_dir, examples, cfg.nproc, {**settings, "epochs": cfg.epochs, "seed": cfg.seed})
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    else:
        curve = train_clone(model, examples, cfg.epochs, cfg.seed, **settings)
    train_s = time.time() - t_train

    model.to("cpu").save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    checks = (cfg.check_turns, cfg.analysis_max_chars, cfg.seed, environment)
    check, skill_check = clone_checks(model_dir, demos, held_out, *checks, dtype=compute, device=device)
    record = {
        **_record(cfg, environment, demos, acting, writing, model, curve),
        "rebuilt_with_agent_shape": rebuilt,
        "compute_dtype": compute,
        "device": device,
        "max_steps": max_steps,
        "history": history,
        "demos_cache": str(cache_path),
        "check": check,
        "skill_check": skill_check,
        "demos_s": round(t_demos, 1),
        "train_s": round(train_s, 1),
        "wall_time_s": round(time.time() - t_start, 1),
        "threads": torch.get_num_threads(),
        "curve": curve,
    }
    (model_dir / WARMSTART_FILE).write_text(json.dumps(_in_order(record), indent=1))
    return record, demos


def play_demonstrations(cfg: WarmStartConfig, environment: Environment) -> tuple[list[DemoEpisode], Path, int, int]:
    """(the expert's demonstrations, their cache file, max_steps, history): ALFWorld's searching expert (40 turns,
    history 5 unless set), or the environment's own expert at its own limits."""
    alfworld = environment.name == "alfworld"
    max_steps = cfg.max_steps if cfg.max_steps is not None else (40 if alfworld else environment.max_steps)
    history = cfg.history if cfg.history is not None else (5 if alfworld else environment.history)
    play = {
        "noise": cfg.noise,
        "max_steps": max_steps,
        "history": history,
        "workers": cfg.workers,
        "cache_dir": cfg.cache_dir,
    }
    if alfworld:
        demos, path = expert_demonstrations(cfg.tasks, cfg.seed, data_root=cfg.data_root, **play)
    else:
        demos, path = env_demonstrations(environment, cfg.tasks, cfg.seed, **play)
    return demos, path, max_steps, history


def _log_examples(demos: list[DemoEpisode], acting: list, writing: list, model) -> None:
    lengths = [len(p) + len(r) for p, r in acting + writing]
    won = sum(d.trajectory.won for d in demos)
    log(
        f"{len(demos)} expert episodes ({won} won), {len(acting)} acting turns (prompt tokens mean "
        f"{sum(len(p) for p, _ in acting) / len(acting):.0f}), {len(writing)} skill-writing examples (prompt tokens "
        f"mean {sum(len(p) for p, _ in writing) / max(len(writing), 1):.0f}), longest {max(lengths)}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters"
    )


# the order of warmstart.json's keys (as before the warm start became a stage: the file reads the same)
_RECORD_KEYS = (
    "method", "env", "demonstrator", "games", "games_won_by_expert", "noise", "epochs", "seed", "turns",
    "skill_examples", "analysis_prompt_version", "analysis_max_chars", "response_tokens", "prompt_tokens_mean",
    "prompt_tokens_max", "analysis_prompt_tokens_mean", "parameters", "shape", "rebuilt_with_agent_shape", "lr",
    "batch_tokens", "compute_dtype", "master_dtype", "prompt_weight", "max_steps", "history", "demos_cache",
    "epoch_response_nll", "first_response_nll", "last_response_nll", "check", "skill_check", "demos_s", "train_s",
    "wall_time_s", "threads", "curve",
)  # fmt: skip


def _in_order(record: dict) -> dict:
    return {k: record[k] for k in _RECORD_KEYS if k in record} | record


def _record(cfg: WarmStartConfig, environment: Environment, demos, acting, writing, model, curve) -> dict:
    """What warmstart.json says about the data, the model and the loss curve."""
    alfworld = environment.name == "alfworld"
    epoch_nll = []
    for e in range(1, cfg.epochs + 1):
        rows = [c["response_nll"] for c in curve if c["epoch"] == e]
        epoch_nll.append(sum(rows) / len(rows))
    shape_keys = (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "vocab_size",
    )  # fmt: skip
    return {
        "method": (
            "behaviour cloning of ALFWorld's searching hand-coded expert"
            if alfworld
            else f"behaviour cloning of the {environment.title} expert"
        )
        + " with noise injection (agent prompt format)"
        + (" + skill writing (analysis prompt -> rules analyzer JSON)" if cfg.skill_writing else ""),
        "env": cfg.env,
        "demonstrator": DEMO_VERSION,
        "games": len(demos),
        "games_won_by_expert": sum(d.trajectory.won for d in demos),
        "noise": cfg.noise,
        "epochs": cfg.epochs,
        "seed": cfg.seed,
        "turns": len(acting),
        "skill_examples": len(writing),
        "analysis_prompt_version": ANALYSIS_PROMPT_VERSION,
        "analysis_max_chars": cfg.analysis_max_chars,
        "response_tokens": sum(len(r) for _, r in acting + writing),
        "prompt_tokens_mean": sum(len(p) for p, _ in acting) / len(acting),
        "prompt_tokens_max": max(len(p) for p, _ in acting),
        "analysis_prompt_tokens_mean": sum(len(p) for p, _ in writing) / max(len(writing), 1),
        "parameters": sum(p.numel() for p in model.parameters()),
        "shape": {k: getattr(model.config, k) for k in shape_keys},
        "lr": cfg.lr,
        "batch_tokens": cfg.batch_tokens,
        "master_dtype": "float32",
        "prompt_weight": cfg.prompt_weight,
        "epoch_response_nll": epoch_nll,
        "first_response_nll": curve[0]["response_nll"],
        "last_response_nll": sum(c["response_nll"] for c in curve[-20:]) / len(curve[-20:]),
    }


def _ensure_shape(model_dir: Path, shape: dict[str, Any] | None, seed: int) -> bool:
    """Rebuild the model at `model_dir` with `shape` when its config differs (the tokenizer preset is kept)."""
    if not shape:
        return False
    config = json.loads((model_dir / "config.json").read_text())
    if all(config.get(k) == v for k, v in shape.items()):
        return False
    preset = "tiny-qwen" if config.get("vocab_size") == QWEN_VOCAB_SIZE else "tiny"
    log(f"rebuilding {model_dir} with the warm-start shape {shape} (preset {preset}, seed {seed})")
    corpus = tokenizer_texts() if preset == "tiny" else None
    build_tiny_model(model_dir, preset=preset, seed=seed, corpus=corpus, **shape)
    return True


# --------------------------------------------------------------------------------------------- training


# --------------------------------------------------------------------------------------------- checks


def _device(cfg: WarmStartConfig) -> str:
    """Where the clone trains: `device` as `check_device` accepts it, auto being one GPU when torch sees one, else
    the CPU; the data-parallel ranks (`nproc`) are CPU processes."""
    check_device(cfg.device)
    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device != "cpu" and cfg.nproc > 1:
        raise UserError(f"nproc {cfg.nproc} trains on CPU ranks; with a GPU use nproc 1 (or device cpu)")
    return device


def clone_checks(
    model_dir: Path,
    demos: list[DemoEpisode],
    held_out: list[DemoEpisode],
    turns: int,
    max_chars: int,
    seed: int,
    env=None,
    dtype: str | None = None,
    device: str = "cpu",
) -> tuple[dict, dict]:
    """(greedy acting check, skill-writing check on the held-out episodes; empty without any) of the saved clone,
    loaded through the hf engine as collect, rl and eval will load it. `env`: another environment than ALFWorld."""
    engine = HFEngine(model_dir, device=device, dtype=dtype, seed=seed)
    try:
        check = greedy_check(engine, demos, turns, seed, env)
        log(
            f"greedy check on {check['turns']} demonstration turns: valid {check['valid_rate']:.0%}, admissible "
            f"{check['admissible_rate']:.0%}, expert action {check['expert_action_rate']:.0%}"
        )
        if not held_out:
            return check, {"episodes": 0, "kept": 0, "examples": []}
        skill_check = skill_writing_check(engine, held_out, max_chars, env=env)
        log(
            f"skill check on {skill_check['episodes']} held-out episodes: parseable skill "
            f"{skill_check['kept']}/{skill_check['episodes']}"
        )
    finally:
        engine.close()
    return check, skill_check


def greedy_check(engine, demos: list[DemoEpisode], turns: int, seed: int, env=None) -> dict:
    """Greedy response (through an Engine) on `turns` sampled demonstration prompts: how often it is well-formed,
    admissible and the expert's own action at that state (teacher-forced history: the states the demonstrations
    visited)."""
    parse_action = env_or_alfworld(env).parse_action

    pool = [
        (t, label)
        for d in demos
        if d.trajectory.won
        for t, label in zip(d.trajectory.turns, d.labels, strict=False)
        if usable(label, t)
    ]
    picked = random.Random(seed + 1).sample(pool, min(turns, len(pool)))
    prompts = [engine.render([{"role": "user", "content": turn.prompt}]) for turn, _ in picked]
    completions = engine.generate(prompts, temperature=0.0, max_new_tokens=96, seed=seed) if prompts else []
    valid = admissible = expert = 0
    examples = []
    for (turn, label), completion in zip(picked, completions, strict=True):
        action, ok = parse_action(completion.text)
        valid += ok
        admissible += ok and (not turn.admissible or action in turn.admissible)  # free text (search): any
        expert += ok and action == label
        if len(examples) < 3:
            examples.append({"expert": label, "model": completion.text})
    n = max(len(picked), 1)
    return {
        "turns": len(picked),
        "valid_rate": valid / n,
        "admissible_rate": admissible / n,
        "expert_action_rate": expert / n,
        "examples": examples,
    }


def skill_writing_check(engine, demos: list[DemoEpisode], max_chars: int, max_new_tokens: int = 256, env=None) -> dict:
    """Greedy skill JSON for held-out demonstration episodes, asked through rl's self-analyzer (PolicyAnalyzer, one
    attempt) and judged by its parser."""
    analyzer = PolicyAnalyzer(engine, max_new_tokens=max_new_tokens)
    pairs = analysis_example_texts(demos, max_chars, env)
    responses = analyzer.analyze_batch([analysis_messages(prompt) for prompt, _ in pairs])
    kept, examples = 0, []
    for response in responses:
        parsed = parse_skill(response.text)
        kept += parsed.kept
        if len(examples) < 2:
            examples.append({"model": response.text, "kept": parsed.kept, "skill": parsed.skill})
    return {"episodes": len(demos), "kept": kept, "examples": examples}
