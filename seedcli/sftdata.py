"""Hindsight-skill SFT data: kept skill records → (analysis prompt, skill JSON) pairs → token ids and loss labels.

Pure (no torch): the tokenizer is passed in. One example per kept trajectory:

    prompt      the analysis prompt annotate sent for that trajectory (`SkillRecord.prompt`), as the one user message,
                rendered with the model's chat template and its generation prompt — the exact ids the `policy`
                analyzer feeds the model at inference
    completion  `{"episode_summary": ..., "episode_skill": ...}` on one line (what the skill parser reads back),
                followed by the template's end-of-turn token; the loss covers exactly these tokens

An example longer than `max_length` tokens is re-rendered from its trajectory with the oldest steps dropped (the
prompt says how many) until it fits; one that does not fit even with every step dropped is left out. Both are counted.

A visual record (an episode played from images, `SkillRecord.images`) renders each `<image>` placeholder as the
chat template's image part, and its image-pad token is expanded to the image's tokens (`expand`, given by the stage:
it knows the model's image processor); the example keeps the sha256 of its images, in order, for the collator.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from seedcli.analyzers import analysis_messages
from seedcli.engines.base import content_parts
from seedcli.envs import env_class
from seedcli.errors import UserError
from seedcli.prompts import (
    ANALYSIS_PROMPT_VERSIONS,
    analysis_images,
    analysis_version,
    render_trajectory_analysis,
)
from seedcli.records import SkillRecord

IGNORE_INDEX = -100  # label of a token outside the loss (PyTorch's cross-entropy ignore_index)

_OMITTED = re.compile(r"^\[(\d+) earlier step\(s\) omitted\]$", re.MULTILINE)


@dataclass
class Example:
    """One training sequence: `input_ids[:prompt_len]` is the rendered prompt, the rest is the completion."""

    episode_id: str
    input_ids: list[int]
    prompt_len: int
    cut_steps: int = 0  # oldest trajectory steps dropped to fit max_length
    images: list[str] = field(default_factory=list)  # sha256 of the prompt's images, in order (visual records)

    @property
    def completion_len(self) -> int:
        return len(self.input_ids) - self.prompt_len

    @property
    def labels(self) -> list[int]:
        """input_ids with every prompt token set to IGNORE_INDEX (the model shifts labels itself)."""
        return [IGNORE_INDEX] * self.prompt_len + self.input_ids[self.prompt_len :]

    def to_json(self) -> dict:
        out = {
            "episode_id": self.episode_id,
            "prompt_len": self.prompt_len,
            "cut_steps": self.cut_steps,
            "input_ids": self.input_ids,
        }
        if self.images:
            out["images"] = self.images
        return out

    @classmethod
    def from_json(cls, data: dict) -> Example:
        return cls(
            data["episode_id"],
            list(data["input_ids"]),
            int(data["prompt_len"]),
            int(data.get("cut_steps", 0)),
            list(data.get("images", [])),
        )


@dataclass
class DataStats:
    """What building the examples did, for the manifest and the summary."""

    records: int = 0  # kept skill records read (after de-duplication)
    examples: int = 0
    truncated: int = 0  # prompts shortened from the left of the trajectory to fit max_length
    cut_steps: int = 0  # trajectory steps dropped in total
    dropped_too_long: int = 0  # left out: too long even with every step dropped
    dropped_ids: list[str] = field(default_factory=list)
    prompt_tokens_max: int = 0
    completion_tokens_max: int = 0
    tokens: int = 0

    def as_metrics(self) -> dict[str, Any]:
        return {
            "data/skills": self.records,
            "data/examples": self.examples,
            "data/truncated": self.truncated,
            "data/cut_steps": self.cut_steps,
            "data/dropped_too_long": self.dropped_too_long,
            "data/prompt_tokens_max": self.prompt_tokens_max,
            "data/completion_tokens_max": self.completion_tokens_max,
            "data/tokens": self.tokens,
        }


def completion_text(record: SkillRecord) -> str:
    """The target: the kept skill as one-line JSON, in the key order and spacing the analysis prompt asks for."""
    return json.dumps(
        {"episode_summary": record.episode_summary, "episode_skill": record.episode_skill}, ensure_ascii=False
    )


def kept_records(records: Iterable[SkillRecord]) -> list[SkillRecord]:
    """Records with a kept skill, one per episode (the first wins), sorted by episode id so the data never depends
    on the order annotate finished them in."""
    out: dict[str, SkillRecord] = {}
    for r in records:
        if r.reason is None and r.episode_skill and r.episode_summary:
            out.setdefault(r.episode_id, r)
    return [out[k] for k in sorted(out)]


def split_by_episode(episode_ids: Iterable[str], val_fraction: float) -> tuple[list[str], list[str]]:
    """(train, validation) episode ids. Deterministic: the `round(n · val_fraction)` ids (at least one when the
    fraction is positive and n ≥ 2) with the smallest sha256 go to validation; the seed plays no part, so runs
    with different seeds validate on the same episodes."""
    ids = sorted(set(episode_ids))
    n_val = 0
    if val_fraction > 0 and len(ids) >= 2:
        n_val = min(max(1, round(len(ids) * val_fraction)), len(ids) - 1)
    ranked = sorted(ids, key=lambda e: hashlib.sha256(e.encode()).hexdigest())
    val = set(ranked[:n_val])
    return [e for e in ids if e not in val], [e for e in ids if e in val]


def render_chat(tokenizer: Any, messages: list[dict], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def completion_span(tokenizer: Any, prompt: str, completion: str, visual: bool = False) -> tuple[str, str]:
    """(prompt text, completion text) as the chat template renders them: the prompt ends with the generation prompt;
    the completion is the assistant turn after it, through the end-of-turn token (eos). What the template writes after
    eos (Qwen: a newline) is never generated, so it is not trained."""
    messages = analysis_messages(prompt)
    if visual:  # a visual prompt: the template writes an image part (vision tokens) for each placeholder
        messages = [{"role": "user", "content": content_parts(prompt)}]
    prompt_text = render_chat(tokenizer, messages, True)
    full_text = render_chat(tokenizer, messages + [{"role": "assistant", "content": completion}], False)
    if not full_text.startswith(prompt_text):
        raise UserError(
            "the model's chat template renders the prompt differently once an answer follows it, so the loss mask "
            "cannot be placed; use a model whose template is prefix-preserving (e.g. Qwen2.5's)"
        )
    tail = full_text[len(prompt_text) :]
    eos = getattr(tokenizer, "eos_token", None)
    if eos and eos in tail and not tail[tail.rindex(eos) + len(eos) :].strip():
        tail = tail[: tail.rindex(eos) + len(eos)]
    return prompt_text, tail


# (prompt ids, the sha256 of its images) -> the ids with each image-pad token expanded to that image's tokens
Expand = Callable[[list[int], list[str]], list[int]]


def encode(
    tokenizer: Any, prompt: str, completion: str, images: list[str] | None = None, expand: Expand | None = None
) -> tuple[list[int], int]:
    """(input ids, prompt length). Prompt and completion are tokenized apart, so the prompt ids are exactly those the
    model is given at inference (special tokens come from the template, none are added). A visual prompt's image
    pads are expanded by `expand` for `images`."""
    prompt_text, tail = completion_span(tokenizer, prompt, completion, visual=bool(images))
    prompt_ids = list(tokenizer(prompt_text, add_special_tokens=False)["input_ids"])
    if images:
        if expand is None:
            raise ValueError("a visual prompt needs `expand` (the model's image processor) to be encoded")
        prompt_ids = expand(prompt_ids, images)
    completion_ids = tokenizer(tail, add_special_tokens=False)["input_ids"]
    return prompt_ids + list(completion_ids), len(prompt_ids)


def cut_steps_of(prompt: str) -> int:
    """How many oldest steps `render_analysis_prompt(max_chars=...)` dropped from this prompt (0 when none)."""
    m = _OMITTED.search(prompt)
    return int(m.group(1)) if m else 0


def fit_example(
    record: SkillRecord,
    tokenizer: Any,
    max_length: int,
    trajectory_for: Callable[[str], Any | None],
    expand: Expand | None = None,
) -> Example | None:
    """The example for one record, shortened from the left of its trajectory when longer than `max_length` tokens;
    None when it does not fit even with every step dropped."""
    completion = completion_text(record)
    ids, prompt_len = encode(tokenizer, record.prompt, completion, record.images, expand)
    if len(ids) <= max_length:
        return Example(record.episode_id, ids, prompt_len, cut_steps_of(record.prompt), list(record.images))
    if record.prompt_version not in ANALYSIS_PROMPT_VERSIONS:
        raise UserError(
            f"skill record {record.episode_id}: its prompt ({len(ids)} tokens) is longer than --max-length {max_length} "
            f"and was written with prompt version {record.prompt_version}, not one of "
            f"{', '.join(ANALYSIS_PROMPT_VERSIONS)}, so it cannot be re-rendered shorter; raise --max-length or "
            "re-annotate with this seedcli"
        )
    traj = trajectory_for(record.episode_id)
    if traj is None:
        raise UserError(
            f"skill record {record.episode_id}: its prompt ({len(ids)} tokens) is longer than --max-length {max_length} "
            "and its trajectory is not in the collect run the annotate run read, so it cannot be shortened; "
            "raise --max-length or restore that collect run"
        )
    if analysis_version(traj) != record.prompt_version:
        raise UserError(
            f"skill record {record.episode_id}: written with prompt version {record.prompt_version} but its trajectory "
            f"renders as {analysis_version(traj)}; re-annotate the collect run with this seedcli"
        )
    description = env_class(traj.env).analysis_description
    prompt = render_trajectory_analysis(traj, description=description)
    while True:
        # each pass drops exactly the next oldest step (the text shrinks with every step dropped), and its image
        shorter = render_trajectory_analysis(traj, max_chars=len(prompt) - 1, description=description)
        if len(shorter) >= len(prompt):
            return None
        prompt = shorter
        images = analysis_images(traj, prompt)
        ids, prompt_len = encode(tokenizer, prompt, completion, images, expand)
        if len(ids) <= max_length:
            return Example(record.episode_id, ids, prompt_len, cut_steps_of(prompt), images)


def build_examples(
    records: list[SkillRecord],
    tokenizer: Any,
    max_length: int,
    trajectory_for: Callable[[str], Any | None],
    expand: Expand | None = None,
) -> tuple[list[Example], DataStats]:
    """Examples for kept records (in their order), with the counts the manifest reports."""
    stats = DataStats(records=len(records))
    examples: list[Example] = []
    for record in records:
        ex = fit_example(record, tokenizer, max_length, trajectory_for, expand)
        if ex is None:
            stats.dropped_too_long += 1
            stats.dropped_ids.append(record.episode_id)
            continue
        if ex.cut_steps > cut_steps_of(record.prompt):
            stats.truncated += 1
            stats.cut_steps += ex.cut_steps - cut_steps_of(record.prompt)
        examples.append(ex)
        stats.prompt_tokens_max = max(stats.prompt_tokens_max, ex.prompt_len)
        stats.completion_tokens_max = max(stats.completion_tokens_max, ex.completion_len)
        stats.tokens += len(ex.input_ids)
    stats.examples = len(examples)
    return examples, stats
