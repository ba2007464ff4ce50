"""Stage configs: one pydantic model per stage (extra="forbid", every field described), YAML presets, overrides.

Resolution order, later wins: the model's defaults (the paper's numbers where the paper gives one) → a preset or
`--config FILE` (a YAML mapping, optionally with one section per stage) → CLI options → `key=value` overrides.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from pathlib import Path
from typing import Any, Literal, TypeVar

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from seedcli.errors import UserError

C = TypeVar("C", bound="StageConfig")

CONFIGS_DIR = Path(__file__).resolve().parent.parent / "configs"


def _nohash(description: str, default: Any = None, **kw: Any) -> Any:
    """A field that does not change what a run computes (resume flags, worker counts): left out of the config hash."""
    return Field(default, description=description, json_schema_extra={"hash": False}, **kw)


def _dtype_field(what: str) -> Any:
    """The compute dtype of a stage that runs a model (seedcli/precision.py): hashed only when not auto."""
    return Field(
        "auto",
        description=f"compute dtype of {what}: auto (bf16 on a GPU or on a CPU with AVX512-BF16/AMX, else fp32) | "
        "float32 | bfloat16 (bf16 and fp32 accepted); trained weights and AdamW state stay fp32, the loss "
        "arithmetic is fp32",
        json_schema_extra={"hash": "if_changed"},
    )


def _dtype_value(value: Any) -> Any:
    from seedcli.precision import normalise

    try:
        return normalise(value) if isinstance(value, str) or value is None else value
    except ValueError as exc:
        raise ValueError(str(exc)) from None


# GiGPO's settings: in the config hash only with step_advantage gigpo
GIGPO_FIELDS = ("gigpo_gamma", "step_advantage_w", "gigpo_norm", "gigpo_similarity", "gigpo_similarity_threshold")


def _env_name(v: Any) -> str:
    """A registered environment's name (case and spaces ignored), or a ValueError listing them."""
    from seedcli.envs import ENV_NAMES

    if str(v).strip().lower() not in ENV_NAMES:
        raise ValueError(
            f"unknown environment {v!r}{nearest(str(v).strip().lower(), ENV_NAMES)} (use one of "
            f"{', '.join(ENV_NAMES)}; `seed envs` lists them)"
        )
    return str(v).strip().lower()


# marks a field whose default is the environment's (`_env_defaults`): the CLI's help says so instead of one number
_ENV_DEFAULT = {"env_default": True}


class StageConfig(BaseModel):
    """Fields every stage has."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    runs_dir: str = _nohash("root of the run directories", "runs")
    seed: int = Field(0, description="seed for sampling, task selection and initialisation")
    resume: str | None = _nohash(
        "continue an interrupted run: 'auto' = the newest incomplete run of the same config, or a run directory"
    )
    logger: str = _nohash(
        "metric loggers, comma-separated: jsonl (metrics.jsonl, always on), tensorboard, wandb", "jsonl"
    )

    def hashed(self) -> dict:
        """The part of the config that decides what the run computes."""
        fields = type(self).model_fields
        skip = {name for name, f in fields.items() if (f.json_schema_extra or {}).get("hash") is False}
        # fields added later count only when set, so the hashes of configs that do not use them stay as they were
        if_set = {name for name, f in fields.items() if (f.json_schema_extra or {}).get("hash") == "if_set"}
        # ... or only when they differ from their default (`dtype: auto` keeps every earlier hash)
        if_changed = {name for name, f in fields.items() if (f.json_schema_extra or {}).get("hash") == "if_changed"}
        return {
            k: v
            for k, v in self.model_dump(mode="json").items()
            if k not in skip
            and not (k in if_set and v in (None, {}, []))
            and not (k in if_changed and v == fields[k].default)
        }

    def config_hash(self) -> str:
        blob = orjson.dumps(self.hashed(), option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(blob).hexdigest()


def _env_defaults(cls: type, data: dict) -> dict:
    """Fill the fields whose default depends on the environment (turns, history, splits, advantage mode) when the
    config does not set them. The field defaults are ALFWorld's, so its configs and hashes are unchanged."""
    from seedcli.envs import env_class

    if str(data.get("env", "alfworld")).strip().lower() == "alfworld":
        return data
    try:
        env = env_class(data.get("env", "alfworld"))
    except UserError:
        return data  # the env field's validator reports it
    defaults = {
        "max_steps": env.max_steps,
        "history": env.history,
        "val_split": env.val_split,
        "advantage_norm": env.advantage_norm,
        "max_step_skills": env.max_step_skills,
        "gigpo_norm": env.gigpo_norm,
        "gigpo_similarity": env.gigpo_similarity_threshold is not None,
        "gigpo_similarity_threshold": env.gigpo_similarity_threshold or 0.95,
    }
    defaults["split"] = env.eval_splits[0] if cls.__name__ == "EvalConfig" else env.train_split
    out = dict(data)
    for key, value in defaults.items():
        if key in cls.model_fields and out.get(key) is None:
            out[key] = value
    return out


class RolloutConfig(StageConfig):
    """How the policy plays an environment (shared by collect, eval and rl)."""

    env: str = Field(
        "alfworld", description="environment: alfworld | webshop | search | sokoban | ezpoints (`seed envs` lists them)"
    )
    env_options: dict[str, Any] = Field(
        default_factory=dict,
        description="environment options as a YAML mapping, e.g. '{topk: 5, limit: 20}' (alfworld: none; webshop: "
        "goal_seed; search: corpus, search_url, datasets, limit, topk, timeout, max_retries; sokoban: observation, "
        "dim, num_boxes, search_depth; ezpoints: observation; types, defaults and ranges: `seed envs`)",
        json_schema_extra={"hash": "if_set"},
    )
    data_root: str | None = Field(
        None, description="environment data root; default $ALFWORLD_DATA / $WEBSHOP_DATA / ... or ../shared/<env>"
    )
    model: str | None = Field(None, description="policy model directory (Hugging Face format)")
    engine: Literal["hf", "vllm"] = Field("hf", description="generation back end: transformers or vLLM")
    device: str = _nohash("device for the hf engine: auto | cpu | cuda", "auto")
    dtype: Literal["auto", "float32", "bfloat16"] = _dtype_field("the policy (engine, re-scoring, trainer)")
    _check_dtype = field_validator("dtype", mode="before")(_dtype_value)
    max_steps: int = Field(
        30,
        ge=1,
        description="steps per episode before it ends unwon (default: the environment's: alfworld 30, webshop 15, "
        "search 4, sokoban 15, ezpoints 8)",
        json_schema_extra=_ENV_DEFAULT,
    )
    history: int = Field(
        5,
        ge=0,
        description="observation/action pairs of history shown in the prompt (default: the environment's: "
        "alfworld 5, webshop 2, search 4, sokoban 2, ezpoints 0)",
        json_schema_extra=_ENV_DEFAULT,
    )
    temperature: float = Field(0.4, ge=0.0, description="sampling temperature (0 = greedy)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling")
    max_new_tokens: int = Field(512, ge=1, description="generated tokens per turn")
    workers: int = _nohash("environment worker processes (0 = in-process)", 2, ge=0)
    gen_batch: int = _nohash(
        "episodes in play at once (lockstep: one batched generation call per turn covers them all)", 64, ge=1
    )
    rollout: Literal["async", "lockstep"] = _nohash(
        "async: each episode sends its next request when its own step returns, the engine batches continuously; "
        "lockstep: every episode waits for the turn's longest reply (the same trajectories either way in fp32; in "
        "bf16 the batch make-up can part them)",
        "async",
    )

    @field_validator("env", mode="before")
    @classmethod
    def _known_env(cls, v: Any) -> Any:
        return _env_name(v)

    @field_validator("env_options", mode="before")
    @classmethod
    def _options_text(cls, v: Any) -> Any:
        # `--env-options '{search_url: http://host:8000}'` arrives as text: read it as YAML
        if isinstance(v, str):
            try:
                v = yaml.safe_load(v) if v.strip() else {}
            except yaml.YAMLError as exc:
                problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
                raise ValueError(
                    f"{v!r} is not a YAML mapping ({problem}); write it as '{{topk: 5, limit: 20}}'"
                ) from None
        v = {} if v is None else v
        if not isinstance(v, dict):
            raise ValueError(f"{v!r} is not a mapping of option names to values; write it as '{{topk: 5}}'")
        return v

    @field_validator("env_options")
    @classmethod
    def _options_known(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        # checked against the environment's declared options (type, range, name) before anything runs; kept as
        # given, so the config and its hash are what the user wrote (the environment normalises them when built)
        env = info.data.get("env")
        if v and env is not None:
            from seedcli.envs import env_class

            try:
                env_class(env).check_options(v)
            except UserError as exc:
                raise ValueError(str(exc)) from None
        return v

    @model_validator(mode="before")
    @classmethod
    def _env_dependent_defaults(cls, data: Any) -> Any:
        return _env_defaults(cls, data) if isinstance(data, dict) else data


class CollectConfig(RolloutConfig):
    """`seed collect`: the base policy plays training games; every episode becomes a trajectory."""

    split: str = Field(
        "train",
        description="tasks to play: alfworld train | seen | unseen; webshop train | test; search train | dev | test "
        "or a JSONL file of questions; sokoban, ezpoints train | test (default: the environment's training split)",
        json_schema_extra=_ENV_DEFAULT,
    )
    tasks: int = Field(
        180,
        ge=1,
        description="tasks to play, balanced over the environment's categories (alfworld: its six task types; "
        "webshop: product categories; search: data sources; sokoban, ezpoints: one)",
    )
    rollouts: int = Field(8, ge=1, description="episodes per task (a group)")
    task_types: list[str] | None = Field(
        None,
        description="play only these categories, comma-separated (alfworld task types: pick, look, clean, heat, "
        "cool, pick_two; webshop: beauty, electronics, fashion, garden, grocery; search: data sources, e.g. "
        "hotpotqa_train)",
    )

    @field_validator("task_types", mode="before")
    @classmethod
    def _split_csv(cls, v: Any) -> Any:
        return [s.strip() for s in v.split(",") if s.strip()] if isinstance(v, str) else v


class AnnotateConfig(StageConfig):
    """`seed annotate`: an analyzer turns each trajectory into a hindsight skill."""

    from_run: str | None = Field(None, description="collect run to annotate (default: newest complete)")
    analyzer: Literal["glm", "openai", "policy", "rules"] = Field(
        "glm",
        description="glm (Z.ai API), openai (any OpenAI-compatible endpoint), policy (local model), rules (offline)",
    )
    model: str | None = Field(None, description="analyzer model name (glm: GLM-5.2 by default) or model dir (policy)")
    base_url: str | None = Field(None, description="chat-completions base URL (glm preset: Z.ai's)")
    api_key_env: str | None = Field(None, description="environment variable holding the API key (glm: ZAI_API_KEY)")
    concurrency: int = _nohash("requests in flight", 16, ge=1)
    max_retries: int = _nohash("retries per request on 429/5xx/timeouts", 6, ge=0)
    backoff: float = _nohash("first retry delay in seconds; doubles per retry, with jitter, at most 60 s", 1.0, ge=0)
    timeout: float = _nohash("seconds per request", 120.0, gt=0)
    max_failed_fraction: float = _nohash(
        "end the run failed (exit 1, `latest` unchanged) when more than this fraction of trajectories got no answer "
        "(request_failed); 0 = any failure fails the run",
        0.5,
        ge=0.0,
        le=1.0,
    )
    temperature: float = Field(0.0, ge=0.0, description="analyzer temperature")
    max_tokens: int = Field(4096, ge=1, description="max tokens of the analyzer's answer")
    engine: Literal["hf", "vllm"] = Field("hf", description="engine for the policy analyzer")
    device: str = _nohash("device for the policy analyzer's hf engine", "auto")
    dtype: Literal["auto", "float32", "bfloat16"] = _dtype_field("the policy analyzer's engine")
    _check_dtype = field_validator("dtype", mode="before")(_dtype_value)
    price_prompt_per_mtok: float = _nohash("USD per million prompt tokens (cost estimate; GLM-5.2 list price)", 1.4)
    price_completion_per_mtok: float = _nohash(
        "USD per million completion tokens (cost estimate; GLM-5.2 list price)", 4.4
    )


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
    dtype: Literal["auto", "float32", "bfloat16"] = _dtype_field("training (bf16 autocast over fp32 weights)")
    _check_dtype = field_validator("dtype", mode="before")(_dtype_value)
    show_samples: int = _nohash("print N training examples with the loss-masked tokens highlighted, and exit", 0, ge=0)


class RLConfig(RolloutConfig):
    """`seed rl`: GRPO + self-evolving on-policy distillation (docs/design.md §1, Stage 2)."""

    from_run: str | None = Field(None, description="sft run to start from (or --model)")
    algo: Literal["seed", "grpo", "gigpo", "sdar", "opsd"] = Field(
        "seed",
        description="seed | grpo | gigpo (GRPO with GiGPO's step credit, no OPD; implies step_advantage=gigpo) | "
        "sdar | opsd",
    )
    analyzer: str = Field(
        "self",
        description="self (π_old writes each episode's skill) | rules (the environment's offline rules analyzer "
        "writes it from the trajectory) | static:FILE | none",
    )
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
    lr_warmup_steps: int = Field(
        0,
        ge=0,
        description="updates over which the lr rises linearly to `lr`: update k ≤ n trains at lr·k/n (verl's "
        "actor.optim.lr_warmup_steps, whose first update runs at lr·0); 0 = constant. Against AdamW's sign-like first "
        "steps, which move every weight by ~lr at once",
        json_schema_extra={"hash": "if_changed"},
    )
    mini_batch: int = Field(256, ge=1, description="turn-samples per optimizer step")
    old_logp: Literal["rescore", "reuse"] = Field(
        "rescore",
        description="ℓ_old of the PPO ratio: rescore = a separate no-grad pass before the update (verl's "
        "recompute, the SEED code's); reuse = when the update is one optimizer step (one mini-batch), π_old is θ at "
        "that step, so ℓ_old is the update's own forward, detached (TRL's GRPOTrainer with num_iterations 1): one "
        "forward pass fewer per turn-sample, the ratio exactly 1; updates of several mini-batches still re-score",
        json_schema_extra={"hash": "if_changed"},
    )
    zero_adv: Literal["keep", "drop"] = Field(
        "keep",
        description="turn-samples with advantage 0 and no OPD term (their group's episodes all scored alike): keep "
        "(the paper's; they still carry the KL and entropy terms) | drop them before re-scoring (DAPO's filter of "
        "uniform groups, without its re-sampling): the token means then run over the samples that teach",
        json_schema_extra={"hash": "if_changed"},
    )
    micro_batch_tokens: int = _nohash("tokens per micro-batch (packed by length)", 16384, ge=64)
    train_fraction: float = Field(1.0, gt=0, le=1.0, description="fraction of the training games used")
    val_every: int = Field(5, ge=0, description="validate on seen games every N updates (0 = never)")
    val_games: int = Field(24, ge=1, description="seen games per validation")
    save_every: int = _nohash(
        "checkpoint every N updates (0 = none, not even the last: nothing to resume from)", 10, ge=0
    )
    gpus: int = _nohash("GPUs (torchrun); 0 = CPU", 0, ge=0)
    nproc: int = _nohash("CPU processes (DDP over gloo)", 1, ge=1)
    split: str = Field(
        "train",
        description="tasks to train on (default: the environment's training split)",
        json_schema_extra=_ENV_DEFAULT,
    )
    analyzer_max_new_tokens: int = Field(512, ge=1, description="tokens of the self-analyzer's skill JSON (greedy)")
    analysis_max_chars: int = Field(
        24000, ge=1000, description="analysis prompts longer than this drop their oldest steps (fits the context)"
    )
    val_split: str = Field(
        "seen",
        description="validation tasks (default: the environment's: alfworld seen, webshop test, search dev)",
        json_schema_extra=_ENV_DEFAULT,
    )
    advantage_norm: Literal["mean_std", "mean"] = Field(
        "mean_std",
        description="GRPO group normalisation: mean_std | mean (default: the environment's: alfworld and search "
        "mean_std, webshop mean)",
        json_schema_extra=_ENV_DEFAULT,
    )
    val_temperature: float = Field(0.4, ge=0.0, description="sampling temperature for validation episodes")
    # GiGPO's step credit (verl-agent's gigpo/core_gigpo.py; docs/parity.md); hashed only when step_advantage=gigpo
    step_advantage: Literal["none", "gigpo"] = Field(
        "none",
        description="none = the episode-relative advantage only (GRPO, SEED); gigpo = plus GiGPO's step-relative "
        "advantage (turns of a task group with the same observation form a step group); --algo gigpo sets it; "
        "with --algo seed it puts SEED's OPD on top of GiGPO (the SEED code forbids this: step_advantage_w must be 0)",
        json_schema_extra={"hash": "if_set"},
    )
    gigpo_gamma: float = Field(
        0.95, ge=0.0, le=1.0, description="GiGPO's discount γ of the step returns (verl-agent's algorithm.gamma)"
    )
    step_advantage_w: float = Field(
        1.0,
        ge=0.0,
        description="ω, the weight of GiGPO's step advantage: episode + ω·step (algorithm.gigpo.step_advantage_w)",
    )
    gigpo_norm: Literal["mean_std", "mean"] = Field(
        "mean_std",
        description="GiGPO's normalisation of both advantages, replacing advantage_norm: mean_std | mean (verl-agent's "
        "algorithm.gigpo.mode; default: its launchers': alfworld and search mean_std; webshop, sokoban, ezpoints mean)",
        json_schema_extra=_ENV_DEFAULT,
    )
    gigpo_similarity: bool = Field(
        False,
        description="group steps whose observation texts are similar (difflib ratio ≥ gigpo_similarity_threshold), not "
        "only identical (algorithm.gigpo.enable_similarity; default: the launchers': on for search only; text only)",
        json_schema_extra=_ENV_DEFAULT,
    )
    gigpo_similarity_threshold: float = Field(
        0.95,
        gt=0.0,
        lt=1.0,
        description="similarity a step needs to join a step group (algorithm.gigpo.similarity_thresh; default: 0.95, "
        "search's launcher 0.9)",
        json_schema_extra=_ENV_DEFAULT,
    )
    # RetireOPD's Adaptive Retirement (arXiv 2609.20784; its code is not public: docs/parity.md says what is inferred)
    retire_teacher_success: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="the teacher's recorded success rate in [0, 1] that the student's validation success is held "
        "against (RetireOPD measures its trained skill-conditioned teacher; seedcli's teacher never plays, so give "
        "it: e.g. the paper's or an eval's)",
        json_schema_extra={"hash": "if_set"},
    )
    retire_fraction: float = Field(
        0.9,
        gt=0.0,
        le=1.0,
        description="the target fraction of retire_teacher_success (RetireOPD's; the value 0.9 is seedcli's guess)",
        json_schema_extra={"hash": "if_set"},
    )
    retire_patience: int = Field(
        1,
        ge=1,
        description="validations in a row without a new smallest discrepancy that count as 'stopped shrinking' "
        "(inferred: the paper's exact rule is not public)",
        json_schema_extra={"hash": "if_set"},
    )
    opd_retire: Literal["off", "adaptive"] = Field(
        "off",
        description="adaptive = RetireOPD's Adaptive Retirement: at a validation where the student's success reached "
        "retire_fraction × retire_teacher_success and the teacher-student discrepancy (per-token KL estimate "
        "ℓ_old − ℓ_skill) has not shrunk for retire_patience validations, λ_opd is 0 from the next update on (RL "
        "alone); off = the paper's SEED. The discrepancy measure and the plateau rule are seedcli's reading of the "
        "paper (its code is not public)",
        json_schema_extra={"hash": "if_set"},
        validate_default=True,
    )
    # settings of the SEED code (algorithm.seed.* there; docs/parity.md); counted in the hash only when changed
    opd_start_after_steps: int | None = Field(
        None,
        ge=0,
        description="OPD weight 0 (and no teacher pass) for updates 1..N; null = from the first update "
        "(the SEED code's algorithm.seed.opd_start_after_steps)",
        json_schema_extra={"hash": "if_set"},
    )
    opd_stop_after_steps: int | None = Field(
        None,
        ge=0,
        description="OPD weight 0 (and no teacher pass) after update N; null = never stop "
        "(algorithm.seed.opd_stop_after_steps)",
        json_schema_extra={"hash": "if_set"},
    )
    analyze: Literal["all", "failed"] = Field(
        "all",
        description="episodes the self-analyzer writes skills for: all | failed (not won); static skills go to "
        "every episode (the SEED code's algorithm.seed.failed_only: false | true)",
        json_schema_extra={"hash": "if_set"},
    )
    failed_only_after_steps: int | None = Field(
        None,
        ge=0,
        description="analyse every episode in updates 1..N and only failed ones after, whatever `analyze` says; "
        "null = `analyze` decides (algorithm.seed.failed_only_after_steps)",
        json_schema_extra={"hash": "if_set"},
    )
    min_skill_words: int = Field(
        5,
        ge=0,
        description="a parsed skill shorter than this many words is rejected (skill_too_short); the SEED code: 5 "
        "for its API analyzer, none for the policy analyzer",
        json_schema_extra={"hash": "if_set"},
    )
    analyzer_parse_retries: int = Field(
        2,
        ge=1,
        description="attempts per episode, the first included, when the self-analyzer's answer does not parse; "
        "each retry shows the previous answer and the schema reminder (counted as the SEED code's "
        "SEED_ANALYSIS_PARSE_RETRIES counts them: 2 = one retry)",
        json_schema_extra={"hash": "if_set"},
    )
    # guards against skills that teach the wrong thing (issue 19 §3; not in the SEED code); hashed only when set
    leak_guard: Literal["off", "mask", "drop"] = Field(
        "off",
        description="before the teacher pass: mask = replace each span of a skill the environment's leak rule finds "
        "by '[…]'; drop = no skill (no OPD) for that episode; off = the paper",
        json_schema_extra={"hash": "if_set"},
    )
    opd_contrast: Literal["none", "shuffled"] = Field(
        "none",
        description="shuffled = the OPD gate reads the teacher gap minus the gap under another episode's skill of "
        "the same category (an extra teacher pass); none = the paper",
        json_schema_extra={"hash": "if_set"},
    )
    skill_mode: Literal["episode_only", "episode_step", "step_only"] = Field(
        "episode_only",
        description="which skills the self-analyzer writes and the teacher prompts carry: episode_only = one episode "
        "skill on every turn (the public launchers); episode_step = also up to max_step_skills step skills, and a "
        "turn with one gets its step skill instead of the episode skill; step_only = step skills only, turns without "
        "one get no OPD (the SEED code's algorithm.seed.skill_mode, skill_teacher_mode step_priority)",
        json_schema_extra={"hash": "if_set"},
    )
    max_step_skills: int = Field(
        5,
        ge=0,
        description="step skills kept per episode, the first ones of the analyzer's answer (the SEED code's "
        "analysis_max_step_skills_per_traj; default: the environment's: alfworld, webshop 5; search, sokoban 2; "
        "ezpoints 0); not in the config hash under skill_mode episode_only",
        json_schema_extra={"hash": "if_set", **_ENV_DEFAULT},
    )
    dump_analyses: bool = _nohash(
        "write each update's analyses (prompt, answer, parsed skills, rejection reason) to analyses/step_NNNNNN.jsonl "
        "and its skill-augmented teacher prompts to teacher_prompts/step_NNNNNN.jsonl in the run directory (the SEED "
        "code's save_analysis, save_augmented_observations)",
        False,
    )
    sample_every: int = _nohash(
        "log one episode's per-token score shift to samples.jsonl every N updates (0 = val_every, or 1 without val)",
        0,
        ge=0,
    )
    workers: int | None = _nohash(
        "environment worker processes per rank (0 = in-process); default min(8, CPU cores per rank), enough for "
        "16 live games",
        None,
        ge=0,
    )
    keep_checkpoints: int = _nohash("keep only the newest N checkpoints (0 = all); a 3B checkpoint is ~30 GB", 3, ge=0)
    checkpoint_dtype: Literal["auto", "float32", "bfloat16"] = _nohash(
        "dtype of the checkpoints' model weights (what eval/collect load): auto = bfloat16 on GPU, float32 on CPU; "
        "optimizer state and master weights for resume stay float32",
        "auto",
    )
    sync_tol: float | None = _nohash(
        "allowed drift of the probe's mean |Δ log-prob| (engine vs trainer) beyond its first check's calibration: "
        "a warning, never a stop (the exact checksums prove a refresh); default 1e-3 when they share weights in "
        "fp32, 0.05 otherwise",
        None,
        gt=0,
    )
    gradient_checkpointing: bool | None = _nohash(
        "recompute decoder activations in backward (saves memory, costs ~30% time); default: on with --gpus, off on CPU",
        None,
    )
    collective_timeout_min: float = _nohash(
        "minutes a rank waits in a collective before the job fails (a hang becomes an error)", 30.0, gt=0
    )
    vllm_tensor_parallel: int = _nohash(
        "vLLM tensor-parallel size per engine (GPUs per engine; divides --gpus)", 1, ge=1
    )
    vllm_sleep_level: int = _nohash(
        "vLLM sleep level between rollouts: 2 drops the weights (refreshed after each update anyway), "
        "1 offloads them to pinned host memory",
        2,
        ge=1,
        le=2,
    )
    parallel: Literal["auto", "ddp", "fsdp"] = _nohash(
        "data parallelism: auto = FSDP on GPU, DDP on CPU; fsdp on CPU runs the GPU code path over gloo", "auto"
    )
    vllm_gpu_memory: float = _nohash(
        "fraction of GPU memory the colocated vLLM engine may take (the rest is the trainer's)", 0.3, gt=0, lt=1
    )
    vllm_vision_attention: Literal["TORCH_SDPA", "FLASH_ATTN"] | None = _nohash(
        "vLLM's vision-tower attention for a VLM policy; null = vLLM's own (flash attention on a GPU); TORCH_SDPA is "
        "slower (it synchronises and runs one attention per window)",
        None,
    )
    max_model_len: int = _nohash("vLLM context length (capped at the model's max_position_embeddings)", 8192, ge=256)
    torchrun_args: str | None = _nohash(
        "extra torchrun options for multi-node runs, e.g. '--nnodes 2 --node-rank 0 --rdzv-endpoint host:29500'"
    )

    @model_validator(mode="before")
    @classmethod
    def _gigpo_sets_step_advantage(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("algo") == "gigpo" and data.get("step_advantage") is None:
            return {**data, "step_advantage": "gigpo"}
        return data

    @field_validator("step_advantage")
    @classmethod
    def _gigpo_is_step_credit(cls, v: str, info: ValidationInfo) -> str:
        if info.data.get("algo") == "gigpo" and v != "gigpo":
            raise ValueError("--algo gigpo is GiGPO's step credit: drop step_advantage=none, or use --algo grpo")
        return v

    @field_validator("opd_retire")
    @classmethod
    def _retirement_needs_a_teacher_and_validations(cls, v: str, info: ValidationInfo) -> str:
        if v == "off":
            return v
        algo = info.data.get("algo")
        if algo in ("grpo", "gigpo"):
            raise ValueError(f"adaptive retires the OPD teacher, and --algo {algo} has none; use --algo seed")
        if not info.data.get("val_every"):
            raise ValueError("adaptive decides at validations: set val_every>=1")
        if info.data.get("retire_teacher_success") is None:
            raise ValueError("adaptive needs the teacher's success rate: set retire_teacher_success (e.g. 0.9)")
        return v

    @field_validator("skill_mode")
    @classmethod
    def _step_skills_need_the_self_analyzer(cls, v: str, info: ValidationInfo) -> str:
        algo, spec = info.data.get("algo"), str(info.data.get("analyzer", "self")).strip()
        if v != "episode_only" and algo != "grpo" and (algo == "sdar" or spec.startswith("static:") or spec == "rules"):
            source = "--algo sdar" if algo == "sdar" else f"--analyzer {spec}"
            raise ValueError(
                f"{v} needs step skills, which only --analyzer self writes ({source} gives episode skills only); "
                "use skill_mode=episode_only or --analyzer self"
            )
        return v

    @field_validator("max_step_skills")
    @classmethod
    def _step_only_needs_step_skills(cls, v: int, info: ValidationInfo) -> int:
        if v == 0 and info.data.get("skill_mode") == "step_only":
            raise ValueError("0 with skill_mode step_only gives no skill at all; set max_step_skills>=1")
        return v

    def hashed(self) -> dict:
        """As StageConfig's, and a field marked "if_set" also counts only when it differs from its default, so a
        setting added with the default of today's behaviour (`analyze: all`, `min_skill_words: 5`) keeps every
        stored hash. `max_step_skills` counts only when step skills are on (its default is the environment's)."""
        out = super().hashed()
        for name, f in type(self).model_fields.items():
            if name in out and (f.json_schema_extra or {}).get("hash") == "if_set":
                default = f.get_default(call_default_factory=True)
                if out[name] == default:
                    del out[name]
        if self.skill_mode == "episode_only":
            out.pop("max_step_skills", None)
        if self.step_advantage == "none":  # GiGPO's settings (some default to the environment's) change nothing then
            for name in GIGPO_FIELDS:
                out.pop(name, None)
        elif not self.gigpo_similarity:
            out.pop("gigpo_similarity_threshold", None)
        if self.opd_retire == "off":
            for name in ("retire_teacher_success", "retire_fraction", "retire_patience"):
                out.pop(name, None)
        return out


class EvalConfig(RolloutConfig):
    """`seed eval`: play every game of valid_seen or valid_unseen once and report success per task type."""

    split: str = Field(
        "unseen",
        description="split to evaluate: alfworld unseen (valid_unseen, 134 games) | seen (valid_seen, 140); webshop "
        "test (500 goals); search test | dev, or a JSONL file of questions in FlashRAG's fields; sokoban, ezpoints test "
        "(512 seeded games; --limit N plays the first N) (default: the environment's first: unseen, test, test, "
        "test, test)",
        json_schema_extra=_ENV_DEFAULT,
    )
    from_run: str | None = Field(None, description="sft or rl run (or a checkpoint inside one) to evaluate")
    policy: Literal["model", "expert", "random"] = Field("model", description="model | expert | random")
    limit: int | None = Field(
        None, ge=1, description="evaluate only N tasks (search: N per data source); the result is marked partial"
    )
    datasets: list[str] | None = Field(
        None,
        description="evaluate only these categories, comma-separated (search: data sources, e.g. nq,bamboogle)",
        json_schema_extra={"hash": "if_set"},
    )

    @field_validator("datasets", mode="before")
    @classmethod
    def _datasets_csv(cls, v: Any) -> Any:
        return [s.strip() for s in v.split(",") if s.strip()] if isinstance(v, str) else v


class WarmStartConfig(StageConfig):
    """`seed warmstart`: behaviour-clone an environment's expert into a model (with skill writing), before Stage 1."""

    model: str | None = Field(None, description="base model directory (Hugging Face format) to clone the expert into")
    env: str = Field(
        "alfworld", description="whose expert: alfworld (its searching expert) | webshop | search | sokoban | ezpoints"
    )
    data_root: str | None = Field(None, description="the environment's data directory (default: its own lookup)")
    games: int = Field(240, ge=1, description="training games (tasks) the expert plays, from the train split")
    epochs: int = Field(4, ge=1, description="epochs over the demonstrations")
    noise: float = Field(
        0.2, ge=0.0, lt=1.0, description="share of turns that play a random admissible action (labelled: the expert's)"
    )
    max_steps: int | None = Field(
        None, ge=1, description="turns per demonstration (default: 40 on alfworld, the environment's own elsewhere)"
    )
    history: int | None = Field(
        None, ge=0, description="past turns in the prompt (default: 5 on alfworld, the environment's own elsewhere)"
    )
    skill_writing: bool = Field(
        True, description="also teach writing the rules analyzer's skill JSON (for rl --analyzer self)"
    )
    shape: Literal["keep", "agent"] = Field(
        "keep",
        description="keep: train the model as given | agent: first rebuild a tiny model with the warm-start shape "
        "(AGENT_SHAPE, same tokenizer preset and seed; the default tiny shape is too small to copy an action)",
    )
    lr: float = Field(1e-3, gt=0, description="peak learning rate (1e-3 from scratch; 5e-5 for a pretrained model)")
    prompt_weight: float = Field(
        0.5,
        ge=0.0,
        description="weight of the next-token loss on prompt tokens (teaches a model from random weights the game's "
        "language); 0 = response tokens only (a pretrained model)",
    )
    batch_tokens: int = Field(4096, ge=1, description="padded tokens per batch (count x longest)")
    analysis_max_chars: int = Field(6000, ge=1, description="characters of the analysis prompt (as rl's self-analyzer)")
    check_turns: int = Field(64, ge=0, description="demonstration turns of the greedy acting check after training")
    check_skills: int = Field(8, ge=0, description="episodes held out of skill writing for the skill-writing check")
    dtype: Literal["auto", "float32", "bfloat16"] = _dtype_field("training (bf16 autocast over fp32 weights)")
    _check_dtype = field_validator("dtype", mode="before")(_dtype_value)
    workers: int = _nohash("environment worker processes for the expert's games (0 = in this process)", 2, ge=0)
    threads: int | None = _nohash("torch threads (default: $OMP_NUM_THREADS, else 1)", None, ge=1)
    cache_dir: str | None = _nohash("demonstrations cache (default: $SEEDCLI_CACHE/expert-demos)")

    _check_env = field_validator("env", mode="before")(_env_name)


STAGE_CONFIGS: dict[str, type[StageConfig]] = {
    "collect": CollectConfig,
    "annotate": AnnotateConfig,
    "sft": SFTConfig,
    "rl": RLConfig,
    "eval": EvalConfig,
    "warmstart": WarmStartConfig,
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


# shared keys whose value is a mapping (a preset's top level may hold them beside the stage sections)
MAPPING_FIELDS = ("env_options",)

# sections a preset may hold for the scripts around the stages (not read by any stage), with their keys
SCRIPT_SECTIONS: dict[str, tuple[str, ...]] = {
    # the older spelling of the `warmstart:` stage section (scripts/method_check.sh reads either)
    "warm_start": ("games", "epochs", "noise", "seed", "lr"),
    "method_check": ("seeds", "arms"),  # scripts/method_check.sh: the seeds and the rl arguments of each arm
    "model": ("preset",),  # scripts/method_check.sh: the `seed model init` preset the check starts from
    "stage1": ("heldout_tasks",),  # scripts/method_check.sh: Stage 1 (collect → annotate → sft) before Stage 2
}


def nearest(key: str, valid: list[str] | tuple[str, ...]) -> str:
    """'; did you mean X?' for the closest valid key, or '' when none is close."""
    match = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.5)
    return f"; did you mean '{match[0]}'?" if match else ""


def _all_fields() -> set[str]:
    return {name for cls in STAGE_CONFIGS.values() for name in cls.model_fields}


def check_yaml_keys(data: dict, path: Path) -> None:
    """Every key of a config file must mean something: a stage section holding that stage's fields, or a shared
    field of some stage. A typo is a one-line error naming the key and the nearest valid one."""
    shared_valid = sorted(_all_fields())
    for key, value in data.items():
        key = str(key)
        if key in STAGE_CONFIGS:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise UserError(f"{path}: section '{key}' must be a mapping of {key} config keys")
            fields = list(STAGE_CONFIGS[key].model_fields)
            for sub in value:
                if str(sub) not in fields:
                    raise UserError(
                        f"{path}: unknown key '{key}.{sub}'{nearest(str(sub), fields)} "
                        f"(`seed {key} --help` lists the keys)"
                    )
        elif key in SCRIPT_SECTIONS and isinstance(value, dict):
            for sub in value:
                if str(sub) not in SCRIPT_SECTIONS[key]:
                    raise UserError(
                        f"{path}: unknown key '{key}.{sub}'{nearest(str(sub), SCRIPT_SECTIONS[key])} "
                        f"(valid: {', '.join(SCRIPT_SECTIONS[key])})"
                    )
        elif isinstance(value, dict) and key not in MAPPING_FIELDS:
            raise UserError(
                f"{path}: unknown section '{key}'{nearest(key, list(STAGE_CONFIGS))} "
                f"(sections: {', '.join(STAGE_CONFIGS)})"
            )
        elif key not in shared_valid:
            raise UserError(f"{path}: unknown key '{key}'{nearest(key, shared_valid)}")


def saved_config(run_dir: Path) -> dict:
    """The config a run was made with: its config.yaml (or, failing that, the manifest's copy)."""
    cfg_file = Path(run_dir) / "config.yaml"
    if cfg_file.exists():
        return load_yaml(cfg_file)
    manifest = Path(run_dir) / "manifest.json"
    if manifest.exists():
        try:
            return dict(orjson.loads(manifest.read_bytes()).get("config") or {})
        except (orjson.JSONDecodeError, AttributeError):
            pass
    raise UserError(f"--resume {run_dir}: no config.yaml or manifest.json; pass a run directory under runs/<stage>/")


def run_workdir(run_dir: Path, saved: dict | None = None) -> Path | None:
    """The directory a run was started from (relative paths in its config are relative to it): the manifest's
    `workdir`, else worked out from a relative runs_dir as `<workdir>/<runs_dir>/<stage>/<run id>`; None if unknown."""
    run_dir = Path(run_dir)
    try:
        recorded = orjson.loads((run_dir / "manifest.json").read_bytes()).get("workdir")
    except (OSError, orjson.JSONDecodeError, AttributeError):
        recorded = None
    if recorded and Path(recorded).is_dir():
        return Path(recorded)
    # not recorded (older runs), or gone (the project moved, runs and all): where a relative runs_dir puts it
    runs_dir = (saved if saved is not None else saved_config(run_dir)).get("runs_dir") or "runs"
    parts = Path(str(runs_dir)).parts
    root = run_dir.absolute().parent.parent
    if not parts:  # runs_dir "."
        return root
    if Path(str(runs_dir)).is_absolute() or ".." in parts or root.parts[-len(parts) :] != parts:
        return None
    return Path(*root.parts[: -len(parts)])


def _resume_values(stage: str, run_dir: Path, given: dict[str, Any], source: str) -> dict[str, Any]:
    """`--resume DIR`: the run's saved config, with the options given again checked against it. Options that do not
    change what the run computes (workers, batch sizes, device) may differ; any other difference is refused."""
    cls = STAGE_CONFIGS[stage]
    if run_dir.is_symlink():  # runs/<stage>/latest: resume the run it points to, not the pointer
        run_dir = run_dir.parent / run_dir.readlink()
    if not run_dir.is_dir():
        raise UserError(
            f"--resume {run_dir}: not a directory; pass a run directory (or a bare --resume for the newest)"
        )
    saved = {k: v for k, v in saved_config(run_dir).items() if k in cls.model_fields}
    unhashed = {n for n, f in cls.model_fields.items() if (f.json_schema_extra or {}).get("hash") is False}
    # a value given again counts as equal when pydantic normalises both to the same thing (e.g. "a,b" vs [a, b])
    try:
        normal = cls(**{**saved, **given}).model_dump(mode="json")
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "?"
        raise UserError(f"{stage} config ({source}): field '{loc}': {_message(err)}") from None
    differ = sorted(k for k in given if k not in unhashed and k in saved and normal[k] != saved[k])
    if differ:
        shown = ", ".join(f"{k} (run: {saved[k]!r}, given: {normal[k]!r})" for k in differ)
        raise UserError(
            f"--resume {run_dir}: options differ from the run's saved config: {shown}; drop them — "
            f"`seed {stage} --resume {run_dir}` reads {run_dir / 'config.yaml'} — or start a new run without --resume"
        )
    values = {**saved, **given}
    # the run's own runs root, wherever it was made from; absolute, as the working directory may change below
    values["runs_dir"] = str(Path(given.get("runs_dir") or run_dir.parent.parent).absolute())
    values["resume"] = str(run_dir.absolute())
    # continue in the directory the run was started from, so every relative path in its saved config (model,
    # from_run, data_root, static:FILE, ...) means what it meant then, whichever directory `--resume` is typed in;
    # the config, and so its hash, stay exactly as saved
    workdir = run_workdir(run_dir, saved_config(run_dir))
    if workdir is not None and workdir.is_dir() and workdir.resolve() != Path.cwd().resolve():
        os.chdir(workdir)
    return values


def build_config(
    stage: str,
    config_file: str | None = None,
    cli: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
) -> StageConfig:
    """Resolve a stage config; a bad key or value is a one-line UserError naming the field and the source.
    With `resume=DIR` the run's saved config is the base, options given again must agree with it, and the process
    moves to the directory the run was started from (its relative paths resolve as they did then)."""
    cls = STAGE_CONFIGS[stage]
    values: dict[str, Any] = {}
    source = "defaults"
    if config_file:
        path = resolve_preset(config_file)
        data = load_yaml(path)
        check_yaml_keys(data, path)
        # a preset holds one section per stage plus optional shared keys
        shared = {
            k: v for k, v in data.items() if k not in STAGE_CONFIGS and (not isinstance(v, dict) or k in MAPPING_FIELDS)
        }
        section = data.get(stage, {}) or {}
        shared = {k: v for k, v in shared.items() if k in cls.model_fields}
        values.update(shared)
        values.update(section)
        source = str(path)
    values.update({k: v for k, v in (cli or {}).items() if v is not None})
    values.update(parse_overrides(overrides))
    for key in values:
        if key not in cls.model_fields:
            raise UserError(
                f"{stage} config ({source} + options): field '{key}' is not a {stage} key"
                f"{nearest(key, list(cls.model_fields))} (valid keys: {', '.join(cls.model_fields)})"
            )
    resume = values.get("resume")
    if resume and resume != "auto":
        values = _resume_values(stage, Path(str(resume)), {k: v for k, v in values.items() if k != "resume"}, source)
    try:
        return cls(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "?"
        hint = ""
        if err["type"] == "extra_forbidden":
            hint = f"{nearest(loc, list(cls.model_fields))} (valid keys: {', '.join(cls.model_fields)})"
        raise UserError(f"{stage} config ({source} + options): field '{loc}': {_message(err)}{hint}") from None


def _message(err: Any) -> str:
    """pydantic's message of one error, without the "Value error, " it puts before our validators' own text."""
    return str(err["msg"]).removeprefix("Value error, ")


def to_yaml(cfg: BaseModel) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
