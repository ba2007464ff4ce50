"""HFEngine: generation and scoring with plain transformers (CPU, or one GPU); the reference the vLLM engine is checked against.

engine = HFEngine("runs/sft/latest/model", max_batch=16)
completions = engine.generate(prompts, temperature=1.0, max_new_tokens=512, seed=0)
"""

from __future__ import annotations

import gc
import os
import random
from typing import Any

from seedcli.engines.attention import register as register_grouped_sdpa
from seedcli.engines.base import (
    Completion,
    completion_text,
    is_vision_model,
    render_chat,
    split_at_stop,
    stop_token_ids,
    vision_pad_ids,
)
from seedcli.engines.batching import SPARE_COLUMNS, ContinuousBatcher, race_choice
from seedcli.engines.vision import expand_image_tokens, load_image_processor, vision_inputs
from seedcli.precision import compute_dtype


class HFEngine:
    """transformers back end: left-padded batched `generate` with raw log-probs, and a forward-pass `score`. A
    vision-language model (Qwen2.5-VL) takes each request's images (`images=`), one per image placeholder."""

    name = "hf"

    def __init__(
        self,
        model_dir: str | os.PathLike,
        *,
        device: str = "auto",
        dtype: str | None = None,
        seed: int = 0,
        max_batch: int = 16,
        attn_implementation: str | None = None,
        prefix_cache_mb: int = 1024,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.device = torch.device(_resolve_device(device))
        self.max_batch = max_batch
        # continuous batching keeps prompts' key/value states for reuse, up to this much (0: off)
        self.prefix_cache_bytes = int(prefix_cache_mb) << 20
        self.kv_spare = SPARE_COLUMNS  # free key/value columns a batcher keeps for decode steps (0: concatenate)
        self.kv_holes = True  # a finished request's batcher row waits for the next request (False: dropped at once)
        self.weights_version = 0  # bumped by update_weights: a batcher's stored prompt states are then stale
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.vision = is_vision_model(model_dir)
        model_class = AutoModelForCausalLM
        if self.vision:
            from transformers import AutoModelForImageTextToText

            model_class = AutoModelForImageTextToText
            self.image_processor = load_image_processor(model_dir)
        self.dtype = _torch_dtype(dtype, self.device)  # auto: bf16 on a GPU or a CPU with bf16 instructions
        if attn_implementation is None:  # sdpa without repeating key/value heads (engines.attention)
            attn_implementation = register_grouped_sdpa()
        self.model = model_class.from_pretrained(
            model_dir, dtype=self.dtype, attn_implementation=attn_implementation
        ).to(self.device)
        self.image_token_id = getattr(self.model.config, "image_token_id", None)
        # a VLM never writes an image or video placeholder (one in a response would take an image's place when the
        # turn is re-scored), so sampling leaves them out
        self.suppress_ids = vision_pad_ids(self.model.config) if self.vision else []
        self.model.eval()
        self.stop_ids = stop_token_ids(self.tokenizer)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.stop_ids[-1]
        # The engine owns sampling: a checkpoint's generation_config (Qwen ships top_k=20, repetition_penalty=1.05)
        # must not leak into rollouts, so it is replaced with one that only names the stop and pad ids.
        self.model.generation_config = GenerationConfig(eos_token_id=self.stop_ids, pad_token_id=self.pad_id)
        self._rng = random.Random(seed)

    def render(self, messages: list[dict]) -> list[int]:
        """Chat template + generation prompt -> token ids."""
        return render_chat(self.tokenizer, messages)

    def generate(
        self,
        prompts: list[list[int]],
        *,
        temperature: float,
        top_p: float = 1.0,
        max_new_tokens: int,
        seed: int | None = None,
        seeds: list[int] | None = None,
        images: list[list[Any]] | None = None,
        ban_stop: bool = False,
    ) -> list[Completion]:
        """Sample (or, at temperature 0, greedily decode) one completion per prompt, in sub-batches of `max_batch`.

        Prompt i samples from its own generator seeded `seeds[i]` (default `seed + i`), so its completion depends on
        its prompt and seed alone, not on the batch it shares; `seed=None` draws from the engine's seed.
        `images[i]`: prompt i's images (uint8 H×W×3 arrays), one per image-pad token of its ids, in order.
        `ban_stop`: the stop tokens are never drawn (the rollout bench forces each reply's length).
        """
        import torch

        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if seeds is None:
            if seed is None:
                seed = self._rng.randrange(2**31)
            seeds = [(seed + i) % 2**63 for i in range(len(prompts))]
        elif len(seeds) != len(prompts):
            raise ValueError(f"generate got {len(prompts)} prompts but {len(seeds)} seeds")
        images = self._check_images(prompts, images)
        # similar lengths share a sub-batch, so little compute goes to padding
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        results: list[Completion | None] = [None] * len(prompts)
        with torch.inference_mode():
            for start in range(0, len(order), self.max_batch):
                chunk = order[start : start + self.max_batch]
                ids, extra = self._with_images([prompts[i] for i in chunk], [images[i] for i in chunk])
                batch = self._generate_batch(
                    ids, [seeds[i] for i in chunk], temperature, top_p, max_new_tokens, extra, ban_stop
                )
                for i, completion in zip(chunk, batch, strict=True):
                    results[i] = completion
        return results  # type: ignore[return-value]

    def _check_images(self, prompts: list[list[int]], images: list[list[Any]] | None) -> list[list[Any]]:
        if images is None:
            return [[] for _ in prompts]
        if len(images) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(images)} image lists")
        if any(images) and not self.vision:
            raise ValueError("this model has no vision tower: it cannot take images (use a vision-language model)")
        return [list(x) for x in images]

    def _with_images(self, prompts: list[list[int]], images: list[list[Any]]) -> tuple[list[list[int]], dict]:
        """The prompts with their image tokens expanded, and the forward's pixel_values/image_grid_thw."""
        if not self.vision:
            return prompts, {}

        if not any(images):
            for p in prompts:  # an image placeholder without its image
                expand_image_tokens(p, self.image_token_id, [])
            return prompts, {}

        batch = vision_inputs(self.image_processor, images)
        ids = [expand_image_tokens(p, self.image_token_id, n) for p, n in zip(prompts, batch.tokens, strict=True)]
        extra = {
            "pixel_values": batch.pixel_values.to(self.device),
            "image_grid_thw": batch.image_grid_thw.to(self.device),
        }
        return ids, extra

    def _token_types(self, input_ids, extra: dict | None) -> dict:
        """`extra` plus `mm_token_type_ids` (1 at image tokens) when it carries images: Qwen2.5-VL places its 3-D
        M-RoPE positions only when given them (transformers 5), else image tokens get plain 1-D positions."""
        if not extra or "pixel_values" not in extra:
            return extra or {}
        return {**extra, "mm_token_type_ids": (input_ids == self.image_token_id).to(torch_int())}

    def _generate_batch(
        self,
        prompts: list[list[int]],
        seeds: list[int],
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        extra: dict | None = None,
        ban_stop: bool = False,
    ) -> list[Completion]:
        import torch
        from transformers import LogitsProcessorList

        input_ids, attention_mask = self._left_pad(prompts)
        extra = self._token_types(input_ids, extra)
        processors = LogitsProcessorList()
        if temperature > 0:
            # each row draws from its own generator; generate() then takes the drawn token greedily
            processors.append(RowSampler(seeds, temperature, top_p))
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=False,
            logits_processor=processors,
            max_new_tokens=max_new_tokens,
            output_logits=True,  # raw logits, before temperature / top-p
            return_dict_in_generate=True,
            **self._suppress(ban_stop),
            **(extra or {}),
        )
        generated = out.sequences[:, input_ids.shape[1] :]  # [B, T]
        logprobs = torch.empty(generated.shape, dtype=torch.float32)  # [B, T]
        for step, step_logits in enumerate(out.logits):  # each [B, V]; one step at a time keeps memory at B x V
            step_logp = torch.log_softmax(step_logits.float(), dim=-1)
            logprobs[:, step] = step_logp.gather(-1, generated[:, step : step + 1]).squeeze(-1).cpu()
        completions = []
        for row_ids, row_logp in zip(generated.tolist(), logprobs.tolist(), strict=True):
            token_ids, finish = split_at_stop(row_ids, self.stop_ids, max_new_tokens)
            completions.append(
                Completion(
                    text=completion_text(self.tokenizer, token_ids, self.stop_ids),
                    token_ids=token_ids,
                    logprobs=row_logp[: len(token_ids)],
                    finish_reason=finish,
                )
            )
        return completions

    def _suppress(self, ban_stop: bool) -> dict:
        """Tokens never drawn: a VLM's image/video pads, and the stop tokens when a length is forced."""
        ids = list(self.suppress_ids) + (list(self.stop_ids) if ban_stop else [])
        return {"suppress_tokens": ids} if ids else {}

    def score(
        self, prompts: list[list[int]], completions: list[list[int]], images: list[list[Any]] | None = None
    ) -> list[list[float]]:
        """Raw log-prob of every completion token under the model, one forward pass per sub-batch (`images` as for
        `generate`)."""
        import torch

        if len(prompts) != len(completions):
            raise ValueError(f"score got {len(prompts)} prompts but {len(completions)} completions")
        images = self._check_images(prompts, images)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(completions[i]))
        results: list[list[float]] = [[] for _ in prompts]
        with torch.inference_mode():
            for start in range(0, len(order), self.max_batch):
                chunk = [i for i in order[start : start + self.max_batch] if completions[i]]
                if not chunk:
                    continue
                ids, extra = self._with_images([prompts[i] for i in chunk], [images[i] for i in chunk])
                for i, logps in zip(chunk, self._score_batch(ids, [completions[i] for i in chunk], extra), strict=True):
                    results[i] = logps
        return results

    def _score_batch(
        self, prompts: list[list[int]], completions: list[list[int]], extra: dict | None = None
    ) -> list[list[float]]:
        import torch

        if any(not p for p in prompts):
            raise ValueError("score needs a non-empty prompt for every completion")
        input_ids, attention_mask = self._left_pad([p + c for p, c in zip(prompts, completions, strict=True)])
        extra = self._token_types(input_ids, extra)
        # left padding: completions end at the last position, so only the last max_len + 1 logits are needed
        keep = max(len(c) for c in completions) + 1
        # a VLM places its 3-D (M-RoPE) positions itself from the ids, the image grids and the mask
        positions = {} if self.vision else {"position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0)}
        logits = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            logits_to_keep=keep,
            use_cache=False,
            **positions,
            **(extra or {}),
        ).logits  # [B, keep, V]
        scores = []
        for row, completion in enumerate(completions):
            n = len(completion)
            row_logits = logits[
                row, keep - 1 - n : keep - 1
            ].float()  # [n, V]: logits at the position before each token
            target = torch.tensor(completion, device=row_logits.device).unsqueeze(-1)
            scores.append(torch.log_softmax(row_logits, dim=-1).gather(-1, target).squeeze(-1).tolist())
        return scores

    def _left_pad(self, sequences: list[list[int]]):
        import torch

        width = max(len(s) for s in sequences)
        input_ids = torch.full((len(sequences), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, seq in enumerate(sequences):
            if seq:
                input_ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
                attention_mask[row, width - len(seq) :] = 1
        return input_ids.to(self.device), attention_mask.to(self.device)

    def batcher(self) -> Any:
        """A continuous batcher over this engine (`seedcli.engines.batching`; text models): up to `max_batch`
        requests decode together, each leaving when it is done; prompts that begin like earlier ones prefill only
        their new tail (`seedcli.engines.prefix_cache`)."""

        return ContinuousBatcher(
            self,
            max_rows=self.max_batch,
            prefix_cache_bytes=self.prefix_cache_bytes,
            spare=self.kv_spare,
            holes=self.kv_holes,
        )

    def update_weights(self, state_dict_or_model: Any) -> None:
        """Copy weights in place from a state dict (Hugging Face names) or a model; tied lm_head may be absent."""
        import torch

        state_dict = (
            state_dict_or_model.state_dict()
            if isinstance(state_dict_or_model, torch.nn.Module)
            else state_dict_or_model
        )
        with torch.no_grad():
            missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        self.weights_version += 1
        if getattr(self.model.config, "tie_word_embeddings", False):
            missing = [name for name in missing if name != "lm_head.weight"]
        if missing or unexpected:
            raise ValueError(
                f"update_weights: state dict does not match the model (missing {missing[:5]}, unexpected {unexpected[:5]}); "
                "pass a full state dict with Hugging Face parameter names"
            )

    def sleep(self) -> None:
        """No-op: the transformers engine keeps its weights where they are."""

    def wake_up(self) -> None:
        """No-op: see `sleep`."""

    def close(self) -> None:
        """Drop the model so its memory can be reclaimed."""
        import torch

        self.model = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class RowSampler:
    """A logits processor that samples each row with its own `torch.Generator` (temperature, then top-p) and leaves
    only the drawn token finite, so greedy decoding emits it. The draw is an exponential race, argmax(p / E) with
    E ~ Exp(1) per token (as vLLM samples): every row uses exactly V draws per step, so its stream never depends on
    the other rows, on padding, or on when they finish."""

    def __init__(self, seeds: list[int], temperature: float, top_p: float):
        self.seeds = seeds
        self.temperature = temperature
        self.top_p = top_p
        self.generators: list | None = None

    def __call__(self, input_ids, scores):
        import torch

        if self.generators is None:
            self.generators = [torch.Generator(device=scores.device).manual_seed(int(s)) for s in self.seeds]
        choice = race_choice(scores, self.generators, self.temperature, self.top_p)  # [B]
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(-1, choice.unsqueeze(-1), 0.0)
        return out


def torch_int():
    import torch

    return torch.int32


def _resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _torch_dtype(dtype, device):
    import torch

    if dtype is None or dtype == "auto":
        return compute_dtype("auto", device)
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; use one of auto, {', '.join(names)}")
    return names[dtype]
