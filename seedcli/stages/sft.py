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
seedcli.stages.sft --worker RUN_DIR`, whose ranks read the same data/ and train with DDP (accelerate), rank 0 writing
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
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from seedcli.artifacts import (
    Manifest,
    atomic_write_text,
    model_run,
    open_run,
    read_manifest,
    resolve_input,
    saved_path,
)
from seedcli.config import SFTConfig
from seedcli.engines.base import check_gpus
from seedcli.errors import UserError
from seedcli.records import JsonlWriter, SkillRecord, Trajectory, iter_jsonl, read_jsonl, write_jsonl
from seedcli.sftdata import DataStats, Example, Expand, build_examples, kept_records, split_by_episode

LAUNCH_FILE = "launch.json"  # what the torchrun workers need: the config, the base model and the device


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
        recorded = str(Path(model))  # the config (and its hash) keep it as recorded, whatever the working directory
        # found as the collect run meant it: relative to the directory that run was started from
        path = saved_path(collect_dir, collect_manifest, model)
    else:
        recorded, path = str(Path(model)), Path(model)
    if not (path / "config.json").exists():
        raise UserError(
            f"--model {path}: not a Hugging Face model directory (no config.json); "
            f"build a tiny one with `seed model init --preset tiny --out {path}`"
        )
    return path, recorded


def _load_tokenizer(base: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(base)
    except Exception as exc:  # noqa: BLE001 - any loading failure is the same user-facing problem
        raise UserError(f"--model {base}: the tokenizer does not load ({str(exc).splitlines()[0][:200]})") from None
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(
            f"--model {base}: the tokenizer has no chat template, and SFT renders the analysis prompt with it; use an "
            "instruct model, or add one (Qwen2.5's ships with TRL: trl/chat_templates/qwen2_5.jinja) as "
            "chat_template.jinja in the model directory"
        )
    return tokenizer


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
    from seedcli.engines.base import is_vision_model
    from seedcli.engines.vision import expand_image_tokens, load_image_processor, vision_inputs
    from seedcli.images import run_images

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
    from rich.console import Console
    from rich.text import Text

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


def _tty() -> bool:
    return sys.stderr.isatty()


def _make_metrics_callback(path: Path, total_steps_hint: int | None = None) -> Any:
    from transformers import TrainerCallback

    class MetricsLogger(TrainerCallback):
        """metrics.jsonl rows (rank 0): train/* per logging step, val/* per evaluation; plain progress lines when stderr
        is not a terminal (tqdm shows the bar otherwise)."""

        def __init__(self) -> None:
            self.writer: JsonlWriter | None = None
            self.t_last = time.time()
            self.tokens_last: float | None = None
            self.t_print = 0.0

        def _write(self, row: dict) -> None:
            if self.writer is None:
                self.writer = JsonlWriter(path)
            self.writer.write(row)

        def on_train_begin(self, args, state, control, **kwargs):
            self.t_last = time.time()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs:
                return
            row: dict[str, Any] = {"step": state.global_step, "epoch": round(float(state.epoch or 0.0), 4)}
            if "eval_loss" in logs:
                row["val/loss"] = logs["eval_loss"]
                if "eval_mean_token_accuracy" in logs:
                    row["val/token_accuracy"] = logs["eval_mean_token_accuracy"]
            elif "loss" in logs:
                now = time.time()
                row["train/loss"] = logs["loss"]
                row["train/lr"] = logs.get("learning_rate")
                if "grad_norm" in logs:
                    row["train/grad_norm"] = logs["grad_norm"]
                if "mean_token_accuracy" in logs:
                    row["train/token_accuracy"] = logs["mean_token_accuracy"]
                tokens = logs.get("num_tokens")
                if tokens is not None:
                    if self.tokens_last is not None and tokens >= self.tokens_last and now > self.t_last:
                        row["perf/tokens_per_s"] = round((tokens - self.tokens_last) / (now - self.t_last), 1)
                    self.tokens_last = tokens
                self.t_last = now
            elif "train_runtime" in logs:
                row["timing_s/train"] = logs["train_runtime"]
                row["train/loss_mean"] = logs.get("train_loss")
            else:
                return
            self._write(row)
            if not _tty() and (
                time.time() - self.t_print > 30 or "val/loss" in row or state.global_step >= state.max_steps
            ):
                self.t_print = time.time()
                shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
                print(f"sft: {shown} (of {state.max_steps} steps)", file=sys.stderr, flush=True)

        def on_train_end(self, args, state, control, **kwargs):
            if self.writer is not None:
                self.writer.close()
                self.writer = None

    return MetricsLogger()


def _callbacks(run_dir: Path) -> list[Any]:
    """Trainer callbacks; tests add one here to interrupt a run at a chosen step."""
    return [_make_metrics_callback(run_dir / "metrics.jsonl")]


def _dataset(examples: list[Example]) -> Any:
    from datasets import Dataset

    columns = {"input_ids": [e.input_ids for e in examples], "labels": [e.labels for e in examples]}
    if any(e.images for e in examples):  # not named "images": TRL would take it for its own vision data format
        columns["image_shas"] = [e.images for e in examples]
    return Dataset.from_dict(columns)


class VisionCollator:
    """Batches of visual examples for a vision-language policy: ids and labels padded on the right, and each
    example's images (data/images/, by sha256) through the model's image processor — pixel_values, image_grid_thw,
    and mm_token_type_ids for Qwen2.5-VL's 3-D positions — the same inputs the engines score with."""

    def __init__(self, base: Path, image_dir: Path, pad_id: int):
        from seedcli.engines.vision import load_image_processor
        from seedcli.images import ImageStore

        self.processor = load_image_processor(base)
        self.image_token_id = int(json.loads((base / "config.json").read_text())["image_token_id"])
        self.store = ImageStore(image_dir)
        self.pad_id = pad_id

    def __call__(self, features: list[dict]) -> dict:
        import torch

        from seedcli.engines.vision import vision_inputs
        from seedcli.sftdata import IGNORE_INDEX

        width = max(len(f["input_ids"]) for f in features)
        ids = torch.full((len(features), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(features), width), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(features), width), dtype=torch.long)
        for i, f in enumerate(features):
            n = len(f["input_ids"])
            ids[i, :n] = torch.tensor(f["input_ids"])
            labels[i, :n] = torch.tensor(f["labels"])
            mask[i, :n] = 1
        batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        vision = vision_inputs(self.processor, [[self.store.pixels(s) for s in f["image_shas"]] for f in features])
        if vision.pixel_values is not None:
            expected = [sum(t) for t in vision.tokens]
            found = (ids == self.image_token_id).sum(dim=1).tolist()
            if found != expected:  # the data was built under another image processor
                raise UserError(f"image tokens in the data ({found}) differ from the images' ({expected}); rebuild")
            batch["pixel_values"] = vision.pixel_values
            batch["image_grid_thw"] = vision.image_grid_thw
            batch["mm_token_type_ids"] = (ids == self.image_token_id).to(torch.int32)
        return batch


def _trim_metrics(path: Path, last_step: int) -> None:
    """On resume, drop rows logged after the checkpoint the run continues from (they are logged again)."""
    if path.exists():
        rows = [r for r in read_jsonl(path) if r.get("step", 0) <= last_step]
        write_jsonl(path, rows)


def train(run_dir: Path, cfg: SFTConfig, base: Path, device: str) -> None:
    """Train on run_dir/data/ and export run_dir/model/ (every rank calls this; rank 0 writes). Continues from the
    newest checkpoint under run_dir/checkpoints/ when there is one."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.trainer_utils import get_last_checkpoint
    from trl import SFTConfig as TRLSFTConfig
    from trl import SFTTrainer

    if not _tty():
        transformers.utils.logging.disable_progress_bar()
        try:
            import datasets

            datasets.disable_progress_bars()
        except ImportError:  # pragma: no cover - datasets is a TRL dependency
            pass
    tokenizer = _load_tokenizer(base)
    train_examples = [Example.from_json(r) for r in read_jsonl(run_dir / "data" / "train.jsonl")]
    val_examples = [Example.from_json(r) for r in read_jsonl(run_dir / "data" / "val.jsonl")]
    visual = any(e.images for e in train_examples + val_examples)
    ckpt_dir = run_dir / "checkpoints"
    last = get_last_checkpoint(str(ckpt_dir)) if ckpt_dir.is_dir() else None
    # rows logged after the checkpoint are logged again (no checkpoint yet: the run starts over, step-0 eval included)
    _trim_metrics(run_dir / "metrics.jsonl", int(Path(last).name.split("-")[-1]) if last else -1)

    on_cuda = device == "cuda"
    # fp32 master weights: lr 5e-6 updates vanish in bf16 rounding; bf16 autocast does the matmuls on GPUs
    from seedcli.engines.base import is_vision_model
    from seedcli.precision import compute_dtype_name

    if is_vision_model(base):  # a vision-language policy: the whole model (vision tower too) is saved back
        from transformers import AutoModelForImageTextToText as AutoModelForCausalLM  # noqa: N814
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft_config = None
    if cfg.lora:
        from peft import LoraConfig

        targets = (
            cfg.lora_target if cfg.lora_target == "all-linear" else [t.strip() for t in cfg.lora_target.split(",")]
        )
        peft_config = LoraConfig(
            r=cfg.lora_r, lora_alpha=cfg.lora_alpha, target_modules=targets, lora_dropout=0.0, task_type="CAUSAL_LM"
        )
    args = TRLSFTConfig(
        output_dir=str(ckpt_dir),
        num_train_epochs=cfg.epochs,
        learning_rate=cfg.lr,
        per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.grad_accum,
        max_length=cfg.max_length,
        dataset_kwargs={"skip_prepare_dataset": True},  # data/ holds input_ids and labels already (sftdata.py)
        logging_steps=1,
        logging_first_step=True,
        eval_strategy="epoch" if val_examples else "no",
        eval_on_start=bool(val_examples) and last is None,
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=cfg.keep_checkpoints,
        seed=cfg.seed,
        data_seed=cfg.seed,
        use_cpu=not on_cuda,
        # auto: bf16 autocast on a GPU and on a CPU with bf16 instructions (seedcli/precision.py)
        bf16=compute_dtype_name(cfg.dtype, device) == "bfloat16",
        fp16=False,
        # recomputing activations saves memory at 8192 tokens on GPUs and only costs time on a tiny CPU model
        gradient_checkpointing=on_cuda,
        report_to="none",
        disable_tqdm=not _tty(),
        dataloader_num_workers=0,
        ddp_find_unused_parameters=False,
        remove_unused_columns=not visual,  # the collator reads each example's image_shas
    )
    extra: dict[str, Any] = {}
    if visual:
        extra["data_collator"] = VisionCollator(base, run_dir / "data" / "images", _pad_id(tokenizer))
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=_dataset(train_examples),
        eval_dataset=_dataset(val_examples) if val_examples else None,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=_callbacks(run_dir),
        **extra,
    )
    _quiet_console_logs(trainer)
    trainer.train(resume_from_checkpoint=last)
    if val_examples and not any(
        "eval_loss" in h and h.get("step") == trainer.state.global_step for h in trainer.state.log_history
    ):
        trainer.evaluate()
    if trainer.is_world_process_zero():
        _export(trainer, tokenizer, base, run_dir, cfg.lora)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def _pad_id(tokenizer: Any) -> int:
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else tokenizer.eos_token_id)


def _quiet_console_logs(trainer: Any) -> None:
    """Keep stdout for the result (`--json`): transformers prints every log dict there; metrics.jsonl and the
    plain stderr lines already carry them, and a terminal keeps the progress bar without the dicts."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    class BarOnly(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            pass

    trainer.remove_callback(PrinterCallback)
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(BarOnly())


def _export(trainer: Any, tokenizer: Any, base: Path, run_dir: Path, lora: bool) -> None:
    """model/: a plain Hugging Face model in the base model's dtype, with tokenizer and chat template."""
    import shutil

    from transformers import AutoConfig

    out = run_dir / "model"
    if out.exists():
        shutil.rmtree(out)
    model = trainer.model
    if lora:
        model.save_pretrained(run_dir / "adapter")
        model = model.merge_and_unload()
    dtype = getattr(AutoConfig.from_pretrained(base), "dtype", None)
    if dtype is not None and not isinstance(dtype, str):
        model = model.to(dtype)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for name in ("generation_config.json", "preprocessor_config.json"):
        # the base model's stop tokens and sampling defaults; a vision model's image processor
        if (base / name).exists():
            shutil.copy(base / name, out / name)


def _launch(run_dir: Path, cfg: SFTConfig, base: Path, device: str, nproc: int) -> None:
    """Train with `nproc` data-parallel processes under torchrun; they read their orders from run_dir/launch.json."""
    atomic_write_text(
        run_dir / LAUNCH_FILE,
        json.dumps({"config": cfg.model_dump(mode="json"), "base": str(base), "device": device}, indent=2),
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "seedcli.stages.sft",
        "--worker",
        str(run_dir),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    rc = subprocess.run(cmd, env=env).returncode
    if rc != 0:
        raise UserError(
            f"torchrun exited with code {rc} (the ranks' errors are above); fix the cause and continue with "
            f"`seed sft --resume {run_dir}`"
        )


def _worker_main(run_dir: str) -> None:
    """Entry point of one torchrun rank."""
    launch = json.loads((Path(run_dir) / LAUNCH_FILE).read_text())
    train(Path(run_dir), SFTConfig(**launch["config"]), Path(launch["base"]), launch["device"])


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
    from seedcli.engines.tiny import model_hash

    base_hash = model_hash(base)
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
        run.manifest.metrics.update(
            {"base_model": str(base), "base_model_hash": base_hash, "annotate_run": annotate_manifest.run_id}
        )
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
            "base_model": str(base),
            "base_model_hash": base_hash,
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
    from seedcli.images import ImageStore, run_images

    shas = sorted({sha for e in examples for sha in e.images})
    if shas and collect_dir is not None:
        source, target = run_images(collect_dir), ImageStore(data_dir / "images")
        for sha in shas:
            target.put(source.load(sha))


def _last_checkpoint_step(run_dir: Path) -> int | None:
    ckpts = [p for p in (run_dir / "checkpoints").glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
    return max((int(p.name.split("-")[-1]) for p in ckpts), default=None)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker_main(sys.argv[2])
    else:
        sys.exit("usage: python -m seedcli.stages.sft --worker RUN_DIR (started by `seed sft --gpus N`)")
