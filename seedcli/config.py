"""Stage configs: one pydantic model per stage (extra="forbid", every field described), YAML presets, overrides.

Resolution order, later wins: the model's defaults (the paper's numbers where the paper gives one) → a preset or
`--config FILE` (a YAML mapping, optionally with one section per stage) → CLI options → `key=value` overrides.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal, TypeVar

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from seedcli.errors import UserError

C = TypeVar("C", bound="StageConfig")

CONFIGS_DIR = Path(__file__).resolve().parent.parent / "configs"


def _nohash(description: str, default: Any = None, **kw: Any) -> Any:
    """A field that does not change what a run computes (resume flags, worker counts): left out of the config hash."""
    return Field(default, description=description, json_schema_extra={"hash": False}, **kw)


class StageConfig(BaseModel):
    """Fields every stage has."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    runs_dir: str = _nohash("root of the run directories", "runs")
    seed: int = Field(0, description="seed for sampling, task selection and initialisation")
    resume: str | None = _nohash(
        "continue an interrupted run: 'auto' = the newest incomplete run of the same config, or a run directory"
    )

    def hashed(self) -> dict:
        """The part of the config that decides what the run computes."""
        skip = {name for name, f in type(self).model_fields.items() if (f.json_schema_extra or {}).get("hash") is False}
        return {k: v for k, v in self.model_dump(mode="json").items() if k not in skip}

    def config_hash(self) -> str:
        blob = orjson.dumps(self.hashed(), option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(blob).hexdigest()


class RolloutConfig(StageConfig):
    """How the policy plays ALFWorld (shared by collect, eval and rl)."""

    env: Literal["alfworld"] = Field("alfworld", description="environment (ALFWorld, the paper's benchmark)")
    data_root: str | None = Field(None, description="ALFWorld data root; default $ALFWORLD_DATA or ../shared/alfworld")
    model: str | None = Field(None, description="policy model directory (Hugging Face format)")
    engine: Literal["hf", "vllm"] = Field("hf", description="generation back end: transformers or vLLM")
    device: str = _nohash("device for the hf engine: auto | cpu | cuda", "auto")
    max_steps: int = Field(30, ge=1, description="steps per episode before it ends unwon")
    history: int = Field(5, ge=0, description="observation/action pairs of history shown in the prompt")
    temperature: float = Field(0.4, ge=0.0, description="sampling temperature (0 = greedy)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling")
    max_new_tokens: int = Field(512, ge=1, description="generated tokens per turn")
    workers: int = _nohash("environment worker processes (0 = in-process)", 2, ge=0)
    gen_batch: int = _nohash("episodes in play at once: one batched generation call per turn covers them all", 64, ge=1)


class CollectConfig(RolloutConfig):
    """`seed collect`: the base policy plays training games; every episode becomes a trajectory."""

    split: str = Field("train", description="ALFWorld split: train | seen (valid_seen) | unseen (valid_unseen)")
    tasks: int = Field(180, ge=1, description="games to play, balanced over the six task types")
    rollouts: int = Field(8, ge=1, description="episodes per game (a group)")
    task_types: list[str] | None = Field(None, description="restrict to these task types (pick, look, clean, ...)")

    @field_validator("task_types", mode="before")
    @classmethod
    def _split_csv(cls, v: Any) -> Any:
        return [s.strip() for s in v.split(",") if s.strip()] if isinstance(v, str) else v


class AnnotateConfig(StageConfig):
    """`seed annotate`: an analyzer turns each trajectory into a hindsight skill."""

    from_run: str | None = Field(None, description="collect run to annotate (default: newest complete)")
    analyzer: Literal["glm", "openai", "policy", "rules"] = Field(
        "glm", description="glm (Z.ai API), openai (any OpenAI-compatible endpoint), policy (local model), rules (offline)"
    )
    model: str | None = Field(None, description="analyzer model name (glm: GLM-5.2 by default) or model dir (policy)")
    base_url: str | None = Field(None, description="chat-completions base URL (glm preset: Z.ai's)")
    api_key_env: str | None = Field(None, description="environment variable holding the API key (glm: ZAI_API_KEY)")
    concurrency: int = _nohash("requests in flight", 16, ge=1)
    max_retries: int = _nohash("retries per request on 429/5xx/timeouts", 6, ge=0)
    backoff: float = _nohash("first retry delay in seconds; doubles per retry, with jitter, at most 60 s", 1.0, ge=0)
    timeout: float = _nohash("seconds per request", 120.0, gt=0)
    temperature: float = Field(0.0, ge=0.0, description="analyzer temperature")
    max_tokens: int = Field(4096, ge=1, description="max tokens of the analyzer's answer")
    engine: Literal["hf", "vllm"] = Field("hf", description="engine for the policy analyzer")
    device: str = _nohash("device for the policy analyzer's hf engine", "auto")
    price_prompt_per_mtok: float = _nohash("USD per million prompt tokens (cost estimate; GLM-5.2 list price)", 1.4)
    price_completion_per_mtok: float = _nohash("USD per million completion tokens (cost estimate; GLM-5.2 list price)", 4.4)


class SFTConfig(StageConfig):
    """`seed sft`: fine-tune the policy to write the skill JSON from the analysis prompt."""

    from_run: str | None = Field(None, description="annotate run with the skills (default: newest complete)")
    model: str | None = Field(None, description="base model directory (default: the collect run's policy)")
    epochs: float = Field(3, gt=0, description="training epochs")
    lr: float = Field(5e-6, gt=0, description="learning rate")
    max_length: int = Field(8192, ge=64, description="max tokens of prompt + completion")
    val_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="fraction of trajectories held out for validation")
    batch_size: int = Field(1, ge=1, description="per-device batch size")
    grad_accum: int = Field(8, ge=1, description="gradient accumulation steps")
    lora: bool = Field(False, description="train a LoRA adapter (merged on export) instead of all weights")
    lora_r: int = Field(16, ge=1, description="LoRA rank")
    lora_alpha: int = Field(32, ge=1, description="LoRA alpha")
    lora_target: str = Field(
        "all-linear", description="LoRA target modules: all-linear, or module names separated by commas (q_proj,v_proj)"
    )
    gpus: int = Field(0, ge=0, description="GPUs for data-parallel training (0 = CPU); changes the effective batch")
    save_steps: int = _nohash("checkpoint every N optimizer steps", 50, ge=1)
    keep_checkpoints: int = _nohash("intermediate checkpoints kept on disk (the oldest are deleted first)", 2, ge=1)
    device: str = _nohash("auto | cpu | cuda", "auto")
    show_samples: int = _nohash("print N training examples with the loss-masked tokens highlighted, and exit", 0, ge=0)


class RLConfig(RolloutConfig):
    """`seed rl`: GRPO + self-evolving on-policy distillation (DESIGN.md §1, Stage 2)."""

    from_run: str | None = Field(None, description="sft run to start from (or --model)")
    algo: Literal["seed", "grpo", "sdar", "opsd"] = Field("seed", description="seed | grpo | sdar | opsd")
    analyzer: str = Field("self", description="self | static:FILE | none")
    steps: int = Field(150, ge=1, description="policy updates")
    batch_tasks: int = Field(16, ge=1, description="training games per update")
    group: int = Field(8, ge=1, description="episodes per game (GRPO group)")
    temperature: float = Field(1.0, ge=0.0, description="rollout temperature")
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate (constant)")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay")
    kl_coef: float = Field(0.01, ge=0, description="k3 KL(θ‖ref) coefficient")
    entropy_coef: float = Field(0.001, ge=0, description="entropy bonus coefficient")
    opd_coef: float = Field(0.01, ge=0, description="λ_opd")
    opd_beta: float = Field(5.0, ge=0, description="gate sharpness β (0 = constant gate 0.5, OPSD)")
    clip_eps: float = Field(0.2, gt=0, description="PPO clip ε")
    dual_clip: float = Field(3.0, gt=1, description="dual-clip c for negative advantages")
    grad_clip: float = Field(1.0, gt=0, description="max grad norm")
    mini_batch: int = Field(256, ge=1, description="turn-samples per optimizer step")
    micro_batch_tokens: int = _nohash("tokens per micro-batch (packed by length)", 16384, ge=64)
    train_fraction: float = Field(1.0, gt=0, le=1.0, description="fraction of the training games used")
    val_every: int = Field(5, ge=0, description="validate on seen games every N updates (0 = never)")
    val_games: int = Field(24, ge=1, description="seen games per validation")
    save_every: int = _nohash("checkpoint every N updates", 10, ge=1)
    gpus: int = _nohash("GPUs (torchrun); 0 = CPU", 0, ge=0)
    nproc: int = _nohash("CPU processes (DDP over gloo)", 1, ge=1)
    split: str = Field("train", description="games to train on")
    analyzer_max_new_tokens: int = Field(512, ge=1, description="tokens of the self-analyzer's skill JSON (greedy)")
    analysis_max_chars: int = Field(
        24000, ge=1000, description="analysis prompts longer than this drop their oldest steps (fits the context)"
    )
    val_split: str = Field("seen", description="validation games: seen (valid_seen) | unseen (valid_unseen)")
    val_temperature: float = Field(0.4, ge=0.0, description="sampling temperature for validation episodes")
    sample_every: int = _nohash(
        "log one episode's per-token score shift to samples.jsonl every N updates (0 = val_every, or 1 without val)",
        0,
        ge=0,
    )
    keep_checkpoints: int = _nohash("keep only the newest N checkpoints (0 = all)", 0, ge=0)
    sync_tol: float | None = _nohash(
        "max mean |Δ log-prob| between engine and trainer on the probe after a weight refresh "
        "(default: 1e-3 when they share weights in fp32, 0.05 otherwise)",
        None,
        gt=0,
    )
    gradient_checkpointing: bool = _nohash("recompute decoder activations in backward (saves memory, costs time)", False)
    parallel: Literal["auto", "ddp", "fsdp"] = _nohash(
        "data parallelism: auto = FSDP on GPU, DDP on CPU; fsdp on CPU runs the GPU code path over gloo", "auto"
    )
    vllm_gpu_memory: float = _nohash(
        "fraction of GPU memory the colocated vLLM engine may take (the rest is the trainer's)", 0.3, gt=0, lt=1
    )
    max_model_len: int = _nohash("vLLM context length (capped at the model's max_position_embeddings)", 8192, ge=256)
    torchrun_args: str | None = _nohash(
        "extra torchrun options for multi-node runs, e.g. '--nnodes 2 --node-rank 0 --rdzv-endpoint host:29500'"
    )


class EvalConfig(RolloutConfig):
    """`seed eval`: play every game of valid_seen or valid_unseen once and report success per task type."""

    split: str = Field("unseen", description="seen (valid_seen, 140 games) | unseen (valid_unseen, 134 games)")
    from_run: str | None = Field(None, description="sft or rl run (or a checkpoint inside one) to evaluate")
    policy: Literal["model", "expert", "random"] = Field("model", description="model | expert | random")
    limit: int | None = Field(None, ge=1, description="evaluate only the first N games (the result is marked partial)")


STAGE_CONFIGS: dict[str, type[StageConfig]] = {
    "collect": CollectConfig,
    "annotate": AnnotateConfig,
    "sft": SFTConfig,
    "rl": RLConfig,
    "eval": EvalConfig,
}


def parse_overrides(pairs: list[str] | None) -> dict[str, Any]:
    """`key=value` strings → dict; values parsed as YAML scalars (numbers, booleans, null, lists)."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise UserError(f"override '{pair}' is not key=value (example: temperature=0.7)")
        key, value = pair.split("=", 1)
        try:
            out[key.strip().replace("-", "_")] = yaml.safe_load(value) if value != "" else None
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise UserError(f"config file {path} not found; list presets with `ls {CONFIGS_DIR}`")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)}); fix the file") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of config keys, got {type(data).__name__}")
    return data


def resolve_preset(name_or_path: str) -> Path:
    """A preset name (e.g. `tiny`, `alfworld/paper_qwen25_3b`) or a file path."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    for candidate in (CONFIGS_DIR / f"{name_or_path}.yaml", CONFIGS_DIR / "alfworld" / f"{name_or_path}.yaml"):
        if candidate.exists():
            return candidate
    names = sorted(str(f.relative_to(CONFIGS_DIR).with_suffix("")) for f in CONFIGS_DIR.rglob("*.yaml"))
    raise UserError(f"config '{name_or_path}' not found; presets: {', '.join(names)} (or pass a YAML file path)")


def build_config(
    stage: str,
    config_file: str | None = None,
    cli: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
) -> StageConfig:
    """Resolve a stage config; a bad key or value is a one-line UserError naming the field and the source."""
    cls = STAGE_CONFIGS[stage]
    values: dict[str, Any] = {}
    source = "defaults"
    if config_file:
        path = resolve_preset(config_file)
        data = load_yaml(path)
        # a preset holds one section per stage plus optional shared keys
        shared = {k: v for k, v in data.items() if k not in STAGE_CONFIGS and not isinstance(v, dict)}
        section = data.get(stage, {}) or {}
        if not isinstance(section, dict):
            raise UserError(f"{path}: section '{stage}' must be a mapping")
        shared = {k: v for k, v in shared.items() if k in cls.model_fields}
        values.update(shared)
        values.update(section)
        source = str(path)
    values.update({k: v for k, v in (cli or {}).items() if v is not None})
    values.update(parse_overrides(overrides))
    try:
        return cls(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "?"
        hint = ""
        if err["type"] == "extra_forbidden":
            hint = f"; valid keys: {', '.join(cls.model_fields)}"
        raise UserError(f"{stage} config ({source} + options): field '{loc}': {err['msg']}{hint}") from None


def to_yaml(cfg: BaseModel) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
