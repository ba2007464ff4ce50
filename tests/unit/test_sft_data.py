"""sftdata: skill records → prompt/completion token ids with the loss on exactly the completion (fast, no model)."""

from __future__ import annotations

import importlib.resources

import pytest

from seedcli.analyzers import analysis_messages
from seedcli.analyzers.parse import parse_skill
from seedcli.envs.alfworld.projection import format_response
from seedcli.envs.alfworld.prompt import ALFWORLD_ANALYSIS_DESCRIPTION
from seedcli.errors import UserError
from seedcli.prompts import ANALYSIS_PROMPT_VERSION, analysis_turns, render_analysis_prompt
from seedcli.records import SkillRecord, Trajectory, Turn
from seedcli.sftdata import (
    IGNORE_INDEX,
    Example,
    build_examples,
    completion_text,
    cut_steps_of,
    encode,
    fit_example,
    kept_records,
    split_by_episode,
)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def tokenizer():
    """A small byte-level BPE with Qwen's special tokens and the Qwen2.5 chat template, trained in well under a second."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from seedcli.envs.alfworld.prompt import template_texts

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(template_texts() * 3, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    wrapped.chat_template = (importlib.resources.files("trl") / "chat_templates" / "qwen2_5.jinja").read_text()
    return wrapped


def make_trajectory(episode_id: str, steps: int, won: bool = True) -> Trajectory:
    turns = [
        Turn(
            step=i + 1,
            observation=f"You arrive at countertop {i + 1}. On the countertop {i + 1}, you see a apple {i + 1}.",
            admissible=["go to fridge 1", "look"],
            prompt="(agent prompt)",
            response=format_response(f"look at countertop {i + 1}", f"go to countertop {i + 2}"),
            action=f"go to countertop {i + 2}",
            valid=True,
        )
        for i in range(steps)
    ]
    return Trajectory(
        episode_id=episode_id,
        group_id=episode_id[:5],
        game_file="g/game.tw-pddl",
        split="train",
        task_type="clean",
        task="put a clean apple in fridge.",
        turns=turns,
        won=won,
        reward=10.0 if won else 0.0,
        length=steps,
        engine="hf",
        model_id="m",
        model_hash="h",
        sampling={},
        prompt_version="alfworld-agent-v1",
        seed=0,
    )


def make_record(traj: Trajectory, reason: str | None = None, skill: str | None = None) -> SkillRecord:
    return SkillRecord(
        episode_id=traj.episode_id,
        key="k",
        task_type=traj.task_type,
        task=traj.task,
        won=traj.won,
        analyzer="rules",
        model="rules-v1",
        prompt_version=ANALYSIS_PROMPT_VERSION,
        prompt=render_analysis_prompt(traj.task, traj.won, analysis_turns(traj), description=ALFWORLD_ANALYSIS_DESCRIPTION),
        raw="{}",
        episode_summary=None if reason else "The agent looked around and cleaned the apple.",
        episode_skill=None
        if reason
        else (skill or "Find the apple, clean it at the sinkbasin, then put it in the fridge."),
        reason=reason,
    )


def test_completion_is_one_line_json_the_skill_parser_reads_back():
    rec = make_record(make_trajectory("g0000-r00", 2), skill='Say "open fridge 1" — then put the apple in it.')
    text = completion_text(rec)
    assert "\n" not in text
    assert text.startswith('{"episode_summary": ')  # the key order and spacing the analysis prompt shows
    parsed = parse_skill(text)
    assert parsed.kept and parsed.summary == rec.episode_summary and parsed.skill == rec.episode_skill


def test_kept_records_drops_rejected_and_duplicates_and_sorts():
    a, b, c = (make_trajectory(f"g000{i}-r00", 1) for i in (2, 0, 1))
    first_b = make_record(b)
    dup_b = make_record(b, skill="Another skill with enough words in it.")
    recs = kept_records([make_record(a), first_b, dup_b, make_record(c, reason="unparseable")])
    assert [r.episode_id for r in recs] == ["g0000-r00", "g0002-r00"]
    assert recs[0].episode_skill == first_b.episode_skill


def test_split_is_deterministic_disjoint_and_sized():
    ids = [f"g{g:04d}-r{r:02d}" for g in range(10) for r in range(4)]
    train, val = split_by_episode(ids, 0.1)
    assert len(val) == 4 and len(train) == 36 and not set(train) & set(val)
    assert split_by_episode(list(reversed(ids)), 0.1) == (train, val)  # order of the input does not matter
    assert len(split_by_episode(ids[:3], 0.1)[1]) == 1  # a positive fraction holds out at least one
    assert split_by_episode(ids, 0.0) == (sorted(ids), [])
    assert split_by_episode(ids[:1], 0.5) == (ids[:1], [])  # one episode: nothing to hold out


def test_label_mask_is_exactly_the_assistant_span_of_the_chat_template(tokenizer):
    rec = make_record(make_trajectory("g0000-r00", 3))
    completion = completion_text(rec)
    ids, prompt_len = encode(tokenizer, rec.prompt, completion)
    ex = Example(rec.episode_id, ids, prompt_len)

    # the prompt ids are the inference ids: the template's render with the generation prompt
    gen = tokenizer.apply_chat_template(analysis_messages(rec.prompt), tokenize=False, add_generation_prompt=True)
    assert ids[:prompt_len] == tokenizer(gen, add_special_tokens=False)["input_ids"]

    # the full conversation, tokenized in one piece with offsets: the assistant span is the content + <|im_end|>
    full = tokenizer.apply_chat_template(
        analysis_messages(rec.prompt) + [{"role": "assistant", "content": completion}], tokenize=False
    )
    start = full.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")
    end = full.index("<|im_end|>", start) + len("<|im_end|>")
    assert full[start:end] == completion + "<|im_end|>"
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    in_span = [start <= s and e <= end and e > s for s, e in enc["offset_mapping"]]
    n = len(ids)
    assert enc["input_ids"][:n] == ids  # same tokens as tokenizing the whole conversation
    assert in_span[n:] == [False] * (len(in_span) - n)  # what follows <|im_end|> (a newline) is not trained
    assert [lab != IGNORE_INDEX for lab in ex.labels] == in_span[:n]
    assert tokenizer.decode([t for t in ex.labels if t != IGNORE_INDEX]) == completion + "<|im_end|>"


def test_long_prompt_is_cut_from_the_left_of_the_trajectory_just_enough(tokenizer):
    traj = make_trajectory("g0000-r00", 12)
    rec = make_record(traj)
    full_ids, _ = encode(tokenizer, rec.prompt, completion_text(rec))
    limit = len(full_ids) - 60  # a few steps too long
    ex = fit_example(rec, tokenizer, limit, {traj.episode_id: traj}.get)
    assert ex is not None and len(ex.input_ids) <= limit
    assert ex.cut_steps >= 1
    prompt = tokenizer.decode(ex.input_ids[: ex.prompt_len])
    assert f"[{ex.cut_steps} earlier step(s) omitted]" in prompt and "Step 12\n" in prompt
    assert f"Step {ex.cut_steps}\n" not in prompt and f"Step {ex.cut_steps + 1}\n" in prompt
    # minimal: one step fewer cut would not fit
    describe = {"description": ALFWORLD_ANALYSIS_DESCRIPTION}
    less = render_analysis_prompt(traj.task, traj.won, analysis_turns(traj), **describe)
    while cut_steps_of(less) < ex.cut_steps - 1:
        less = render_analysis_prompt(traj.task, traj.won, analysis_turns(traj), max_chars=len(less) - 1, **describe)
    assert len(encode(tokenizer, less, completion_text(rec))[0]) > limit
    # the completion is untouched
    assert ex.input_ids[ex.prompt_len :] == full_ids[-ex.completion_len :]


def test_too_long_without_its_trajectory_is_a_clear_error(tokenizer):
    rec = make_record(make_trajectory("g0000-r00", 6))
    with pytest.raises(UserError, match="trajectory is not in the collect run"):
        fit_example(rec, tokenizer, 100, lambda _: None)


def test_build_examples_counts_truncated_and_dropped(tokenizer):
    short, long_ = make_trajectory("g0000-r00", 1), make_trajectory("g0001-r00", 10)
    trajs = {t.episode_id: t for t in (short, long_)}
    recs = [make_record(short), make_record(long_)]
    short_len = len(encode(tokenizer, recs[0].prompt, completion_text(recs[0]))[0])
    examples, stats = build_examples(recs, tokenizer, short_len + 5, trajs.get)
    assert [e.episode_id for e in examples] == ["g0000-r00", "g0001-r00"]
    assert stats.truncated == 1 and stats.cut_steps == examples[1].cut_steps > 0 and stats.dropped_too_long == 0
    assert stats.tokens == sum(len(e.input_ids) for e in examples)
    # a limit below the prompt skeleton: nothing fits, both are left out and named
    examples, stats = build_examples(recs, tokenizer, 64, trajs.get)
    assert examples == [] and stats.dropped_too_long == 2 and stats.dropped_ids == ["g0000-r00", "g0001-r00"]


def test_example_json_roundtrip_and_labels():
    ex = Example("e", [5, 6, 7, 8], 3, cut_steps=2)
    assert Example.from_json(ex.to_json()) == ex
    assert ex.labels == [IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX, 8] and ex.completion_len == 1
