"""The configs of collect, annotate, sft, eval and the warm start, and what they share for playing an environment
(`RolloutConfig`); rl's own, the largest, is in config/rl.py."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import yaml
from pydantic import Field, ValidationInfo, field_validator, model_validator

from seedcli.config.base import _ENV_DEFAULT, StageConfig, _dtype_field, _dtype_value, _env_defaults, _env_name, _nohash
from seedcli.envs import env_class
from seedcli.envs.base import MAX_STEPS
from seedcli.errors import UserError


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
    model: str | None = Field(
        None, description="policy model: a directory (Hugging Face format) or a Hub id ORG/NAME[@REVISION]"
    )
    engine: Literal["hf", "vllm"] = Field("hf", description="generation back end: transformers or vLLM")
    device: str = _nohash("device for the hf engine: auto | cpu | cuda", "auto")
    prefix_cache_mb: int = _nohash(
        "hf engine: MB of prompts' key/value states kept for reuse, so a prompt that begins like an earlier one "
        "prefills only its new tail (0 = off; vLLM caches prefixes itself)",
        1024,
        ge=0,
    )
    hf_batch: int = _nohash(
        "hf engine: sequences decoded together (the continuous batcher's rows; on a GPU more rows cost little more a "
        "step)",
        16,
        ge=1,
    )
    dtype: Literal["auto", "float32", "bfloat16"] = _dtype_field("the policy (engine, re-scoring, trainer)")
    _check_dtype = field_validator("dtype", mode="before")(_dtype_value)
    max_steps: int = Field(
        30,
        ge=1,
        le=MAX_STEPS,
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
    deterministic: bool = _nohash(
        "true: plays lockstep whatever `rollout` says, so every batch is made of the same requests run after run "
        "(in bf16 a row's sums depend on its batch, and async batches follow thread timing); the same command then "
        "gives the same episodes in bf16 too, as long as gen_batch, hf_batch and prefix_cache_mb stay the same",
        False,
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

    old_names: ClassVar[dict[str, str]] = {"task_types": "categories"}

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
    categories: list[str] | None = Field(
        None,
        description="play only these categories, comma-separated (alfworld task types: pick, look, clean, heat, "
        "cool, pick_two; webshop: beauty, electronics, fashion, garden, grocery; search: data sources, e.g. "
        "hotpotqa_train); formerly task_types",
        json_schema_extra={"hash_as": "task_types"},
    )

    @field_validator("categories", mode="before")
    @classmethod
    def _split_csv(cls, v: Any) -> Any:
        return [s.strip() for s in v.split(",") if s.strip()] if isinstance(v, str) else v


class AnnotateConfig(StageConfig):
    """`seed annotate`: an analyzer turns each trajectory into a hindsight skill."""

    from_run: str | None = Field(None, description="collect run to annotate (default: newest complete)")
    analyzer: Literal["glm", "openai", "policy", "rules", "hindsight"] = Field(
        "glm",
        description="glm (Z.ai API), openai (any OpenAI-compatible endpoint), policy (local model), rules (offline), "
        "hindsight (offline stand-in for GLM: each episode replayed against the environment's expert)",
    )
    model: str | None = Field(
        None, description="analyzer model name (glm: GLM-5.2 by default) or model dir or Hub id ORG/NAME (policy)"
    )
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
    model: str | None = Field(
        None, description="base model directory or Hub id ORG/NAME[@REVISION] (default: the collect run's policy)"
    )
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


class EvalConfig(RolloutConfig):
    """`seed eval`: play every game of valid_seen or valid_unseen once and report success per task type."""

    old_names: ClassVar[dict[str, str]] = {"datasets": "categories"}

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
    categories: list[str] | None = Field(
        None,
        description="evaluate only these categories, comma-separated (search: data sources, e.g. nq,bamboogle); "
        "formerly datasets",
        json_schema_extra={"hash": "if_set", "hash_as": "datasets"},
    )

    @field_validator("categories", mode="before")
    @classmethod
    def _datasets_csv(cls, v: Any) -> Any:
        return [s.strip() for s in v.split(",") if s.strip()] if isinstance(v, str) else v


class WarmStartConfig(StageConfig):
    """`seed warmstart`: behaviour-clone an environment's expert into a model (with skill writing), before Stage 1."""

    old_names: ClassVar[dict[str, str]] = {"games": "tasks"}

    model: str | None = Field(
        None, description="base model to clone the expert into: a directory or a Hub id ORG/NAME[@REVISION]"
    )
    env: str = Field(
        "alfworld", description="whose expert: alfworld (its searching expert) | webshop | search | sokoban | ezpoints"
    )
    data_root: str | None = Field(None, description="the environment's data directory (default: its own lookup)")
    tasks: int = Field(
        240,
        ge=1,
        description="training tasks the expert plays, drawn from the train split as collect draws them; formerly games",
        json_schema_extra={"hash_as": "games"},
    )
    epochs: int = Field(4, ge=1, description="epochs over the demonstrations")
    noise: float = Field(
        0.2, ge=0.0, lt=1.0, description="share of turns that play a random admissible action (labelled: the expert's)"
    )
    max_steps: int | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="turns per demonstration (default: 40 on alfworld, the environment's own elsewhere)",
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
    nproc: int = Field(
        1,
        ge=1,
        description="data-parallel CPU processes that train the clone (torchrun and gloo, the launcher sft and rl "
        "use; each takes every nproc-th example of a batch); 1 = this process",
        json_schema_extra={"hash": "if_changed"},
    )
    dtype: Literal["auto", "float32", "bfloat16"] = _dtype_field("training (bf16 autocast over fp32 weights)")
    _check_dtype = field_validator("dtype", mode="before")(_dtype_value)
    device: str = _nohash(
        "where the clone trains and is checked: auto (cuda when a GPU is visible) | cpu | cuda[:N] (one GPU; nproc 1)",
        "auto",
    )
    workers: int = _nohash("environment worker processes for the expert's games (0 = in this process)", 2, ge=0)
    threads: int | None = _nohash("torch threads (default: $OMP_NUM_THREADS, else 1)", None, ge=1)
    cache_dir: str | None = _nohash("demonstrations cache (default: $SEEDCLI_CACHE/expert-demos)")

    _check_env = field_validator("env", mode="before")(_env_name)
