"""`seed sft`'s training: TRL's SFTTrainer on the examples that `seedcli.stages.sft` wrote to data/ (in-process on CPU
or one GPU; under torchrun with `--gpus N > 1`, each rank started as `python -m seedcli.stages.sft_train --worker
RUN_DIR` and reading its orders from launch.json), the metrics callback, the vision collator and the export of
model/."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from seedcli.artifacts import atomic_write_text
from seedcli.config import SFTConfig
from seedcli.engines.base import is_vision_model
from seedcli.engines.vision import load_image_processor, vision_inputs
from seedcli.errors import NonFiniteValue, UserError
from seedcli.images import ImageStore
from seedcli.precision import compute_dtype_name
from seedcli.records import JsonlWriter, read_jsonl, visible_floats, write_jsonl
from seedcli.sftdata import IGNORE_INDEX, Example

LAUNCH_FILE = "launch.json"  # what the torchrun workers need: the config, the base model and the device


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
            self.writer.write(visible_floats(row))  # a nan loss reads "nan", not null

        def on_train_begin(self, args, state, control, **kwargs):
            self.t_last = time.time()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            # before this step's checkpoint is saved; every rank holds the same weights, so every rank stops
            if model is not None and not all(bool(p.isfinite().all()) for p in model.parameters()):
                raise NonFiniteValue(
                    f"sft step {state.global_step}: the weights are non-finite (nan or inf) after the optimizer "
                    f"step (lr {args.learning_rate:g}); nothing is exported: start again with a lower lr"
                )

        def on_log(self, args, state, control, logs=None, **kwargs):
            names = {"loss": "train/loss", "grad_norm": "train/grad_norm", "eval_loss": "val/loss"}
            bad = [k for k in names if isinstance((logs or {}).get(k), float) and not math.isfinite(logs[k])]
            if bad:  # the logged loss is the ranks' mean: every rank stops
                if state.is_world_process_zero:
                    self._write({"step": state.global_step, **{names[k]: logs[k] for k in bad}})
                raise NonFiniteValue(
                    f"sft step {state.global_step}: {' and '.join(f'{k} {logs[k]}' for k in bad)}; nothing is "
                    f"exported: start again with a lower lr (now {args.learning_rate:g})"
                )
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
        self.processor = load_image_processor(base)
        self.image_token_id = int(json.loads((base / "config.json").read_text())["image_token_id"])
        self.store = ImageStore(image_dir)
        self.pad_id = pad_id

    def __call__(self, features: list[dict]) -> dict:
        import torch

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
        logging_nan_inf_filter=False,  # a nan loss is logged as nan (and stops the run), not as the window's mean
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
    """Train with `nproc` data-parallel processes under torchrun (rl's launcher, `rl.distributed`); they read their
    orders from run_dir/launch.json."""
    from seedcli.rl.distributed import launch, torchrun_command  # torch: kept out of the stage's import

    atomic_write_text(
        run_dir / LAUNCH_FILE,
        json.dumps({"config": cfg.model_dump(mode="json"), "base": str(base), "device": device}, indent=2),
    )
    cmd = torchrun_command(nproc, run_dir, module="seedcli.stages.sft_train")
    rc = launch(cmd, env={"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    if rc != 0:
        raise UserError(
            f"torchrun exited with code {rc} (the ranks' errors are above); fix the cause and continue with "
            f"`seed sft --resume {run_dir}`"
        )


def _worker_main(run_dir: str) -> None:
    """Entry point of one torchrun rank."""
    launch = json.loads((Path(run_dir) / LAUNCH_FILE).read_text())
    train(Path(run_dir), SFTConfig(**launch["config"]), Path(launch["base"]), launch["device"])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker_main(sys.argv[2])
    else:
        sys.exit("usage: python -m seedcli.stages.sft_train --worker RUN_DIR (started by `seed sft --gpus N`)")
