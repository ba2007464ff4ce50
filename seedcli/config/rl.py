"""`seed rl`'s config: GRPO and SEED's settings (the paper's numbers where it gives one), GiGPO's, the retiring
teacher's, the engines and the schedule."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from seedcli.config.base import _ENV_DEFAULT, GIGPO_FIELDS, _nohash
from seedcli.config.stages import RolloutConfig

LORA_FIELDS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target")


class RLConfig(RolloutConfig):
    """`seed rl`: GRPO + self-evolving on-policy distillation (docs/design.md §1, Stage 2)."""

    old_names: ClassVar[dict[str, str]] = {"val_games": "val_tasks"}

    from_run: str | None = Field(None, description="sft run to start from (or --model)")
    algo: Literal["seed", "grpo", "gigpo", "sdar", "opsd"] = Field(
        "seed",
        description="seed | grpo | gigpo (GRPO with GiGPO's step credit, no OPD; implies step_advantage=gigpo) | "
        "sdar | opsd",
    )
    analyzer: str = Field(
        "self",
        description="self (π_old writes each episode's skill) | rules (the environment's offline rules analyzer "
        "writes it from the trajectory) | hindsight (the offline stand-in for GLM: each episode replayed against the "
        "environment's expert, the turn it left the expert's path or won, and a rule) | oracle (privileged, not SEED: "
        "the environment's expert knowledge of the task, e.g. its plan; the bound on what the OPD channel can carry; "
        "needs leak_guard off) | static:FILE | none",
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
    opd_form: Literal["gated_nll", "signed", "reward_direction"] = Field(
        "gated_nll",
        description="the OPD term's per-token weight w on −∇ℓ_θ (rl/losses.py, docs/parity.md): gated_nll = SEED's "
        "σ(β·Δ), which raises every sampled token; signed = clip(Δ, ±opd_clip), which pushes down tokens the skilled "
        "teacher likes less (on-policy distillation's sign); reward_direction = sign(A)·clip(sign(A)·Δ, 0, opd_clip), "
        "the outcome gives the direction and the teacher gap the extra magnitude (RLSD/SERL's split); Δ = ℓ_skill − ℓ_θ",
        json_schema_extra={"hash": "if_set"},
    )
    opd_clip: float = Field(
        1.0,
        gt=0,
        description="c, the largest |w| of the signed forms (nats of teacher gap); not used by gated_nll",
        json_schema_extra={"hash": "if_set"},
    )
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
    # LoRA (PEFT): only an adapter trains; hashed only with lora=true (rl/lora.py, docs/parity.md)
    lora: bool = Field(
        False,
        description="train a LoRA adapter on the frozen starting model instead of every weight (the names of seed "
        "sft's); the KL reference is the base, the adapter disabled; the rollout engine gets the merged weights and the "
        "refresh proof covers them; checkpoints hold model/ (merged) and adapter/ with its optimiser state",
        json_schema_extra={"hash": "if_set"},
    )
    lora_r: int = Field(16, ge=1, description="LoRA rank (with lora=true)")
    lora_alpha: int = Field(32, ge=1, description="LoRA alpha: the update is scaled by alpha / r (with lora=true)")
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapter's input (with lora=true)")
    lora_target: str = Field(
        "all-linear",
        description="LoRA target modules: all-linear (every linear layer but lm_head), or linear module names "
        "separated by commas (q_proj,v_proj) (with lora=true)",
    )
    micro_batch_tokens: int = _nohash("tokens per micro-batch (packed by length)", 16384, ge=64)
    share_prefix: bool = _nohash(
        "the rows of a micro-batch that begin alike (one game's turn-samples) run their common prefix once, in the "
        "update and in re-scoring: the same log-probs and gradients up to float rounding (not under FSDP, which frees "
        "a layer's gathered weights between its two calls; not with images)",
        True,
    )
    train_fraction: float = Field(1.0, gt=0, le=1.0, description="fraction of the training games used")
    val_every: int = Field(5, ge=0, description="validate on seen games every N updates (0 = never)")
    val_tasks: int = Field(
        24,
        ge=1,
        description="validation tasks drawn per validation (from val_split); formerly val_games",
        json_schema_extra={"hash_as": "val_games"},
    )
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
    advantage_level: Literal["turn", "episode"] = Field(
        "turn",
        description="over what GRPO normalises a group: turn = all its turn-samples (verl-agent's default, "
        "compute_mean_std_cross_steps=True); episode = its episodes, one score each (=False). Under turn, a group "
        "whose lost episodes are shorter than its won ones gives the actions every episode ends with (EZPoints' `=`) "
        "a net push down (docs/method-check-calibration.md)",
        json_schema_extra={"hash": "if_changed"},
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
    skill_control: Literal["none", "shuffled"] = Field(
        "none",
        description="shuffled = each episode's skill is replaced by the skill of an episode of another task of the same "
        "update (after the leak guard), whose text differs: the control that keeps a skill block's presence and form "
        "but not its information (with --analyzer oracle: another game's oracle); none = the episode's own",
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
    print_memory_plan: bool = _nohash(
        "print the expected GPU memory of full and LoRA training side by side (the config's --model, or Qwen2.5-3B "
        "and 7B, on 24, 48, 80 and 141 GiB cards; seedcli/rl/memory_plan.py) and exit",
        False,
    )

    @field_validator("lora_target")
    @classmethod
    def _lora_target_names(cls, v: str) -> str:
        names = [t.strip() for t in v.split(",")]
        if not all(names) or any(" " in t for t in names):
            raise ValueError("use all-linear, or module names separated by commas (q_proj,v_proj)")
        if "lm_head" in names or "embed_tokens" in names:
            raise ValueError(
                "the adapter goes on the decoder's linear layers only (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,"
                "down_proj or all-linear); lm_head and embed_tokens stay frozen"
            )
        return ",".join(names)

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

    @field_validator("group")
    @classmethod
    def _a_group_needs_a_baseline(cls, v: int, info: ValidationInfo) -> int:
        algo = info.data.get("algo")
        if v == 1 and algo in ("grpo", "gigpo"):
            raise ValueError(
                f"1 puts each episode in a group of its own: --algo {algo} then has no baseline and every advantage is "
                "0 (nothing to learn); use group>=2"
            )
        return v

    @field_validator("opd_form", "skill_control", "opd_contrast")
    @classmethod
    def _grpo_has_no_teacher(cls, v: str, info: ValidationInfo) -> str:
        algo = info.data.get("algo")
        if algo in ("grpo", "gigpo") and v != cls.model_fields[info.field_name].default:
            raise ValueError(
                f"--algo {algo} has no OPD teacher, so {info.field_name}={v} would change nothing; drop it, or use "
                "--algo seed"
            )
        return v

    @field_validator("leak_guard")
    @classmethod
    def _the_oracle_leaks_on_purpose(cls, v: str, info: ValidationInfo) -> str:
        if v != "off" and str(info.data.get("analyzer", "")).strip() == "oracle" and info.data.get("algo") != "grpo":
            raise ValueError(
                "--analyzer oracle gives the teacher privileged information on purpose, which the leak guard would "
                "mask or drop; set leak_guard=off (the leak audit still reports it)"
            )
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
        fixed = spec.startswith("static:") or spec in ("rules", "hindsight", "oracle")
        if v != "episode_only" and algo != "grpo" and (algo == "sdar" or fixed):
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
        if not self.lora:  # the adapter's settings change nothing without one
            for name in LORA_FIELDS:
                out.pop(name, None)
        if self.opd_form == "gated_nll":  # the clip of the signed forms changes nothing then
            out.pop("opd_clip", None)
        return out
