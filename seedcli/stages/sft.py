"""`seed sft`: hindsight-skill SFT (docs/design.md §1, Stage 1 step 3) — the policy learns to write the skill JSON from the
analysis prompt, with the loss on the JSON only. TRL's SFTTrainer does the training; PEFT the optional LoRA.

CPU smoke run on the tiny pipeline (base model = the collect run's policy):
    seed sft --config tiny
One GPU, the paper's settings (3 epochs, lr 5e-6, max length 8192, 10% held out):
    seed sft --config paper_qwen25_3b --from runs/annotate/<id> --model Qwen2.5-3B-Instruct/ --gpus 1
Eight GPUs (data-parallel; the same command launches `torchrun --nproc-per-node 8` itself):
    seed sft --config paper_qwen25_3b --from runs/annotate/<id> --model Qwen2.5-3B-Instruct/ --gpus 8
LoRA instead of all weights (the adapter is merged into model/ on export):
    seed sft --config paper_qwen25_3b --lora --lora-r 16 --lora-alpha 32
Look at what is trained before training (prompt dim, loss tokens highlighted):
    seed sft --config tiny --show-samples 2
After a crash or Ctrl-C, continue from the last checkpoint with the same data order:
    seed sft --config tiny --resume

How it runs: this process resolves the inputs, builds the examples (sftdata.py) and writes them to data/, then trains —
in-process on CPU or one GPU; with `--gpus N > 1` it starts `python -m torch.distributed.run --nproc-per-node N -m
seedcli.stages.sft_train --worker RUN_DIR`, whose ranks read the same data/ and train with DDP (accelerate), rank 0 writing
metrics.jsonl, checkpoints and model/. Only this process writes the manifest, after the training has finished.

Outputs under runs/sft/<id>/:
    model/            the fine-tuned policy in Hugging Face format, with the tokenizer and chat template (LoRA merged)
    adapter/          the LoRA adapter alone (with --lora)
    metrics.jsonl     step, train/loss, train/lr, train/grad_norm, perf/tokens_per_s; val/loss at step 0, every epoch
                      and the end
    data/             train.jsonl, val.jsonl: the token ids trained on (episode id, prompt length, steps cut)
    checkpoints/      checkpoint-N (weights, optimizer, scheduler, RNG) for --resume; not hashed in the manifest
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from seedcli.artifacts import (
    Manifest,
    atomic_write_text,
    model_run,
    open_run,
    read_manifest,
    resolve_input,
    saved_path,
    verify_run,
)
from seedcli.config import SFTConfig
from seedcli.engines.base import check_gpus, is_vision_model
from seedcli.engines.tiny import model_hash
from seedcli.engines.vision import expand_image_tokens, load_image_processor, vision_inputs
from seedcli.errors import UserError
from seedcli.hub import hub_fields, hub_origin, resolve_model
from seedcli.images import ImageStore, run_images
from seedcli.records import SkillRecord, Trajectory, iter_jsonl, read_jsonl, write_jsonl
from seedcli.sftdata import DataStats, Example, Expand, build_examples, kept_records, split_by_episode
from seedcli.stages.sft_train import (
    _launch,
    _load_tokenizer,
    train,
)

# ------------------------------------------------------------------------------------------------------ inputs


def _collect_run(annotate_manifest: Manifest, annotate_dir: Path, runs_dir: str) -> Path | None:
    """The collect run the annotate run read, when it is still on disk: at its recorded path, or under the runs root
    (this run's, or the annotate run's own after the runs tree moved)."""
    for ref in annotate_manifest.inputs:
        if ref.stage != "collect":
            continue
        for root in (runs_dir, Path(annotate_dir).absolute().parent.parent):
            if (found := ref.locate(root)) is not None:
                return found
    return None


def _base_model(cfg: SFTConfig, annotate_dir: Path, collect_dir: Path | None) -> tuple[Path, str]:
    """--model, or the policy the collect run played with: (where it is now, the value for this run's config)."""
    model = cfg.model
    if not model:
        if collect_dir is None:
            raise UserError(
                f"no --model given and the collect run that annotate run {annotate_dir} read is not on disk; "
                "pass --model DIR (the base policy, Hugging Face format)"
            )
        collect_manifest = read_manifest(collect_dir)
        model = collect_manifest.config.get("model")
        if not model:
            raise UserError(f"no --model given and collect run {collect_dir} records no model; pass --model DIR")
        repo, commit = (collect_manifest.metrics.get(f"inputs/model_{k}") for k in ("repo", "commit"))
        if repo and commit:  # a Hub model: the very commit the collect run played
            recorded = f"{repo}@{commit}"
            path = resolve_model(recorded)
        else:
            recorded = str(Path(model))  # the config (and its hash) keep it as recorded, whatever the working dir
            # found as the collect run meant it: relative to the directory that run was started from
            path = saved_path(collect_dir, collect_manifest, model)
    else:
        recorded, path = str(Path(model)), resolve_model(model)  # a Hub id ORG/NAME[@REVISION]: its snapshot
        _same_policy(path, cfg.model, annotate_dir, collect_dir)
    if not (path / "config.json").exists():
        raise UserError(
            f"--model {path}: not a Hugging Face model directory (no config.json); "
            f"build a tiny one with `seed model init --preset tiny --out {path}`"
        )
    return path, recorded


def _same_policy(path: Path, given: str, annotate_dir: Path, collect_dir: Path | None) -> None:
    """An sft learns from the episodes of the policy it fine-tunes: a `--model` that is not the one the collect run
    played (as that run recorded it: a Hub repository, or a directory as it meant it) is one line naming both."""
    if collect_dir is None:
        return
    manifest = read_manifest(collect_dir)
    played = manifest.config.get("model")
    if not played:
        return  # (an expert-played collect run records no model)
    repo = manifest.metrics.get("inputs/model_repo")
    if repo:
        same = (hub_origin(path) or ("",))[0] == repo
    else:  # (a recorded directory no longer there cannot be told apart from a moved one: not refused)
        recorded = saved_path(collect_dir, manifest, played)
        same = not recorded.is_dir() or recorded.resolve() == path.resolve()
    if not same:
        raise UserError(
            f"--model {given}, but collect run {collect_dir} (which annotate run {annotate_dir} read) played "
            f"{repo or played}: sft fine-tunes the policy whose episodes it learns from; drop --model (that policy "
            f"is used), or collect with --model {given}"
        )


def _read_skills(annotate_dir: Path) -> list[SkillRecord]:
    path = annotate_dir / "skills.jsonl"
    if not path.exists():
        raise UserError(f"{annotate_dir}: no skills.jsonl; pass an annotate run with --from")
    records = kept_records(iter_jsonl(path, SkillRecord))
    if not records:
        raise UserError(
            f"annotate run {annotate_dir} kept 0 skills: nothing to train on; see its rejected.jsonl for the reasons "
            "and rerun annotate (another analyzer, or more trajectories)"
        )
    return records


def _trajectory_lookup(collect_dir: Path | None):
    """episode id → Trajectory, read from the collect run only when a prompt has to be shortened."""
    cache: dict[str, Trajectory] | None = None

    def lookup(episode_id: str) -> Trajectory | None:
        nonlocal cache
        if collect_dir is None:
            return None
        if cache is None:
            cache = {}
            for traj in iter_jsonl(collect_dir / "trajectories.jsonl", Trajectory):
                cache.setdefault(traj.episode_id, traj)
        return cache.get(episode_id)

    return lookup


def _effective_max_length(cfg: SFTConfig, base: Path) -> int:
    """--max-length, capped at the model's context (a longer sequence would index positions the model lacks)."""
    config = json.loads((base / "config.json").read_text())
    positions = config.get("max_position_embeddings") or config.get("text_config", {}).get("max_position_embeddings")
    if positions and cfg.max_length > positions:
        print(
            f"sft: --max-length {cfg.max_length} exceeds the model's {positions} positions; using {positions}",
            file=sys.stderr,
        )
        return int(positions)
    return cfg.max_length


def _image_expander(base: Path, collect_dir: Path | None) -> Expand:
    """For visual skill records: expands a prompt's image-pad tokens to its images' token counts under the base
    model's image processor (the images are read from the collect run, their sha256 checked)."""

    if not is_vision_model(base):
        raise UserError(
            f"--model {base}: the skills were written from images (a visual environment) but this model has no vision "
            "tower; fine-tune a vision-language model (e.g. `seed model init --preset tiny-vl`)"
        )
    if collect_dir is None:
        raise UserError(
            "the skills were written from images, which live in the collect run the annotate run read, and that run "
            "is not on disk; restore it (its images/ folder) and rerun"
        )
    processor = load_image_processor(base)
    image_token_id = int(json.loads((base / "config.json").read_text())["image_token_id"])
    store = run_images(collect_dir)
    counts: dict[str, int] = {}

    def expand(ids: list[int], shas: list[str]) -> list[int]:
        for sha in shas:
            if sha not in counts:
                counts[sha] = vision_inputs(processor, [[store.pixels(sha)]]).tokens[0][0]
        return expand_image_tokens(ids, image_token_id, [counts[sha] for sha in shas])

    return expand


def _build_data(
    cfg: SFTConfig,
    tokenizer: Any,
    records: list[SkillRecord],
    collect_dir: Path | None,
    max_length: int,
    limit: int | None = None,
    base: Path | None = None,
) -> tuple[list[Example], list[Example], DataStats]:
    """(train, validation) examples; with `limit`, only the first `limit` training records are encoded."""
    _, val_ids = split_by_episode([r.episode_id for r in records], cfg.val_fraction)
    if limit is not None:
        held_out = set(val_ids)
        records = [r for r in records if r.episode_id not in held_out][:limit]
    expand = _image_expander(base, collect_dir) if base is not None and any(r.images for r in records) else None
    examples, stats = build_examples(records, tokenizer, max_length, _trajectory_lookup(collect_dir), expand)
    if not examples:
        raise UserError(
            f"all {stats.records} examples are longer than --max-length {max_length} tokens even with every trajectory "
            "step dropped from the prompt; raise --max-length"
        )
    val_set = set(val_ids)
    train = [e for e in examples if e.episode_id not in val_set]
    val = [e for e in examples if e.episode_id in val_set]
    if not train:
        raise UserError(f"no training example left after holding out {len(val)} for validation; lower --val-fraction")
    return train, val, stats


# ------------------------------------------------------------------------------------------------- show samples


def show_samples(tokenizer: Any, examples: list[Example], n: int, console: Any = None) -> None:
    """Print `n` examples: the prompt dim, the tokens under the loss mask highlighted (alternating shades mark token
    boundaries) and, without colour, wrapped in ⟦ ⟧."""

    console = console or Console()
    plain = console.no_color or not console.is_terminal
    console.print("tokens under the loss mask are " + ("between ⟦ and ⟧" if plain else "highlighted"))
    for ex in examples[:n]:
        cut = f", {ex.cut_steps} oldest step(s) cut to fit" if ex.cut_steps else ""
        console.rule(f"{ex.episode_id}: {ex.prompt_len} prompt tokens, {ex.completion_len} loss tokens{cut}")
        text = Text(tokenizer.decode(ex.input_ids[: ex.prompt_len]), style="dim")
        if plain:
            text.append("⟦" + tokenizer.decode(ex.input_ids[ex.prompt_len :]) + "⟧")
        else:
            for i, token_id in enumerate(ex.input_ids[ex.prompt_len :]):
                text.append(
                    tokenizer.decode([token_id]), style="bold black on green" if i % 2 == 0 else "bold black on cyan"
                )
        console.print(text, soft_wrap=True, highlight=False, markup=False)


# ------------------------------------------------------------------------------------------------------ training


def _resolve_device(cfg: SFTConfig) -> tuple[str, int]:
    """(device, processes). `--gpus 0` is the CPU unless `--device cuda` asks for one GPU."""
    if cfg.device not in ("auto", "cpu", "cuda"):
        raise UserError(f"--device {cfg.device}: use auto, cpu or cuda")
    if cfg.device == "cpu" or (cfg.device == "auto" and cfg.gpus == 0):
        if cfg.gpus > 1:
            raise UserError(f"--gpus {cfg.gpus} with --device cpu: pick one (GPUs, or --gpus 0 for the CPU)")
        return "cpu", 1
    check_gpus(cfg.gpus, "use --gpus 0 to train on the CPU")
    return "cuda", max(cfg.gpus, 1)


# ------------------------------------------------------------------------------------------------------ summary


def _summary(run_dir: Path) -> dict[str, Any]:
    rows = read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    train_rows = [r for r in rows if "train/loss" in r]
    val_rows = [r for r in rows if "val/loss" in r]
    speeds = [r["perf/tokens_per_s"] for r in train_rows if r.get("perf/tokens_per_s")]
    out: dict[str, Any] = {
        "train/steps": max((r["step"] for r in rows), default=0),
        "train/loss_first": train_rows[0]["train/loss"] if train_rows else None,
        "train/loss_final": train_rows[-1]["train/loss"] if train_rows else None,
        "val/loss_before": next((r["val/loss"] for r in val_rows if r["step"] == 0), None),
        "val/loss_after": val_rows[-1]["val/loss"] if val_rows else None,
        "perf/tokens_per_s": round(sum(speeds) / len(speeds), 1) if speeds else None,
    }
    if out["val/loss_before"] is not None and out["val/loss_after"] is not None:
        out["val/loss_delta"] = out["val/loss_after"] - out["val/loss_before"]
    return out


# ---------------------------------------------------------------------------------------------------------- run


def run(cfg: SFTConfig) -> Manifest:
    """Fine-tune (see the module docstring); returns the completed manifest. With `show_samples`, print and exit."""
    annotate_dir, annotate_manifest = resolve_input("annotate", cfg.from_run, cfg.runs_dir)
    collect_dir = _collect_run(annotate_manifest, annotate_dir, cfg.runs_dir)
    if collect_dir is not None:  # its trajectories are read here: every byte as its manifest records, as annotate checks
        verify_run(collect_dir, "collect", runs_dir=cfg.runs_dir)
    base, model_value = _base_model(cfg, annotate_dir, collect_dir)
    max_length = _effective_max_length(cfg, base)
    cfg = cfg.model_copy(update={"from_run": str(annotate_dir), "model": model_value, "max_length": max_length})
    tokenizer = _load_tokenizer(base)
    records = _read_skills(annotate_dir)

    if cfg.show_samples:
        train_examples, _, _ = _build_data(
            cfg, tokenizer, records, collect_dir, max_length, limit=cfg.show_samples, base=base
        )
        show_samples(tokenizer, train_examples, cfg.show_samples)
        raise SystemExit(0)

    device, nproc = _resolve_device(cfg)

    # the base model: where it is, its weights' sha256, and a Hub model's repository and resolved commit
    base_fields = {"base_model": str(base), "base_model_hash": model_hash(base), **hub_fields(base, "base_model")}
    with open_run("sft", cfg) as run:
        run.add_input("annotate", annotate_dir, annotate_manifest)
        if collect_dir is not None:
            run.add_input("collect", collect_dir)
        base_run = model_run(base)  # a warm start's (or any run's) model/ as the base: chain that run
        if base_run is not None:
            run.add_input(base_run[1].stage, *base_run)
        data_dir = run.file("data")
        if (data_dir / "train.jsonl").exists() and (data_dir / "stats.json").exists():
            stats_metrics = json.loads((data_dir / "stats.json").read_text())  # resumed: the data as first built
            n_train = sum(1 for _ in iter_jsonl(data_dir / "train.jsonl"))
            n_val = sum(1 for _ in iter_jsonl(data_dir / "val.jsonl"))
        else:
            train_examples, val_examples, stats = _build_data(
                cfg, tokenizer, records, collect_dir, max_length, base=base
            )
            data_dir.mkdir(exist_ok=True)
            _copy_images(collect_dir, data_dir, train_examples + val_examples)
            write_jsonl(data_dir / "train.jsonl", (e.to_json() for e in train_examples))
            write_jsonl(data_dir / "val.jsonl", (e.to_json() for e in val_examples))
            stats_metrics = {**stats.as_metrics(), "data/dropped_ids": stats.dropped_ids[:50]}
            atomic_write_text(data_dir / "stats.json", json.dumps(stats_metrics, indent=2))
            n_train, n_val = len(train_examples), len(val_examples)
            if stats.truncated or stats.dropped_too_long:
                print(
                    f"sft: {stats.truncated} prompt(s) longer than --max-length {max_length} tokens were shortened from "
                    f"the left of the trajectory ({stats.cut_steps} step(s) dropped); {stats.dropped_too_long} left out "
                    "(too long even with every step dropped)",
                    file=sys.stderr,
                )
        steps_per_epoch = math.ceil(math.ceil(n_train / cfg.batch_size) / cfg.grad_accum) if n_train else 0
        run.manifest.metrics.update({**base_fields, "annotate_run": annotate_manifest.run_id})
        run.save()
        print(
            f"sft: {n_train} train / {n_val} val examples, ~{steps_per_epoch} step(s) per epoch, {cfg.epochs:g} epoch(s), "
            f"{'LoRA' if cfg.lora else 'full'} fine-tuning on {device}" + (f" × {nproc}" if nproc > 1 else ""),
            file=sys.stderr,
        )
        t0 = time.time()
        resumed_from = _last_checkpoint_step(run.path)
        if nproc > 1:
            _launch(run.path, cfg, base, device, nproc)
        else:
            train(run.path, cfg, base, device)
        metrics: dict[str, Any] = {
            **base_fields,
            "annotate_run": annotate_manifest.run_id,
            "collect_run": read_manifest(collect_dir).run_id if collect_dir is not None else None,
            **stats_metrics,
            "data/train_examples": n_train,
            "data/val_examples": n_val,
            "data/max_length": max_length,
            **_summary(run.path),
            "train/epochs": cfg.epochs,
            "train/resumed_from_step": resumed_from,
            "lora": cfg.lora,
            "model_hash": model_hash(run.file("model")),
            "processes": nproc,
            "device": device,
            "timing_s/sft": round(time.time() - t0, 2),
        }
        outputs: dict[str, int | None] = {
            "model": None,
            "metrics.jsonl": None,
            "data/train.jsonl": n_train,
            "data/val.jsonl": n_val,
        }
        if cfg.lora:
            outputs["adapter"] = None
        if (data_dir / "images").is_dir():  # a visual policy's training images, hashed like the rest
            outputs["data/images"] = None
        return run.complete(outputs, metrics)


def _copy_images(collect_dir: Path | None, data_dir: Path, examples: list[Example]) -> None:
    """The images the examples show, copied once into data/images/ (the run trains without its inputs at hand)."""

    shas = sorted({sha for e in examples for sha in e.images})
    if shas and collect_dir is not None:
        source, target = run_images(collect_dir), ImageStore(data_dir / "images")
        for sha in shas:
            target.put(source.load(sha))


def _last_checkpoint_step(run_dir: Path) -> int | None:
    ckpts = [p for p in (run_dir / "checkpoints").glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
    return max((int(p.name.split("-")[-1]) for p in ckpts), default=None)
