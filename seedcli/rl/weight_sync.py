"""The rollout engine kept on the trainer's weights (docs/design.md §1, Stage 2): sleep and wake in stages, the streamed
weight refresh after every update, and the proofs that it holds the trainer's weights (`WeightSync`).

The proof of a refresh: exact checksums of some of the engine's own tensors against the trainer's (they see one
update at the paper's lr 1e-6); a mismatch stops the run. Then a fixed probe both sides score, a secondary check that
only warns: a bf16 engine and the bf16 trainer differ on it for honest reasons (kernels, fused norms), so it is
calibrated at the session's first check and warns when the difference drifts from there. On GPU the engine is
colocated with the trainer: vLLM sleeps (frees its KV cache and weights) while the trainer re-scores and updates, and
wakes in two stages around the refresh.

Why checksums: a probe of log-probs cannot prove a refresh at the paper's learning rate (one update at lr 1e-6 moves
them ~3e-4, far below the noise between a bf16 engine and the trainer). Instead both sides checksum the raw bits of a
few tensors in the engine's dtype (the trainer casts its fp32 master weights the way the refresh does): any skipped or
partial refresh changes a checksum whenever the update changed any of those bits. The checksum itself
(`engines.base.tensor_checksum`) and the vLLM worker's reading of its own tensors (`engines.vllm.vllm_checksums`)
live with the engines; which tensors are checked and the comparison live here.
"""

from __future__ import annotations

import gc
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from seedcli.engines.base import tensor_checksum
from seedcli.errors import NonFiniteValue, UserError
from seedcli.rl import distributed as D
from seedcli.rl.logprobs import score_responses

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


# --------------------------------------------------------------------------------------------- sleep and wake


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
    if info.device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------- the refresh


@dataclass(frozen=True)
class WeightSync:
    """This session's rollout engine kept on this rank's actor `lm`: `prove_start` before the first update, `refresh`
    after each. `checksum_names`: the tensors the exact checksums compare; `check_sync`: the probe (`ProbeCheck`).
    A `shared` engine (the hf engine in fp32) generates with the trainer's live weights: nothing is sent, the probe
    still runs."""

    engine: Any
    lm: Any
    info: Any  # DistInfo
    shared: bool
    checksum_names: Sequence[str]
    check_sync: Callable[[int], dict[str, float]]
    # (name, tensor) of the weights the engine serves, in a dtype: every parameter of `lm` (D.iter_full_params), or
    # under LoRA the merged view (rl/lora.py: merged_params), streamed and checksummed alike
    params: Callable[..., Iterable[tuple[str, torch.Tensor]]] = D.iter_full_params
    # of `checksum_names`, those every refresh must compare (LoRA: merged weights the adapter changes, which a stale
    # engine would hold otherwise); one the engine cannot show fails the proof instead of being skipped
    required: Sequence[str] = ()

    def prove_start(self, step: int) -> None:
        """Before any update: the engine must already hold the trainer's weights (a broken engine fails now, not
        after an hour of rollouts): the probe (its calibration), then (an engine with its own copy) the exact
        checksums."""
        self.check_sync(step)
        if not self.shared:
            dtype = engine_weight_dtype(self.engine, self.info)
            start_sums = trainer_checksums(self.params(self.lm, dtype=dtype), self.checksum_names, dtype)
            check_checksums(start_sums, engine_checksums(self.engine, list(start_sums)), step, required=self.required)

    def refresh(self, step: int) -> dict[str, float]:
        """Wake the engine's weights, stream the new weights of `lm` into it one parameter at a time (under FSDP each
        shard cast to the engine's dtype, then gathered, once per storage), release the cache, wake the KV cache, then
        prove the refresh: exact checksums of `checksum_names` in the engine against the trainer's (a mismatch stops
        the run), then the probe (`check_sync`, warns only); under DDP also check that every rank holds the same
        weights. Returns the sync/ metrics.

        A tied lm_head is sent too (its tensor is the embedding's, gathered once): vLLM 0.32's layerwise reload treats
        lm_head as a layer of its own, and one that receives no weight is restored from its pre-reload copy ("Failed
        to load weights"), so skipping it leaves a stale output layer."""
        engine, info = self.engine, self.info
        release_cuda_cache(info)
        wake_engine(engine, ["weights"])
        trainer_sums: dict[str, list[int]] = {}
        sent = [0, 0]  # tensors the engine took, tensors in the stream
        if not self.shared:
            dtype = engine_weight_dtype(engine, info)
            wanted = set(self.checksum_names)

            def stream():
                for name, tensor in self.params(self.lm, dtype=dtype):
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
        if not self.shared:
            if sent[0] < sent[1]:
                raise WeightSyncError(
                    f"update {step}: the rollout engine took {sent[0]} of the {sent[1]} weight tensors of the refresh, "
                    "so its rollouts would come from stale weights. Stopped; resume with --resume once fixed"
                )
            # exact first (the probe cannot see one update at lr 1e-6), then the probe as a secondary check
            shown = engine_checksums(engine, list(trainer_sums))
            sync.update(check_checksums(trainer_sums, shown, step, required=self.required))
            sync["sync/tensors_sent"] = float(sent[0])
        sync.update(self.check_sync(step))
        if info.world > 1 and not info.fsdp:
            digests = D.all_gather_object(D.param_digest(self.lm), info)
            sync["dist/ranks_in_sync"] = float(len(set(digests)) == 1)
            if len(set(digests)) != 1:
                raise UserError(f"update {step}: the ranks' weights differ after the update (DDP out of sync); stopped")
        return sync


# --------------------------------------------------------------------------------------------- checksums


def checksum_names(num_layers: int, linear: bool = True) -> list[str]:
    """The weights checked after each refresh: the embedding (every token), the first layer's attention and the
    last layer's MLP (both ends of the stack), the final norm and the lm_head. `linear=False` keeps to weights
    every back end stores unchanged (vLLM's CPU backend repacks linear layers for its GEMM kernels)."""
    last = num_layers - 1
    names = ["model.embed_tokens.weight", "model.norm.weight", f"model.layers.{last}.post_attention_layernorm.weight"]
    if linear:
        names += [
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.self_attn.v_proj.weight",
            f"model.layers.{last}.mlp.down_proj.weight",
        ]
    else:
        names += ["model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.v_proj.bias"]
    # a tied lm_head is checked too where the engine keeps its own copy (vLLM CPU); where it shares the embedding's
    # parameter (vLLM on GPU), the engine does not list it and it is compared through the embedding
    names.append("lm_head.weight")
    return names


def vision_checksum_names(num_layers: int, linear: bool = True) -> list[str]:
    """`checksum_names` for a vision-language model: the text stack's tensors under its transformers names, and
    the vision tower's first block norm and merger norm (plus, where linear weights are comparable, the first
    block's fused qkv), so a refresh that skips the vision tower fails the check."""
    text = [
        name if name == "lm_head.weight" else name.replace("model.", "model.language_model.", 1)
        for name in checksum_names(num_layers, linear)
    ]
    vision = ["model.visual.blocks.0.norm1.weight", "model.visual.merger.ln_q.weight"]
    if linear:
        vision.append("model.visual.blocks.0.attn.qkv.weight")
    return text + vision


def names_for_config(config, linear: bool = True) -> list[str]:
    """The checked tensor names of a model with Hugging Face `config` (text or vision-language)."""
    if getattr(config, "vision_config", None) is not None:
        text = getattr(config, "text_config", None) or config
        return vision_checksum_names(text.num_hidden_layers, linear)
    return checksum_names(config.num_hidden_layers, linear)


def trainer_checksums(named: Iterable[tuple[str, torch.Tensor]], names: Sequence[str], dtype: torch.dtype) -> dict:
    """Checksums of the tensors in `names` from (name, tensor) pairs, cast to the engine's `dtype` as the refresh
    sends them."""
    wanted = set(names)
    return {n: tensor_checksum(t.to(dtype)) for n, t in named if n in wanted}


def engine_weight_dtype(engine, info):
    """The dtype the rollout engine keeps its weights in (what the refresh casts to)."""
    dtype = getattr(engine, "weight_dtype", None)
    if isinstance(dtype, torch.dtype):
        return dtype
    model = getattr(engine, "model", None)
    if model is not None:
        return next(model.parameters()).dtype
    return torch.bfloat16 if info.device.type == "cuda" else torch.float32


def engine_checksums(engine, names: list[str]) -> dict[str, list[int]]:
    """Checksums of the engine's own copies of `names` (vLLM: read inside its worker; hf: its model's tensors)."""
    if hasattr(engine, "weight_checksums"):
        return engine.weight_checksums(names)
    model = getattr(engine, "model", None)
    if model is None:
        return {}
    dtype = next(model.parameters()).dtype
    return trainer_checksums(model.state_dict().items(), names, dtype)


def check_checksums(
    trainer: dict[str, list[int]], engine: dict[str, list[int]], step: int, required: Sequence[str] = ()
) -> dict[str, float]:
    """Raise WeightSyncError unless every tensor the engine could show has the trainer's exact checksum, at least one
    could be compared, and every `required` one was (LoRA: the merged weights the adapter changes). Returns the
    number of tensors verified as metrics (`sync/checksum_lora_tensors`: of them, the required ones)."""
    compared = [name for name in trainer if name in engine]
    if trainer and not compared:
        raise WeightSyncError(
            f"update {step}: none of the checksummed weights ({', '.join(sorted(trainer))}) could be read from the "
            "rollout engine, so the refresh cannot be proven; this vLLM version stores them differently — report it"
        )
    unseen = [name for name in required if name not in engine or name not in trainer]
    if unseen:
        raise WeightSyncError(
            f"update {step}: the rollout engine does not show its merged LoRA weights ({', '.join(unseen[:3])}), so "
            "the refresh of the adapter cannot be proven and its rollouts may come from stale weights. Stopped; "
            "report it with the engine and its version"
        )
    differ = [name for name in compared if trainer[name] != engine[name]]
    if differ:
        raise WeightSyncError(
            f"update {step}: after the weight refresh the rollout engine's {_listed(differ)} differ from the "
            "trainer's (exact checksum of the bits in the engine's dtype), so its rollouts would come from stale "
            "weights. Stopped; resume with --resume once fixed"
        )
    out = {"sync/checksum_tensors": float(len(compared))}
    if required:
        out["sync/checksum_lora_tensors"] = float(len(required))
    return out


def _listed(names: Sequence[str], shown: int = 4) -> str:
    """`names` joined, the first `shown` of a longer list and how many more."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


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
    previous check (`check_refresh`). The probe never stops a run unless the two sides score different tokens or the
    trainer's log-probs are non-finite: the exact checksums are the proof of a refresh. Returns the sync/ metrics."""

    def __init__(
        self, engine, train_model, probe: tuple[list[int], list[int]], *, tol: float, max_tokens: int, pad_id: int, info
    ) -> None:
        self.engine, self.train_model, self.probe = engine, train_model, probe
        self.tol, self.max_tokens, self.pad_id, self.info = tol, max_tokens, pad_id, info
        self.calibration: float | None = None  # mean |Δ| at the first check
        self.last: dict[str, list[float]] = {}  # the previous check's engine and trainer log-probs

    def __call__(self, step: int) -> dict[str, float]:
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
    than `tol`. Non-finite trainer log-probs raise NonFiniteValue: the run stops as failed."""
    bad = sum(not math.isfinite(float(x)) for x in trainer_logp)
    if bad:  # the weights no longer give a distribution: nothing trained from here can be exported
        raise NonFiniteValue(
            f"update {step}: the trainer's log-probs on the weight-sync probe are non-finite ({bad} of "
            f"{len(trainer_logp)} tokens): the weights no longer give a distribution, and nothing is exported. "
            "Lower --lr or check the model's dtype"
        )
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
