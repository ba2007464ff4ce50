"""Vision-language policies (Qwen2.5-VL): a tiny one built in code, its image processor, and the model inputs of
prompts that carry images.

    build_tiny_vl_model("runs/models/tiny-vl", corpus=texts)   # random Qwen2.5-VL, offline BPE, image processor
    build_vl_model("runs/models/vl3b", "qwen2.5-vl-3b-shape")  # Qwen2.5-VL-3B's shape, bf16, Qwen's tokenizer
    processor = load_image_processor("runs/models/tiny-vl")    # Qwen2VLImageProcessorPil (no torchvision needed)
    batch = vision_inputs(processor, [[pixels], []])           # pixel_values, image_grid_thw, tokens per image

A prompt's ids hold ONE image-pad token per image (what the chat template writes for an image part, and what vLLM
expects); `expand_image_tokens` widens each to the image's merged-patch count before a transformers forward, as
Qwen2.5-VL's processor does. No CPU torchvision is reachable, and `Qwen2_5_VLProcessor`/`AutoProcessor` want it for
their video half: this module uses the PIL image processor alone. Knows no environment.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seedcli.engines.tiny import (
    EOS_TOKEN,
    PAD_TOKEN,
    QWEN_VOCAB_SIZE,
    _round_up,
    build_qwen_tokenizer,
    build_tiny_tokenizer,
)

IMAGE_PAD = "<|image_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
VIDEO_PAD = "<|video_pad|>"

# Qwen2-VL's chat template (as Qwen2.5-VL-Instruct ships it): an image part renders as
# <|vision_start|><|image_pad|><|vision_end|>; a string content renders as the text chat template does.
VL_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Small pixel bounds: a 96×96 Sokoban room stays 96×96 → 84×84 after rounding to 28 → 6×6 patches of 14 → 9 tokens
# after the 2×2 merge; EZPoints' 300×300 canvas is scaled down under the 112×112 bound (to 84×84: 9 tokens).
TINY_MIN_PIXELS = 56 * 56
TINY_MAX_PIXELS = 112 * 112
# Qwen2.5-VL-Instruct's own bounds (its preprocessor_config.json): a 96×96 room is 84×84 → 36 patches → 9 tokens.
QWEN25_VL_MIN_PIXELS = 3136
QWEN25_VL_MAX_PIXELS = 12_845_056

TINY_VL_TEXT: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.1,
    # head_dim 32: the three M-RoPE sections (time, height, width) split its 16 frequencies
    "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
}
TINY_VL_VISION: dict[str, Any] = {
    "depth": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 2,
    "out_hidden_size": 128,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [1],
}
# Qwen2.5-VL-3B-Instruct's shape (its config.json), for memory plans and GPU checks; never built on CPU.
QWEN25_VL_3B_SHAPE: dict[str, dict[str, Any]] = {
    "text": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                 num_key_value_heads=2, vocab_size=151_936, tie_word_embeddings=True, max_position_embeddings=128000,
                 rms_norm_eps=1e-6, rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]}),
    "vision": dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                   patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                   fullatt_block_indexes=[7, 15, 23, 31]),
}  # fmt: skip
VL_PRESETS = ("tiny-vl", "qwen2.5-vl-3b-shape")


def vl_config(shape: str = "tiny-vl", vocab_size: int | None = None, token_ids: dict[str, int] | None = None):
    """The Qwen2_5_VLConfig of a preset (`token_ids`: image/video/vision start/end ids of the tokenizer)."""
    from transformers import Qwen2_5_VLConfig

    if shape == "tiny-vl":
        text, vision = dict(TINY_VL_TEXT), dict(TINY_VL_VISION)
    elif shape == "qwen2.5-vl-3b-shape":
        text, vision = dict(QWEN25_VL_3B_SHAPE["text"]), dict(QWEN25_VL_3B_SHAPE["vision"])
    else:
        raise ValueError(f"unknown vision-language preset {shape!r}; use one of {', '.join(VL_PRESETS)}")
    if vocab_size is not None:
        text["vocab_size"] = vocab_size
    ids = token_ids or {"image": 151_655, "video": 151_656, "start": 151_652, "end": 151_653}
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["image"],
        video_token_id=ids["video"],
        vision_start_token_id=ids["start"],
        vision_end_token_id=ids["end"],
    )
    config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    return config


def parameter_count(shape: str = "qwen2.5-vl-3b-shape") -> int:
    """Parameters of a preset, counted on the meta device (nothing is allocated)."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(vl_config(shape))
    return sum(p.numel() for p in model.parameters())


def image_processor(min_pixels: int = TINY_MIN_PIXELS, max_pixels: int = TINY_MAX_PIXELS):
    """Qwen2.5-VL's image processor (PIL backend) with the given pixel bounds (default: the tiny model's)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        min_pixels=min_pixels, max_pixels=max_pixels, patch_size=14, merge_size=2, temporal_patch_size=2
    )


def tiny_image_processor():
    """Qwen2.5-VL's image processor (PIL backend) with the tiny model's pixel bounds."""
    return image_processor(TINY_MIN_PIXELS, TINY_MAX_PIXELS)


def vl_parts(preset: str = "tiny-vl", corpus: Iterable[str] | None = None):
    """What `build_vl_model` saves besides the weights: (tokenizer, Qwen2_5_VLConfig, image processor).

    tiny-vl: the tiny BPE trained on `corpus`, the tiny shape, small pixel bounds. qwen2.5-vl-3b-shape: Qwen2.5's
    own tokenizer (151,936 embedding rows), Qwen2.5-VL-3B-Instruct's shape and its processor's bounds. Both carry
    Qwen2-VL's chat template and the vision tokens' ids; building these costs seconds, no weights are made."""

    if preset not in VL_PRESETS:
        raise ValueError(f"unknown vision-language preset {preset!r}; use one of {', '.join(VL_PRESETS)}")
    tiny = preset == "tiny-vl"
    tokenizer = build_tiny_tokenizer(list(corpus) if corpus is not None else None) if tiny else build_qwen_tokenizer()
    tokenizer.chat_template = VL_CHAT_TEMPLATE
    ids = {
        key: tokenizer.convert_tokens_to_ids(token)
        for key, token in (("image", IMAGE_PAD), ("video", VIDEO_PAD), ("start", VISION_START), ("end", VISION_END))
    }
    pad_id, eos_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN), tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    vocab_size = _round_up(len(tokenizer), 64) if tiny else QWEN_VOCAB_SIZE
    config = vl_config(preset, vocab_size=vocab_size, token_ids=ids)
    for cfg in (config, config.text_config):  # both levels carry them in transformers 5
        cfg.bos_token_id = cfg.pad_token_id = pad_id
        cfg.eos_token_id = eos_id
    bounds = (TINY_MIN_PIXELS, TINY_MAX_PIXELS) if tiny else (QWEN25_VL_MIN_PIXELS, QWEN25_VL_MAX_PIXELS)
    return tokenizer, config, image_processor(*bounds)


def build_vl_model(
    out_dir: str | os.PathLike, preset: str = "tiny-vl", seed: int = 0, corpus: Iterable[str] | None = None
) -> Path:
    """A random-weight Qwen2.5-VL of a preset (`vl_parts`) saved in Hugging Face format with its tokenizer, chat
    template and preprocessor_config.json. tiny-vl is fp32; a *-shape preset is bf16 as Qwen ships it (3.75B
    parameters: ~7.5 GB on disk and in RAM; initialised on a GPU when there is one, minutes on a CPU)."""
    import torch
    from transformers import GenerationConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer, config, processor = vl_parts(preset, corpus)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pad_id, eos_id = config.pad_token_id, config.eos_token_id
    # fork_rng: seeding must not disturb the caller's global RNG stream
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if preset == "tiny-vl":
            model = Qwen2_5_VLForConditionalGeneration(config).to(torch.float32)
        else:
            device = "cuda" if torch.cuda.is_available() else "cpu"
            default = torch.get_default_dtype()
            torch.set_default_dtype(torch.bfloat16)
            try:
                with torch.device(device):
                    model = Qwen2_5_VLForConditionalGeneration(config)
            finally:
                torch.set_default_dtype(default)
            model = model.to("cpu")
    model.generation_config = GenerationConfig(bos_token_id=pad_id, eos_token_id=[eos_id, pad_id], pad_token_id=pad_id)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def build_tiny_vl_model(out_dir: str | os.PathLike, seed: int = 0, corpus: Iterable[str] | None = None) -> Path:
    """A random-weight Qwen2.5-VL (2 text layers, a 2-block vision tower) with the tiny BPE tokenizer (Qwen's vision
    tokens included), Qwen2-VL's chat template and a small-bounds image processor, saved in Hugging Face format."""
    return build_vl_model(out_dir, "tiny-vl", seed=seed, corpus=corpus)


def load_image_processor(model_dir: str | os.PathLike):
    """The model's image processor (its preprocessor_config.json) on the PIL backend, without torchvision."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    if not (Path(model_dir) / "preprocessor_config.json").is_file():
        raise FileNotFoundError(f"{model_dir}: no preprocessor_config.json (the vision model's image processor)")
    return Qwen2VLImageProcessorPil.from_pretrained(str(model_dir))


def pixel_bounds(processor: Any) -> tuple[int, int]:
    """(min_pixels, max_pixels) of a Qwen2-VL image processor (its `size` shortest / longest edge)."""
    size = processor.size
    return int(size["shortest_edge"]), int(size["longest_edge"])


def with_max_pixels(processor: Any, max_pixels: int | None) -> Any:
    """`processor` with its max_pixels lowered to `max_pixels` (None: unchanged), never below its min_pixels."""
    if max_pixels is None:
        return processor
    low, high = pixel_bounds(processor)
    return image_processor(low, max(low, min(high, int(max_pixels))))


def processor_size(processor: Any, height: int, width: int) -> tuple[int, int]:
    """(height, width) the processor resizes an image of this size to: Qwen2-VL's `smart_resize`, a multiple of
    patch × merge within its pixel bounds (a 96×96 Sokoban room becomes 84×84)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    low, high = pixel_bounds(processor)
    factor = int(processor.patch_size) * int(processor.merge_size)
    return smart_resize(int(height), int(width), factor=factor, min_pixels=low, max_pixels=high)


def image_tokens(processor: Any, height: int, width: int) -> int:
    """Tokens an image of this size takes in the prompt (merged patches of its `processor_size`)."""
    h, w = processor_size(processor, height, width)
    patch, merge = int(processor.patch_size), int(processor.merge_size)
    return (h // patch) * (w // patch) // (merge * merge)


def request_tokens(ids: Sequence[int], images: Sequence[Any], processor: Any) -> int:
    """Tokens of a request once each image's single placeholder is widened to its tokens (what vLLM and the trainer
    count); `images` are uint8 H×W×3 arrays or PIL images."""
    extra = 0
    for image in images:
        height, width = (image.height, image.width) if hasattr(image, "height") else image.shape[:2]
        extra += image_tokens(processor, height, width) - 1
    return len(ids) + extra


def fit_image(image: Any, processor: Any):
    """The RGB image at `processor_size`, resized as the PIL processor resizes it (PIL bicubic on uint8), so a
    processor on another backend (vLLM's torchvision one, whose resampling differs) has nothing left to resize and
    both see the same pixels; the PIL processor gives the same pixel values for it as for `image`."""
    from PIL import Image

    picture = image if isinstance(image, Image.Image) else Image.fromarray(image, "RGB")
    picture = picture.convert("RGB")
    height, width = processor_size(processor, picture.height, picture.width)
    if (height, width) == (picture.height, picture.width):
        return picture
    return picture.resize((width, height), resample=Image.Resampling(int(processor.resample)))


@dataclass
class VisionBatch:
    """What a Qwen2.5-VL forward needs besides the ids: the images' patches and grids, and their token counts."""

    pixel_values: Any  # [Σ patches, C·T·P·P] float tensor, or None without images
    image_grid_thw: Any  # [images, 3] long tensor, or None
    tokens: list[list[int]]  # per request, per image: merged-patch tokens (grid t·h·w / merge²)


def vision_inputs(processor: Any, images: Sequence[Sequence[Any]]) -> VisionBatch:
    """The images of a batch of requests (`images[i]`: request i's uint8 H×W×3 arrays or PIL images, in placeholder
    order) processed together, in request order."""
    import torch

    flat = [im for request in images for im in request]
    if not flat:
        return VisionBatch(None, None, [[] for _ in images])
    out = processor(images=flat, return_tensors="pt")
    grid = out["image_grid_thw"].to(torch.long)
    merge = int(getattr(processor, "merge_size", 2))
    counts = [int(g.prod()) // (merge * merge) for g in grid]
    tokens, k = [], 0
    for request in images:
        tokens.append(counts[k : k + len(request)])
        k += len(request)
    return VisionBatch(out["pixel_values"], grid, tokens)


def expand_image_tokens(ids: Sequence[int], image_token_id: int, tokens: Sequence[int]) -> list[int]:
    """`ids` with the k-th image-pad token repeated `tokens[k]` times (Qwen2.5-VL's processor expansion). The number
    of image-pad tokens must equal the number of images."""
    found = sum(1 for t in ids if t == image_token_id)
    if found != len(tokens):
        raise ValueError(f"the prompt holds {found} image placeholder(s) but {len(tokens)} image(s) came with it")
    out: list[int] = []
    k = 0
    for t in ids:
        if t == image_token_id:
            out.extend([image_token_id] * int(tokens[k]))
            k += 1
        else:
            out.append(t)
    return out
