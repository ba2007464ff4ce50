"""The visual analysis prompt (the SEED code's `seed_visual` version): every step's observation is an image
placeholder, the images travel with the prompt — as OpenAI `image_url` data URLs to an HTTP analyzer, as the
engine's images to the policy analyzer — and a cut prompt drops the oldest steps together with their images."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seedcli.analyzers import analysis_messages, image_parts, png_of_part, request_key
from seedcli.analyzers.policy import analyze_with_engine, engine_messages
from seedcli.envs.base import encode_png
from seedcli.envs.sokoban.game import Sokoban
from seedcli.envs.sokoban.prompt import ANALYSIS_DESCRIPTION
from seedcli.images import ImageStore, decode_png
from seedcli.prompts import (
    ANALYSIS_PROMPT_VERSION,
    ANALYSIS_VISUAL_PROMPT_VERSION,
    IMAGE_PLACEHOLDER,
    analysis_images,
    analysis_version,
    render_trajectory_analysis,
)
from seedcli.records import Trajectory, Turn

torch.set_num_threads(1)

MOVES = ["up", "down", "left", "right"]


def played(seed: int, moves: list[int], store: ImageStore | None, *, drop_image: int | None = None) -> Trajectory:
    """A Sokoban episode of `moves` (1 up … 4 right), each turn's image in `store` (None: a text episode)."""
    game = Sokoban(seed)
    turns = []
    for i, action in enumerate(moves, start=1):
        image = store.put(encode_png(game.image())) if store is not None and i != drop_image else None
        observation = game.text()
        game.step(action)
        reply = f"<think>push {MOVES[action - 1]} <image> now</think><action>{MOVES[action - 1]}</action>"
        turns.append(
            Turn(step=i, observation=observation, admissible=[], prompt=f"p{i}", response=reply,
                 action=MOVES[action - 1], valid=True, image=image)  # fmt: skip
        )
    return Trajectory(
        episode_id=f"s{seed}", group_id="g", task_id=str(seed), split="train", category="sokoban", env="sokoban",
        task="push all the boxes", turns=turns, won=False, reward=0.0, length=len(turns), engine="hf",
        model_id="m", model_hash="h", sampling={}, prompt_version="v", seed=seed,
    )  # fmt: skip


def test_each_step_is_an_image_placeholder_in_order():
    store = ImageStore(None)
    traj = played(3, [1, 4, 2, 3], store)
    prompt = render_trajectory_analysis(traj, description=ANALYSIS_DESCRIPTION)
    assert analysis_version(traj) == ANALYSIS_VISUAL_PROMPT_VERSION
    assert prompt.count(IMAGE_PLACEHOLDER) == 4 == prompt.count(f"Observation: {IMAGE_PLACEHOLDER}\n")
    assert "[image] now" in prompt  # a placeholder the model wrote is no image
    assert traj.turns[0].observation not in prompt  # the text grid is not shown: the images are the observation
    assert "Each step's observation is the image the agent saw at that step." in prompt
    assert analysis_images(traj, prompt) == [t.image for t in traj.turns]

    cut = render_trajectory_analysis(traj, len(prompt) - 1, description=ANALYSIS_DESCRIPTION)
    assert "[1 earlier step(s) omitted]" in cut and cut.count(IMAGE_PLACEHOLDER) == 3
    assert analysis_images(traj, cut) == [t.image for t in traj.turns[1:]]  # the oldest step's image went with it


def test_a_text_episode_keeps_the_text_prompt_and_a_half_visual_one_is_refused():
    text = played(3, [1, 4], None)
    assert analysis_version(text) == ANALYSIS_PROMPT_VERSION
    prompt = render_trajectory_analysis(text, description=ANALYSIS_DESCRIPTION)
    assert text.turns[0].observation in prompt and analysis_images(text, prompt) == []
    with pytest.raises(ValueError, match="step 2 has no observation image"):
        analysis_version(played(3, [1, 4, 2], ImageStore(None), drop_image=2))


def test_images_go_as_data_urls_in_placeholder_order_and_come_back_as_pixels():
    store = ImageStore(None)
    traj = played(5, [1, 2, 3], store)
    prompt = render_trajectory_analysis(traj, description=ANALYSIS_DESCRIPTION)
    pngs = [store.load(sha) for sha in analysis_images(traj, prompt)]
    messages = analysis_messages(prompt, images=pngs)
    parts = messages[0]["content"]
    assert [p["type"] for p in parts].count("image_url") == 3
    assert [png_of_part(p) for p in parts if p["type"] == "image_url"] == pngs
    assert "".join(p["text"] if p["type"] == "text" else IMAGE_PLACEHOLDER for p in parts) == prompt

    retry = analysis_messages(prompt, "not json", 600, images=pngs)  # the retry keeps the images of the first turn
    assert retry[0] == messages[0] and [m["role"] for m in retry] == ["user", "assistant", "user"]

    local, images = engine_messages(retry)
    assert [p for p in local[0]["content"] if p["type"] == "image"] == [{"type": "image"}] * 3
    assert all(np.array_equal(a, decode_png(b)) for a, b in zip(images, pngs, strict=True))

    with pytest.raises(ValueError, match="2 image placeholder"):
        image_parts("a <image> b <image>", pngs)


def test_the_cache_key_covers_the_images():
    base = ("openai", "m", ANALYSIS_VISUAL_PROMPT_VERSION, "Step 1 <image>", 0.0, 64)
    assert request_key(*base, ["a" * 64]) != request_key(*base, ["b" * 64])
    assert request_key(*base) == request_key(*base, [])  # a text prompt's key is what it always was


class RecordingEngine:
    """A real hf engine that records the images each generate call was given (what the model saw)."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []
        self.vision = engine.vision

    def render(self, messages):
        return self.engine.render(messages)

    def generate(self, prompts, **kw):
        self.calls.append((prompts, kw.get("images")))
        return self.engine.generate(prompts, **kw)


def test_the_policy_analyzer_sees_every_step_image(tmp_path):
    from seedcli.engines import load_engine
    from seedcli.engines.vision import build_tiny_vl_model
    from seedcli.envs import template_texts

    model = build_tiny_vl_model(tmp_path / "vl", corpus=template_texts())
    engine = RecordingEngine(load_engine("hf", model, device="cpu"))
    store = ImageStore(tmp_path / "images")
    trajs = [played(7, [1, 4], store), played(8, [2, 3, 1], store)]
    parsed = analyze_with_engine(engine, trajs, 8, images=store)
    assert len(parsed) == 2
    prompts, images = engine.calls[0]
    for ids, shown, traj in zip(prompts, images, trajs, strict=True):
        assert ids.count(engine.engine.image_token_id) == len(traj.turns)  # one image part per step
        assert all(np.array_equal(a, store.pixels(t.image)) for a, t in zip(shown, traj.turns, strict=True))
    with pytest.raises(ValueError, match="needs the run's images"):
        analyze_with_engine(engine, trajs[:1], 8)
    engine.engine.close()


def test_a_text_model_cannot_analyse_images(tmp_path):
    from seedcli.analyzers.policy import PolicyAnalyzer
    from seedcli.errors import UserError

    class TextEngine:
        vision = False

        def render(self, messages):
            return [1, 2, 3]

    store = ImageStore(None)
    traj = played(9, [1], store)
    prompt = render_trajectory_analysis(traj, description=ANALYSIS_DESCRIPTION)
    messages = analysis_messages(prompt, images=[store.load(traj.turns[0].image)])
    with pytest.raises(UserError, match="no vision tower"):
        PolicyAnalyzer(TextEngine()).analyze_batch([messages])


def test_sft_collates_visual_examples_with_their_images(tmp_path):
    """The sft data of a visual record: the template's image part per step, each image pad expanded to the image's
    tokens, and the collator hands the model pixel_values, grids and token types that agree with the ids."""
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    from seedcli.engines.vision import build_tiny_vl_model, expand_image_tokens, load_image_processor, vision_inputs
    from seedcli.envs import template_texts
    from seedcli.sftdata import Example, encode
    from seedcli.stages.sft_train import VisionCollator

    model_dir = build_tiny_vl_model(tmp_path / "vl", corpus=template_texts())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    processor = load_image_processor(model_dir)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(model_dir)
    image_id = model.config.image_token_id
    store = ImageStore(tmp_path / "data" / "images")
    examples = []
    for seed, moves in ((11, [1, 4]), (12, [2, 3, 1])):
        traj = played(seed, moves, store)
        prompt = render_trajectory_analysis(traj, description=ANALYSIS_DESCRIPTION)
        shas = analysis_images(traj, prompt)

        def expand(ids, shas):
            return expand_image_tokens(ids, image_id, vision_inputs(processor, [[store.pixels(s) for s in shas]]).tokens[0])

        ids, prompt_len = encode(tokenizer, prompt, '{"episode_summary": "a", "episode_skill": "b"}', shas, expand)
        assert ids[:prompt_len].count(image_id) == 9 * len(moves) and image_id not in ids[prompt_len:]
        examples.append(Example(traj.episode_id, ids, prompt_len, 0, shas))

    collator = VisionCollator(model_dir, tmp_path / "data" / "images", tokenizer.pad_token_id or 0)
    batch = collator([{"input_ids": e.input_ids, "labels": e.labels, "image_shas": e.images} for e in examples])
    assert batch["image_grid_thw"].shape == (5, 3)  # 2 + 3 images
    assert int(batch["mm_token_type_ids"].sum()) == 9 * 5 == int((batch["input_ids"] == image_id).sum())
    assert bool((batch["labels"][0, : examples[0].prompt_len] == -100).all())  # the loss is on the answer only
    loss = model(**batch).loss
    assert torch.isfinite(loss)
