"""HFVLEngine: generation and scoring with images for a Qwen2.5-VL (or Qwen2-VL) policy under plain transformers.

    engine = HFVLEngine("runs/models/tiny-vl", max_batch=16)
    ids = engine.render([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Act."}]}])
    [completion] = engine.generate([ids], images=[[pixels]], temperature=1.0, max_new_tokens=64, seed=0)
    [logps] = engine.score([ids], [completion.token_ids], images=[[pixels]])   # == completion.logprobs

Prompt ids hold ONE `<|image_pad|>` per image, as the chat template writes it and as vLLM takes them
(`engines.vllm.vllm_requests`); `images[i]` is request i's images (uint8 H×W×3 arrays or PIL images) in the order of
its placeholders. Before the forward each pad is widened to its image's merged-patch count (`expand_image_tokens`,
what `Qwen2_5_VLProcessor` does), and the model gets `pixel_values`, `image_grid_thw` and M-RoPE positions computed
per row over the unpadded tokens, so left padding never changes a request's tokens or log-probs. Completions,
seeds and log-probs mean what they mean for `HFEngine`, whose sampler and helpers this engine reuses.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from typing import Any

from seedcli.engines.base import Completion, completion_text, split_at_stop, stop_token_ids
from seedcli.engines.hf import HFEngine, RowSampler, _resolve_device, _torch_dtype


def expand_image_tokens(
    token_ids: Sequence[int], grid_thw: Sequence[Sequence[int]], image_token_id: int, merge_size: int = 2
) -> list[int]:
    """`token_ids` with the k-th `image_token_id` repeated grid_t·grid_h·grid_w // merge_size² times, where
    `grid_thw[k]` is the k-th image's patch grid (the image processor's `image_grid_thw`). The ids must hold exactly
    one image token per image."""
    found = sum(1 for t in token_ids if t == image_token_id)
    if found != len(grid_thw):
        raise ValueError(f"the prompt holds {found} image placeholder(s) but {len(grid_thw)} image(s) came with it")
    counts = [int(t) * int(h) * int(w) // (merge_size * merge_size) for t, h, w in (tuple(g) for g in grid_thw)]
    out: list[int] = []
    k = 0
    for token in token_ids:
        if token == image_token_id:
            out.extend([image_token_id] * counts[k])
            k += 1
        else:
            out.append(int(token))
    return out


class HFVLEngine(HFEngine):
    """`HFEngine` for a vision-language model: `generate` and `score` take `images`, one list per request."""

    name = "hf"
    vision = True  # the rollout sends each turn's images (`rollout.ModelPolicy`)

    def __init__(
        self,
        model_dir: str | os.PathLike,
        *,
        device: str = "auto",
        dtype: str | None = None,
        seed: int = 0,
        max_batch: int = 16,
        attn_implementation: str = "sdpa",
    ) -> None:
        import torch
        from transformers import AutoModelForImageTextToText, GenerationConfig

        from seedcli.engines.tiny_vl import load_vl_processor

        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.device = torch.device(_resolve_device(device))
        self.max_batch = max_batch
        self.tokenizer, self.image_processor = load_vl_processor(model_dir)
        self.model = AutoModelForImageTextToText.from_pretrained(
            model_dir, dtype=_torch_dtype(dtype), attn_implementation=attn_implementation
        ).to(self.device)
        self.model.eval()
        self.image_token_id = int(self.model.config.image_token_id)
        self.merge_size = int(self.model.config.vision_config.spatial_merge_size)
        if int(self.image_processor.merge_size) != self.merge_size:
            raise ValueError(
                f"{model_dir}: the image processor merges {self.image_processor.merge_size}×"
                f"{self.image_processor.merge_size} patches but the vision tower {self.merge_size}×{self.merge_size}"
            )
        self.stop_ids = stop_token_ids(self.tokenizer)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.stop_ids[-1]
        # as HFEngine: the engine owns sampling, the checkpoint's generation_config only names stop and pad ids
        self.model.generation_config = GenerationConfig(eos_token_id=self.stop_ids, pad_token_id=self.pad_id)
        self._rng = random.Random(seed)

    # render (chat template, one <|image_pad|> per image part), update_weights, sleep, wake_up and close: HFEngine's

    def generate(
        self,
        prompts: list[list[int]],
        *,
        temperature: float,
        top_p: float = 1.0,
        max_new_tokens: int,
        seed: int | None = None,
        seeds: list[int] | None = None,
        images: Sequence[Sequence[Any]] | None = None,
    ) -> list[Completion]:
        """`HFEngine.generate` with `images[i]`: prompt i's images, one per `<|image_pad|>` of its ids, in order
        (None: text only). Prompt i's completion depends on its prompt, images and seed alone."""
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
        requests = self._requests(prompts, images)
        # similar (expanded) lengths share a sub-batch, so little compute goes to padding
        order = sorted(range(len(prompts)), key=lambda i: len(requests[i][0]))
        results: list[Completion | None] = [None] * len(prompts)
        with torch.inference_mode():
            for start in range(0, len(order), self.max_batch):
                chunk = order[start : start + self.max_batch]
                batch = self._generate_vl_batch(
                    [requests[i] for i in chunk], [seeds[i] for i in chunk], temperature, top_p, max_new_tokens
                )
                for i, completion in zip(chunk, batch, strict=True):
                    results[i] = completion
        return results  # type: ignore[return-value]

    def score(
        self,
        prompts: list[list[int]],
        completions: list[list[int]],
        images: Sequence[Sequence[Any]] | None = None,
    ) -> list[list[float]]:
        """Raw log-prob of every completion token given its prompt and `images[i]` (as in `generate`)."""
        import torch

        if len(prompts) != len(completions):
            raise ValueError(f"score got {len(prompts)} prompts but {len(completions)} completions")
        if any(c and not p for p, c in zip(prompts, completions, strict=True)):
            raise ValueError("score needs a non-empty prompt for every completion")
        requests = self._requests(prompts, images)
        order = sorted(range(len(prompts)), key=lambda i: len(requests[i][0]) + len(completions[i]))
        results: list[list[float]] = [[] for _ in prompts]
        with torch.inference_mode():
            for start in range(0, len(order), self.max_batch):
                chunk = [i for i in order[start : start + self.max_batch] if completions[i]]
                if not chunk:
                    continue
                scored = self._score_vl_batch([requests[i] for i in chunk], [list(completions[i]) for i in chunk])
                for i, logps in zip(chunk, scored, strict=True):
                    results[i] = logps
        return results

    # ------------------------------------------------------------------------------------------------- internals

    def image_inputs(self, images: Sequence[Any]):
        """(pixel_values [Σ patches, C·T·P·P], image_grid_thw [n, 3]) of one request's images, or (None, None)."""
        import numpy as np
        import torch
        from PIL import Image

        if not images:
            return None, None
        pictures = [
            p if isinstance(p, Image.Image) else Image.fromarray(np.asarray(p, dtype=np.uint8), "RGB") for p in images
        ]
        out = self.image_processor(images=pictures, return_tensors="pt")
        return out["pixel_values"], out["image_grid_thw"].to(torch.long)

    def _requests(self, prompts: list[list[int]], images: Sequence[Sequence[Any]] | None) -> list[tuple]:
        """Per prompt: (expanded ids, pixel_values or None, image_grid_thw or None)."""
        if images is not None and len(images) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(images)} image lists")
        requests = []
        for i, ids in enumerate(prompts):
            pixels, grid = self.image_inputs(images[i] if images is not None else [])
            grid_rows = grid.tolist() if grid is not None else []
            requests.append((expand_image_tokens(ids, grid_rows, self.image_token_id, self.merge_size), pixels, grid))
        return requests

    def _batch_inputs(self, requests: list[tuple], sequences: list[list[int]]) -> dict[str, Any]:
        """Left-padded ids and mask, the batch's images in row order (the order `masked_scatter` and
        `get_rope_index` consume them), and the image-token mask M-RoPE needs."""
        import torch

        input_ids, attention_mask = self._left_pad(sequences)
        inputs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "mm_token_type_ids": (input_ids == self.image_token_id).to(torch.int),
        }
        pixels = [r[1] for r in requests if r[1] is not None]
        if pixels:
            inputs["pixel_values"] = torch.cat(pixels).to(self.device, self.model.dtype)
            inputs["image_grid_thw"] = torch.cat([r[2] for r in requests if r[2] is not None]).to(self.device)
        return inputs

    def _generate_vl_batch(
        self, requests: list[tuple], seeds: list[int], temperature: float, top_p: float, max_new_tokens: int
    ) -> list[Completion]:
        import torch
        from transformers import LogitsProcessorList

        inputs = self._batch_inputs(requests, [r[0] for r in requests])
        processors = LogitsProcessorList()
        if temperature > 0:
            processors.append(RowSampler(seeds, temperature, top_p))
        out = self.model.generate(
            **inputs,
            do_sample=False,
            logits_processor=processors,
            max_new_tokens=max_new_tokens,
            output_logits=True,  # raw logits, before temperature / top-p
            return_dict_in_generate=True,
        )
        generated = out.sequences[:, inputs["input_ids"].shape[1] :]  # [B, T]
        logprobs = torch.empty(generated.shape, dtype=torch.float32)  # [B, T]
        for step, step_logits in enumerate(out.logits):  # each [B, V]
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

    def _score_vl_batch(self, requests: list[tuple], completions: list[list[int]]) -> list[list[float]]:
        import torch

        inputs = self._batch_inputs(requests, [r[0] + c for r, c in zip(requests, completions, strict=True)])
        # M-RoPE positions per row over its unpadded tokens (text: 0, 1, ...; an image: its t/h/w grid)
        position_ids, _ = self.model.model.get_rope_index(
            inputs["input_ids"],
            inputs.pop("mm_token_type_ids"),
            image_grid_thw=inputs.get("image_grid_thw"),
            attention_mask=inputs["attention_mask"],
        )  # [3, B, L]
        keep = max(len(c) for c in completions) + 1  # left padding: completions end at the last position
        logits = self.model(**inputs, position_ids=position_ids, logits_to_keep=keep, use_cache=False).logits
        scores = []
        for row, completion in enumerate(completions):
            n = len(completion)
            row_logits = logits[row, keep - 1 - n : keep - 1].float()  # [n, V]: the logits before each token
            target = torch.tensor(completion, device=row_logits.device).unsqueeze(-1)
            scores.append(torch.log_softmax(row_logits, dim=-1).gather(-1, target).squeeze(-1).tolist())
        return scores
