"""The self-analysis prompt is capped by tokens, not characters: prompt + analyzer_max_new_tokens (and the retry's
answer and reminder) fit the engine's context, the oldest steps dropped first; a prompt that cannot fit even
without its steps is a one-line error. The real Qwen2.5 tokenizer counts the tokens; the engine around it records
what it is asked to generate instead of generating (what is checked is the prompt it gets)."""

from __future__ import annotations

import pytest

from seedcli.analyzers import analysis_messages
from seedcli.analyzers.policy import SelfAnalysis, analyze_with_engine, fit_analysis_prompt, message_tokens
from seedcli.engines.base import Completion, render_chat
from seedcli.envs.sokoban.prompt import ANALYSIS_DESCRIPTION
from seedcli.errors import UserError
from seedcli.images import ImageStore
from seedcli.prompts import render_trajectory_analysis
from seedcli.records import Trajectory, Turn

ANSWER = '{"episode_summary": "pushed the box", "episode_skill": "push the box toward the target before walking away"}'


@pytest.fixture(scope="module")
def qwen_tokenizer():
    from seedcli.engines.tiny import build_qwen_tokenizer

    return build_qwen_tokenizer()


class TokenizerEngine:
    """An engine with a real tokenizer and chat template and a context of `max_model_len` tokens; `generate`
    records each prompt's length and answers with a valid skill."""

    name = "recording"

    def __init__(self, tokenizer, max_model_len: int, image_processor=None):
        self.tokenizer, self.max_model_len = tokenizer, max_model_len
        self.vision, self.image_processor = image_processor is not None, image_processor
        self.asked: list[tuple[int, int]] = []  # (prompt tokens, max_new_tokens)

    def render(self, messages):
        return render_chat(self.tokenizer, messages)

    def generate(self, prompts, *, temperature, top_p, max_new_tokens, seed, images=None):
        extra = [0] * len(prompts)
        if images is not None:
            from seedcli.engines.vision import request_tokens

            processor = self.image_processor
            extra = [request_tokens(p, im, processor) - len(p) for p, im in zip(prompts, images, strict=True)]
        self.asked += [(len(p) + e, max_new_tokens) for p, e in zip(prompts, extra, strict=True)]
        ids = self.tokenizer.encode(ANSWER, add_special_tokens=False)
        return [Completion(ANSWER, ids, [0.0] * len(ids), "stop") for _ in prompts]


def long_episode(steps: int, store: ImageStore | None = None) -> Trajectory:
    """A text (or, with `store`, visual) Sokoban episode whose replies are long: about 90 tokens a step."""
    import numpy as np

    from seedcli.envs.base import encode_png

    turns = []
    for i in range(1, steps + 1):
        reply = f"<think>step {i}: " + "the box is left of the target so I walk around it and push " * 6 + "</think>"
        image = None
        if store is not None:
            image = store.put(encode_png(np.full((96, 96, 3), i % 256, dtype=np.uint8)))
        turns.append(Turn(step=i, observation=f"room at step {i}", admissible=[], prompt=f"p{i}",
                          response=reply + "<action>up</action>", action="up", valid=True, image=image))  # fmt: skip
    return Trajectory(
        episode_id="long", group_id="g", task_id="1", split="train", category="sokoban", env="sokoban",
        task="push all the boxes", turns=turns, won=False, reward=0.0, length=steps, engine="hf", model_id="m",
        model_hash="h", sampling={}, prompt_version="v", seed=1,
    )  # fmt: skip


def test_a_prompt_within_the_character_cap_but_over_the_token_budget_is_cut_by_tokens(qwen_tokenizer):
    engine = TokenizerEngine(qwen_tokenizer, max_model_len=2048)
    episode = long_episode(60)
    by_chars = render_trajectory_analysis(episode, 24000, description=ANALYSIS_DESCRIPTION)
    full = message_tokens(engine, analysis_messages(by_chars))
    assert len(by_chars) <= 24000 and full > 2048  # the character cap alone leaves it over the context

    [parsed] = analyze_with_engine(engine, [episode], 256, max_prompt_chars=24000, attempts=2)
    [(tokens, new)] = engine.asked
    assert parsed.kept and new == 256
    # the first request fits with its reply, and so would the retry: + the answer (≤ 256 tokens) and the reminder
    retry_turns = message_tokens(engine, analysis_messages("x", "", reminder=parsed_reminder())) - message_tokens(
        engine, analysis_messages("x")
    )
    assert tokens + 256 + retry_turns + 256 <= 2048
    assert "earlier step(s) omitted]" in parsed.prompt and f"Step {60}\n" in parsed.prompt  # the oldest go first
    # the longest prompt that fits: one more step would not
    cut = omitted(parsed.prompt)
    chars = len(parsed.prompt)
    while omitted(render_trajectory_analysis(episode, chars, description=ANALYSIS_DESCRIPTION)) == cut:
        chars += 10
    one_more = render_trajectory_analysis(episode, chars, description=ANALYSIS_DESCRIPTION)
    assert omitted(one_more) == cut - 1
    assert message_tokens(engine, analysis_messages(one_more)) + 256 + retry_turns + 256 > 2048 - 16


def omitted(prompt: str) -> int:
    """How many oldest steps the prompt says it left out."""
    return int(prompt.split("[", 1)[1].split(" ", 1)[0]) if "earlier step(s) omitted]" in prompt else 0


def parsed_reminder() -> str:
    from seedcli.prompts import schema_reminder

    return schema_reminder("episode_only")


def test_a_short_prompt_is_left_as_it_is(qwen_tokenizer):
    engine = TokenizerEngine(qwen_tokenizer, max_model_len=8192)
    episode = long_episode(5)
    prompt, images = fit_analysis_prompt(engine, episode, 24000, 512, attempts=2)
    assert prompt == render_trajectory_analysis(episode, 24000, description=ANALYSIS_DESCRIPTION) and images == []


def test_the_in_rollout_analysis_is_cut_the_same_way(qwen_tokenizer):
    engine = TokenizerEngine(qwen_tokenizer, max_model_len=1536)
    episode = long_episode(40)
    [request] = SelfAnalysis(engine, 128, max_prompt_chars=24000, attempts=1).first(episode)
    assert len(request.ids) + 128 <= 1536 and request.max_new_tokens == 128
    prompt, _ = fit_analysis_prompt(engine, episode, 24000, 128, attempts=1)
    assert request.ids == engine.render(analysis_messages(prompt))


def test_images_count_at_their_own_tokens(qwen_tokenizer):
    import copy

    from seedcli.engines.vision import VL_CHAT_TEMPLATE, tiny_image_processor

    tokenizer = copy.deepcopy(qwen_tokenizer)
    tokenizer.chat_template = VL_CHAT_TEMPLATE  # Qwen2-VL's: an image part is <|vision_start|><|image_pad|>...
    store = ImageStore(None)
    engine = TokenizerEngine(tokenizer, max_model_len=1024, image_processor=tiny_image_processor())
    episode = long_episode(30, store)
    prompt, pngs = fit_analysis_prompt(engine, episode, 24000, 128, images=store, attempts=1)
    text_only = len(engine.render(analysis_messages(prompt, images=pngs)))
    with_images = message_tokens(engine, analysis_messages(prompt, images=pngs))
    assert with_images == text_only + 8 * len(pngs)  # each 96x96 frame: one placeholder widened to 9 tokens
    assert with_images + 128 <= 1024 and 0 < len(pngs) < 30


def test_a_prompt_that_cannot_fit_even_without_steps_is_one_line_error(qwen_tokenizer):
    engine = TokenizerEngine(qwen_tokenizer, max_model_len=400)
    with pytest.raises(UserError, match=r"episode long: its analysis prompt takes \d+ tokens even without its steps"):
        analyze_with_engine(engine, [long_episode(3)], 300, max_prompt_chars=24000)
    assert engine.asked == []  # nothing was sent
