"""The memory plan of a vision-language policy (Qwen2.5-VL-3B on visual Sokoban) and the `qwen2.5-vl-3b-shape`
preset: parameter counts by hand and on the meta device, image patches as Qwen's processor makes them, the vision
tower's activations, the paper's 8×80 GB plan, and `seed model init` accepting the preset. Nothing is built: the
3.75B model only ever exists on the meta device."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from seedcli.engines import vision
from seedcli.rl.memory_plan import (
    CUDA_OVERHEAD_GIB,
    GIB,
    VLLM_GRAPH_POOL_GIB,
    Shape,
    image_patches,
    plan,
    vision_activation_bytes,
)

torch.set_num_threads(1)

VL3B_PARAMS = 3_754_622_976  # Qwen2.5-VL-3B-Instruct
REAL_BOUNDS = dict(min_pixels=vision.QWEN25_VL_MIN_PIXELS, max_pixels=vision.QWEN25_VL_MAX_PIXELS)


def test_the_3b_shape_counts_by_hand_and_on_the_meta_device():
    s = Shape.load("qwen2.5-vl-3b-shape")
    v = s.vision
    assert v is not None and (v.depth, v.hidden, v.intermediate, v.out_hidden) == (32, 1280, 3420, 2048)
    # a vision block: 2 norms 2·1280, qkv 3·1280² + 3·1280, proj 1280² + 1280, gate/up/down 3·1280·3420 + 2·3420 + 1280
    assert v.block_params == 2560 + 4_919_040 + 1_639_680 + 13_140_920 == 19_702_200
    # patch embedding 1280·3·2·14·14 (no bias); merger: ln_q 1280, 5120² + 5120, 5120·2048 + 2048
    assert v.root_params == 1_505_280 + 1280 + 26_219_520 + 10_487_808 == 38_213_888
    assert v.params == 32 * 19_702_200 + 38_213_888 == 668_684_288
    # text: q 2048² + 2048, k/v 2·(256·2048 + 256), o 2048², MLP 3·2048·11008, 2 norms; tied embeddings + final norm
    assert s.layer_params == 4_196_352 + 1_049_088 + 4_194_304 + 67_633_152 + 4096 == 77_076_992
    assert s.root_params == 151_936 * 2048 + 2048 + 38_213_888
    assert s.max_layer_params == s.layer_params  # a decoder layer outweighs a vision block: FSDP gathers ≤ 2 of them
    assert s.params == 36 * 77_076_992 + 32 * 19_702_200 + s.root_params == VL3B_PARAMS
    assert vision.parameter_count("qwen2.5-vl-3b-shape") == VL3B_PARAMS  # the meta-device count agrees


def test_a_vl_config_json_loads_nested_or_flat(tmp_path):
    nested = vision.vl_config("tiny-vl").to_dict()  # transformers 5 writes text settings under text_config
    (tmp_path / "config.json").write_text(json.dumps(nested))
    s = Shape.load(str(tmp_path))
    assert s.vision is not None and s.params == vision.parameter_count("tiny-vl")
    # Qwen's own config.json keeps the text settings at the top level and names the channels in_chans
    flat = {k: v for k, v in nested["text_config"].items()} | {"vision_config": dict(nested["vision_config"])}
    flat["vision_config"]["in_chans"] = flat["vision_config"].pop("in_channels")
    assert Shape.from_config(flat) == s
    text_only = {k: v for k, v in flat.items() if k != "vision_config"}
    assert Shape.from_config(text_only).vision is None
    assert Shape.from_config(text_only).params == s.params - s.vision.params


def test_image_patches_follow_qwens_smart_resize():
    # 96/28 = 3.4 → 3: 84×84 px (7,056 px, within [3,136, 12,845,056]) → 6×6 patches of 14 → 9 tokens after 2×2
    assert image_patches(96, 96, **REAL_BOUNDS) == 36
    # EZPoints' canvas: 300/28 = 10.7 → 11: 308×308 → 22×22 patches
    assert image_patches(300, 300, **REAL_BOUNDS) == 484
    # the tiny model's max_pixels 112² scales the canvas down: √(300²/112²) = 2.68 → floor(300/2.68/28)·28 = 84
    assert image_patches(300, 300, min_pixels=vision.TINY_MIN_PIXELS, max_pixels=vision.TINY_MAX_PIXELS) == 36
    processor = vision.image_processor(vision.QWEN25_VL_MIN_PIXELS, vision.QWEN25_VL_MAX_PIXELS)
    grid = processor(images=[np.zeros((96, 96, 3), np.uint8)], return_tensors="pt")["image_grid_thw"]
    assert grid.tolist() == [[1, 6, 6]]  # what the processor of the built preset makes of a Sokoban room


def test_vision_activations_by_hand():
    v = Shape.load("qwen2.5-vl-3b-shape").vision
    patches = 8 * 36
    # per patch and block: bf16 2·(8·1280 + 2·1280 + 4·3420) + fp32 norms 8·1280
    block = 2 * (10_240 + 2560 + 13_680) + 10_240
    assert block == 63_200
    # per patch outside the blocks: pixels 6·(3·2·14·14), merger norm 6·1280, merger linears and GELU 6·1280
    edge = 6 * 1176 + 6 * 1280 + 6 * 1280
    assert vision_activation_bytes(v, patches, False) == 32 * patches * block + patches * edge
    assert vision_activation_bytes(v, patches, True) == 32 * patches * 2 * 1280 + patches * (block + edge)
    text = Shape.load("qwen2.5-3b-shape")
    base = dict(gpus=8, micro_batch_tokens=16384, gradient_checkpointing=True, vllm_gpu_memory=0.3, card_gib=80)
    seen = plan(Shape.load("qwen2.5-vl-3b-shape"), images_per_micro_batch=8, patches_per_image=36, **base)
    blind = plan(Shape.load("qwen2.5-vl-3b-shape"), **base)
    extra = seen["phases_gib"]["update (forward+backward)"] - blind["phases_gib"]["update (forward+backward)"]
    assert extra == pytest.approx(vision_activation_bytes(v, patches, True) / GIB, rel=1e-9)
    # the text activations are the text model's: image tokens are already in micro_batch_tokens
    assert seen["activations_gib"] == plan(text, **base)["activations_gib"]


def test_the_paper_visual_sokoban_plan_fits_80gb_with_checkpointing_only():
    from seedcli.config import build_config

    cfg = build_config("rl", "sokoban/paper_qwen25vl_3b")
    assert (cfg.mini_batch, cfg.max_new_tokens, cfg.max_steps, cfg.gpus) == (64, 512, 15, 8)
    assert cfg.env_options["observation"] == "image" and cfg.gradient_checkpointing is True
    images = math.ceil(cfg.mini_batch / cfg.gpus)  # a rank's share of a mini-batch, one image a turn
    s = Shape.load("qwen2.5-vl-3b-shape")
    p = plan(s, gpus=8, micro_batch_tokens=cfg.micro_batch_tokens, gradient_checkpointing=True,
             vllm_gpu_memory=cfg.vllm_gpu_memory, card_gib=80, kl=cfg.kl_coef > 0, images_per_micro_batch=images,
             patches_per_image=36)  # fmt: skip
    assert all(p["fits"].values())
    assert p["update_gib"]["without checkpointing"] > 0.95 * 80  # 36 layers × 16,384 tokens of intermediates
    # the update peak by hand: fp32 master + grads + AdamW (16 B) and the bf16 reference (2 B) over 8 ranks,
    # root + 2 layers gathered in bf16, a layer's fp32 gradient, 3 fp32 logits chunks of 1024 × 151,936,
    # checkpointed text (36·16384·2·2048 + 16384·138,240) and vision activations (288 patches), the root group's
    # fp32 reduce-scatter buffer, vLLM's CUDA-graph pool (resident in sleep), CUDA overhead
    by_hand = (
        18 * VL3B_PARAMS / 8
        + 2 * (151_936 * 2048 + 2048 + 38_213_888 + 2 * 77_076_992)
        + 4 * 77_076_992
        + 12 * 1024 * 151_936
        + 36 * 16384 * 4096 + 16384 * 138_240
        + 32 * 288 * 2560 + 288 * (63_200 + 22_416)
        + 4 * (151_936 * 2048 + 2048 + 38_213_888)
        + VLLM_GRAPH_POOL_GIB * GIB
        + CUDA_OVERHEAD_GIB * GIB
    )  # fmt: skip
    assert p["phases_gib"]["update (forward+backward)"] == pytest.approx(by_hand / GIB, rel=1e-12)
    assert p["update_gib"]["with checkpointing"] == p["phases_gib"]["update (forward+backward)"]
    assert 19.3 < by_hand / GIB < 19.8


def test_images_need_a_vision_shape_and_patches():
    base = dict(gpus=8, micro_batch_tokens=16384, gradient_checkpointing=True, vllm_gpu_memory=0.3, card_gib=80)
    with pytest.raises(ValueError, match="vision-language shape"):
        plan(Shape.load("qwen2.5-3b-shape"), images_per_micro_batch=8, patches_per_image=36, **base)
    with pytest.raises(ValueError, match="patches_per_image"):
        plan(Shape.load("qwen2.5-vl-3b-shape"), images_per_micro_batch=8, **base)
    assert (
        "vision tower activations (checkpointed)" not in plan(Shape.load("qwen2.5-3b-shape"), **base)["components_gib"]
    )


def test_the_builder_parts_are_qwen25_vl_3bs():
    tokenizer, config, processor = vision.vl_parts("qwen2.5-vl-3b-shape")
    assert config.text_config.vocab_size == 151_936 and len(tokenizer) == 151_665  # Qwen's padded embedding rows
    assert config.image_token_id == tokenizer.convert_tokens_to_ids(vision.IMAGE_PAD) == 151_655
    assert (config.vision_start_token_id, config.vision_end_token_id, config.video_token_id) == (
        151_652,
        151_653,
        151_656,
    )
    assert (config.pad_token_id, config.eos_token_id) == (151_643, 151_645)  # <|endoftext|>, <|im_end|>
    text = tokenizer.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "go"}]}],
                                         tokenize=False, add_generation_prompt=True)  # fmt: skip
    assert "<|vision_start|><|image_pad|><|vision_end|>go<|im_end|>" in text
    assert (processor.size.shortest_edge, processor.size.longest_edge) == (3136, 12_845_056)
    assert (processor.patch_size, processor.merge_size, processor.temporal_patch_size) == (14, 2, 2)
    from transformers import Qwen2_5_VLForConditionalGeneration

    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(config)
    assert sum(p.numel() for p in model.parameters()) == VL3B_PARAMS
    assert Shape.from_config(config.to_dict()) == Shape.load("qwen2.5-vl-3b-shape")


def test_model_init_accepts_the_vl_shape_preset(tmp_path, monkeypatch):
    from seedcli.cli import app

    calls = []

    def fake_build(out, preset, seed=0, corpus=None):
        calls.append((out.name, preset, seed, corpus))
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")  # what the rename into place checks for
        return out

    monkeypatch.setattr(vision, "build_vl_model", fake_build)  # nothing of 7.5 GB is built
    out = tmp_path / "vl3b"
    result = CliRunner().invoke(app, ["model", "init", "--preset", "qwen2.5-vl-3b-shape", "--out", str(out)])
    assert result.exit_code == 0, result.output
    # built beside --out, then renamed into place; Qwen's tokenizer: no corpus to learn
    assert calls == [("model", "qwen2.5-vl-3b-shape", 0, None)] and (out / "config.json").is_file()
    help_text = CliRunner().invoke(app, ["model", "init", "--help"], env={"COLUMNS": "300"}).output
    assert "qwen2.5-vl-3b-shape" in help_text
    bad = CliRunner().invoke(app, ["model", "init", "--preset", "qwen2.5-vl-7b-shape", "--out", str(out)])
    assert bad.exit_code == 2 and "qwen2.5-vl-3b-shape" in bad.stderr and "tiny-vl" in bad.stderr
    warm = CliRunner().invoke(app, ["model", "init", "--preset", "qwen2.5-vl-3b-shape", "--out", str(out),
                                    "--warm-start", "expert"])  # fmt: skip
    assert warm.exit_code == 2 and "does not apply to --preset qwen2.5-vl-3b-shape" in warm.stderr
    assert len(calls) == 1
