"""The tiny vision-language policy (a random Qwen2.5-VL built in code) on the hf engine: image tokens, the chat
template's image parts, generation and scoring with images, and the 3B shape's size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seedcli.engines.vision import (
    IMAGE_PAD,
    build_tiny_vl_model,
    expand_image_tokens,
    load_image_processor,
    parameter_count,
    vision_inputs,
)

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    return build_tiny_vl_model(
        tmp_path_factory.mktemp("tiny-vl"), seed=0, corpus=["<think>go</think><action>up</action>"]
    )


@pytest.fixture(scope="module")
def engine(vl_dir):
    from seedcli.engines import load_engine

    eng = load_engine("hf", vl_dir, device="cpu")
    yield eng
    eng.close()


def _room(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(96, 96, 3), dtype=np.uint8)


def _prompt(engine, text: str = "Look: <image>\nWhich way?") -> list[int]:
    from seedcli.engines.base import content_parts

    return engine.render([{"role": "user", "content": content_parts(text)}])


def test_a_96px_room_is_nine_tokens_and_the_template_writes_one_pad_per_image(vl_dir, engine):
    processor = load_image_processor(vl_dir)
    batch = vision_inputs(processor, [[_room(0)], [], [_room(1), _room(2)]])
    assert batch.tokens == [[9], [], [9, 9]]
    assert tuple(batch.image_grid_thw.shape) == (3, 3) and batch.pixel_values.shape[0] == 3 * 36
    ids = _prompt(engine)
    pad = engine.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    assert pad == engine.model.config.image_token_id and ids.count(pad) == 1
    text = engine.tokenizer.decode(ids)
    assert "<|vision_start|><|image_pad|><|vision_end|>" in text and text.endswith("<|im_start|>assistant\n")
    assert expand_image_tokens(ids, pad, [9]).count(pad) == 9
    with pytest.raises(ValueError, match="1 image placeholder"):
        expand_image_tokens(ids, pad, [9, 9])
    # a text-only message renders as plain text (no vision tokens)
    assert pad not in engine.render([{"role": "user", "content": "no image"}])


def test_generation_with_images_is_per_request_and_sees_the_image(engine):
    ids = _prompt(engine)
    kw = dict(temperature=1.0, max_new_tokens=6)
    alone = [engine.generate([ids], seeds=[s], images=[[_room(s)]], **kw)[0] for s in (1, 2, 3)]
    together = engine.generate([ids] * 3, seeds=[1, 2, 3], images=[[_room(1)], [_room(2)], [_room(3)]], **kw)
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]
    assert (
        max(
            abs(a - b)
            for x, y in zip(alone, together, strict=True)
            for a, b in zip(x.logprobs, y.logprobs, strict=True)
        )
        < 1e-4
    )
    with pytest.raises(ValueError, match="placeholder"):
        engine.generate([ids], seeds=[1], images=[[]], **kw)


def test_score_is_the_forward_log_prob_and_depends_on_the_image(engine):
    ids = _prompt(engine)
    done = engine.generate([ids], seeds=[7], images=[[_room(7)]], temperature=1.0, max_new_tokens=5)[0]
    scored = engine.score([ids], [done.token_ids], images=[[_room(7)]])[0]
    assert np.allclose(scored, done.logprobs, atol=1e-4)  # the sampler's raw log-probs are the forward's
    other = engine.score([ids], [done.token_ids], images=[[_room(8)]])[0]
    assert max(abs(a - b) for a, b in zip(scored, other, strict=True)) > 1e-4  # another picture, other log-probs


def test_text_only_engines_refuse_images(tmp_path):
    from seedcli.engines import load_engine
    from seedcli.engines.tiny import build_tiny_model

    eng = load_engine("hf", build_tiny_model(tmp_path / "t", corpus=["hi"]), device="cpu")
    try:
        assert eng.vision is False
        with pytest.raises(ValueError, match="no vision tower"):
            eng.generate([[1, 2]], seeds=[0], images=[[_room(0)]], temperature=1.0, max_new_tokens=2)
    finally:
        eng.close()


def test_the_3b_shape_has_qwen25_vl_3bs_size():
    assert 3.70e9 < parameter_count("qwen2.5-vl-3b-shape") < 3.80e9  # 3,754,622,976 (Qwen2.5-VL-3B-Instruct)


def test_a_vlm_never_writes_an_image_placeholder(engine):
    # a placeholder in a response would take an image's place when the turn is re-scored (the tiny-VL pipeline
    # once stopped on "image features and image tokens do not match" this way)
    ids = _prompt(engine)
    out = engine.generate([ids] * 4, seeds=[0, 1, 2, 3], images=[[_room(i)] for i in range(4)], temperature=3.0,
                          max_new_tokens=100)  # fmt: skip
    banned = set(engine.suppress_ids)
    assert banned == {engine.model.config.image_token_id, engine.model.config.video_token_id}
    assert sum(len(c.token_ids) for c in out) > 100 and not banned & {t for c in out for t in c.token_ids}


def test_scoring_places_image_tokens_with_3d_positions(engine):
    """Qwen2.5-VL's M-RoPE gives image tokens (time, height, width) positions; transformers 5 computes them only
    when told which tokens are image tokens. The engine's scores equal a forward with the positions transformers'
    `get_rope_index` gives, and differ from the plain 1-D positions a forward falls back to without them."""
    ids = _prompt(engine)
    done = engine.generate([ids], seeds=[5], images=[[_room(5)]], temperature=1.0, max_new_tokens=6)[0]
    scored = torch.tensor(engine.score([ids], [done.token_ids], images=[[_room(5)]])[0])
    pad = engine.model.config.image_token_id
    batch = vision_inputs(engine.image_processor, [[_room(5)]])
    prompt = expand_image_tokens(ids, pad, batch.tokens[0])
    x = torch.tensor([prompt + done.token_ids])
    vision = {"pixel_values": batch.pixel_values, "image_grid_thw": batch.image_grid_thw}

    def logp(**kw):
        with torch.no_grad():
            logits = engine.model(input_ids=x, use_cache=False, **vision, **kw).logits[0].float()
        rows = logits[len(prompt) - 1 : -1].log_softmax(-1)
        return rows.gather(-1, torch.tensor(done.token_ids).unsqueeze(-1)).squeeze(-1)

    positions, _ = engine.model.model.get_rope_index(
        x, image_grid_thw=batch.image_grid_thw, attention_mask=torch.ones_like(x), mm_token_type_ids=(x == pad).int()
    )
    assert not torch.equal(positions[0, 0], torch.arange(x.shape[1]))  # the 9 image tokens do not take 9 steps
    assert torch.allclose(scored, logp(position_ids=positions), atol=1e-4)
    assert (scored - logp()).abs().max() > 1e-3  # without the image token types: 1-D positions, other log-probs


def test_grouped_attention_gives_sdpas_tokens_on_the_vlm(vl_dir, engine):
    """The engine's grouped-query attention (Qwen2.5-VL's text decoder groups its heads; the vision tower does not)
    samples what transformers' sdpa samples, on a padded batch of two prompts of different lengths."""
    from seedcli.engines import load_engine
    from seedcli.engines.attention import GROUPED_SDPA

    assert engine.model.config.text_config._attn_implementation == GROUPED_SDPA
    assert engine.model.config.text_config.num_attention_heads > engine.model.config.text_config.num_key_value_heads
    plain = load_engine("hf", vl_dir, device="cpu", attn_implementation="sdpa")
    short = _prompt(engine)
    long = engine.render(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Push the box left, then up. " * 4}]}]
    )
    kw = dict(seeds=[4, 5], images=[[_room(4)], [_room(5)]], temperature=1.0, max_new_tokens=8)
    grouped, reference = engine.generate([short, long], **kw), plain.generate([short, long], **kw)
    plain.close()
    assert [c.token_ids for c in grouped] == [c.token_ids for c in reference]
    gaps = [
        abs(a - b) for x, y in zip(grouped, reference, strict=True) for a, b in zip(x.logprobs, y.logprobs, strict=True)
    ]
    assert gaps and max(gaps) < 1e-4
