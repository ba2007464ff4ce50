"""A tiny offline Qwen2.5-VL policy for tests and the CPU demo: random weights, the tiny BPE (or Qwen2.5's own)
tokenizer with Qwen's vision tokens, a chat template with image parts, and Qwen2-VL's image processor.

    build_tiny_vl_model("runs/models/tiny-vl", corpus=texts)      # 2 text layers, a 2-block vision tower
    tokenizer, image_processor = load_vl_processor("runs/models/tiny-vl")
    vl_shape_config("qwen2.5-vl-3b-shape")                        # Qwen2.5-VL-3B-Instruct's config, for memory plans

The saved directory loads with `Qwen2_5_VLForConditionalGeneration.from_pretrained`, `AutoTokenizer` and
`Qwen2VLImageProcessorPil` / `AutoImageProcessor`. No CPU torchvision is installable here, and
`Qwen2_5_VLProcessor` / `AutoProcessor` want it for their video half, so `load_vl_processor` returns the tokenizer
and the PIL image processor instead of a processor. A 96×96 image becomes 84×84 (rounded to 28) → 6×6 patches of
14 → 9 tokens after the 2×2 merge.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"

# Small pixel bounds for the tiny model: at most 112×112 pixels (16 tokens) per image, at least 56×56 (4 tokens).
TINY_MIN_PIXELS = 56 * 56
TINY_MAX_PIXELS = 112 * 112
# Qwen2.5-VL's own preprocessor_config.json bounds (the real model's shape uses them).
QWEN_MIN_PIXELS = 56 * 56
QWEN_MAX_PIXELS = 28 * 28 * 16384

# Text stack as tiny.py's TINY_SHAPE (head_dim 32); M-RoPE splits its 16 rotary frequencies into time, height and
# width sections (Qwen2.5-VL's [16, 24, 24] for head_dim 128, scaled by 1/4).
TINY_VL_TEXT: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.1,  # as tiny.py: at 0.02 greedy decoding repeats the prompt's last token
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [4, 6, 6]},
}
# Vision tower: 2 blocks of width 64, 2 heads of 32 (a head size SDPA and vLLM's vision attention take); block 1
# attends over the whole image, block 0 within windows, as the real tower alternates.
TINY_VL_VISION: dict[str, Any] = {
    "depth": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 2,
    "out_hidden_size": 128,  # = the text hidden size
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [1],
}
# Qwen2.5-VL-3B-Instruct's config.json (random weights only; for memory plans and GPU smoke runs).
VL_FULL_SHAPES: dict[str, dict[str, dict[str, Any]]] = {
    "qwen2.5-vl-3b-shape": {
        "text": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                     num_key_value_heads=2, vocab_size=151_936, tie_word_embeddings=True,
                     max_position_embeddings=128_000, rms_norm_eps=1e-6, initializer_range=0.02,
                     rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0,
                                      "mrope_section": [16, 24, 24]}),
        "vision": dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                       patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                       fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2),
    },
}  # fmt: skip
VL_SHAPES = ("tiny-vl", *VL_FULL_SHAPES)


def vl_shape_config(shape: str = "tiny-vl", vocab_size: int | None = None, token_ids: dict[str, int] | None = None):
    """The `Qwen2_5_VLConfig` of a shape. `token_ids` maps pad/eos/image/video/vision_start/vision_end to the
    tokenizer's ids (default: Qwen2.5's, 151643 ...); `vocab_size` overrides the shape's (the tiny BPE's rows)."""
    from transformers import Qwen2_5_VLConfig

    from seedcli.engines.tiny import QWEN_VOCAB_SIZE

    if shape == "tiny-vl":
        text, vision = dict(TINY_VL_TEXT), dict(TINY_VL_VISION)
        text["vocab_size"] = QWEN_VOCAB_SIZE
    elif shape in VL_FULL_SHAPES:
        text, vision = dict(VL_FULL_SHAPES[shape]["text"]), dict(VL_FULL_SHAPES[shape]["vision"])
    else:
        raise ValueError(f"unknown vision-language shape {shape!r}; use one of {', '.join(VL_SHAPES)}")
    if vocab_size is not None:
        text["vocab_size"] = vocab_size
    ids = {"pad": 151_643, "eos": 151_645, "image": 151_655, "video": 151_656, "start": 151_652, "end": 151_653}
    ids.update(token_ids or {})
    config = Qwen2_5_VLConfig(
        text_config=dict(
            **text,
            bos_token_id=ids["pad"],
            eos_token_id=ids["eos"],
            pad_token_id=ids["pad"],
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=int(text["num_hidden_layers"]),
        ),
        vision_config=vision,
        image_token_id=ids["image"],
        video_token_id=ids["video"],
        vision_start_token_id=ids["start"],
        vision_end_token_id=ids["end"],
        tie_word_embeddings=bool(text["tie_word_embeddings"]),
    )
    config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    return config


def vl_parameter_count(shape: str = "qwen2.5-vl-3b-shape") -> dict[str, int]:
    """Parameters of a shape counted on the meta device (nothing allocated): total (a tied lm_head counted once),
    vision tower, text stack."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(vl_shape_config(shape))
    vision = sum(p.numel() for p in model.model.visual.parameters())
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once
    return {"total": total, "vision": vision, "text": total - vision}


def vl_chat_template() -> str:
    """tiny.py's Qwen2.5 chat template with list contents rendered part by part: an image part as
    `<|vision_start|><|image_pad|><|vision_end|>` (as Qwen2.5-VL's template writes it), a video part with
    `<|video_pad|>`, a text part as its text. String contents render exactly as the text template renders them
    (so the default system prompt stays Qwen2.5's, not Qwen2.5-VL's "You are a helpful assistant.")."""
    from seedcli.engines.tiny import qwen_chat_template

    macro = (
        "{%- macro render_content(content) -%}"
        "{%- if content is string -%}{{- content -}}"
        "{%- else -%}{%- for part in content -%}"
        "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
        f"{{{{- '{VISION_START}{IMAGE_PAD}{VISION_END}' -}}}}"
        "{%- elif part['type'] == 'video' or 'video' in part -%}"
        f"{{{{- '{VISION_START}{VIDEO_PAD}{VISION_END}' -}}}}"
        "{%- elif 'text' in part -%}{{- part['text'] -}}"
        "{%- endif -%}{%- endfor -%}{%- endif -%}"
        "{%- endmacro -%}\n"
    )
    template = qwen_chat_template()
    for old, new in (
        ("messages[0]['content']", "render_content(messages[0]['content'])"),
        ("message.content", "render_content(message.content)"),
    ):
        if old not in template:
            raise ValueError(f"the Qwen2.5 chat template changed: {old!r} not found; update vl_chat_template")
        template = template.replace(old, new)
    # `{%- if render_content(message.content) %}` would also work, but the plain truth test reads the original
    template = template.replace("{%- if render_content(message.content) %}", "{%- if message.content %}")
    return macro + template


def tiny_image_processor(min_pixels: int = TINY_MIN_PIXELS, max_pixels: int = TINY_MAX_PIXELS):
    """Qwen2-VL's image processor on the PIL backend (no torchvision), patch 14, merge 2, temporal patch 2."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        min_pixels=min_pixels, max_pixels=max_pixels, patch_size=14, merge_size=2, temporal_patch_size=2
    )


def build_tiny_vl_model(
    out_dir: str | os.PathLike,
    seed: int = 0,
    corpus: Iterable[str] | None = None,
    shape: str = "tiny-vl",
) -> Path:
    """Build a random-weight `Qwen2_5_VLForConditionalGeneration` and save it in Hugging Face format with its
    tokenizer (`tokenizer.json`, with `vl_chat_template()`) and image processor (`preprocessor_config.json`).

    "tiny-vl": tiny.py's byte-level BPE trained on the chat boilerplate + `corpus` (rows rounded up to 64), the
    tiny text stack, a 2-block vision tower, pixel bounds 56²..112², fp32. "qwen2.5-vl-3b-shape": Qwen2.5's own
    tokenizer and Qwen2.5-VL-3B's shape and pixel bounds in bf16, initialised on the GPU where there is one
    (`corpus` unused). Returns the model directory."""
    import torch
    from transformers import GenerationConfig, Qwen2_5_VLForConditionalGeneration

    from seedcli.engines.tiny import EOS_TOKEN, PAD_TOKEN, _round_up, build_qwen_tokenizer, build_tiny_tokenizer

    if shape not in VL_SHAPES:
        raise ValueError(f"unknown vision-language shape {shape!r}; use one of {', '.join(VL_SHAPES)}")
    full = shape in VL_FULL_SHAPES
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_qwen_tokenizer() if full else build_tiny_tokenizer(list(corpus) if corpus is not None else None)
    tokenizer.chat_template = vl_chat_template()
    ids = {
        key: tokenizer.convert_tokens_to_ids(token)
        for key, token in (
            ("pad", PAD_TOKEN),
            ("eos", EOS_TOKEN),
            ("image", IMAGE_PAD),
            ("video", VIDEO_PAD),
            ("start", VISION_START),
            ("end", VISION_END),
        )
    }
    config = vl_shape_config(shape, vocab_size=None if full else _round_up(len(tokenizer), 64), token_ids=ids)
    with torch.random.fork_rng(devices=[]):  # seeding must not disturb the caller's global RNG stream
        torch.manual_seed(seed)
        if full:
            device = "cuda" if torch.cuda.is_available() else "cpu"
            default = torch.get_default_dtype()
            torch.set_default_dtype(torch.bfloat16)
            try:
                with torch.device(device):
                    model = Qwen2_5_VLForConditionalGeneration(config)
            finally:
                torch.set_default_dtype(default)
            model = model.to("cpu")
        else:
            model = Qwen2_5_VLForConditionalGeneration(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["pad"], eos_token_id=[ids["eos"], ids["pad"]], pad_token_id=ids["pad"]
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    bounds = (QWEN_MIN_PIXELS, QWEN_MAX_PIXELS) if full else (TINY_MIN_PIXELS, TINY_MAX_PIXELS)
    tiny_image_processor(*bounds).save_pretrained(out)
    return out


def load_vl_processor(path: str | os.PathLike) -> tuple[Any, Any]:
    """(tokenizer, image processor) of a vision-language model directory, without torchvision: the image processor
    is always `Qwen2VLImageProcessorPil` read from `preprocessor_config.json`, so preprocessing is the same with or
    without torchvision installed."""
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    path = Path(path)
    if not (path / "preprocessor_config.json").is_file():
        raise FileNotFoundError(f"{path}: no preprocessor_config.json (a vision-language model's image processor)")
    return AutoTokenizer.from_pretrained(path), Qwen2VLImageProcessorPil.from_pretrained(path)
