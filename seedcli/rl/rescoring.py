"""Turn-samples and their re-scoring (docs/design.md §1, Stage 2 steps 1, 3, 4).

Every turn of every episode becomes one turn-sample: prompt ids = the exact ids the policy saw (the chat template
applied to that turn's user message), response ids = the tokens it sampled. Re-scoring runs the same response
tokens through a model under a context, without gradient: ℓ_old (ordinary prompt, π_old), ℓ_skill (the prompt with
the skill block inserted after the task line, π_old) and ℓ_ref (the frozen starting model). Batches are packed by
length (`pack_by_length`) and right-padded only to the longest sample of their micro-batch.

Nothing here knows an environment: the stage hands in how a skill is inserted into a prompt (`insert_skill`) and
the reward convention. The static skill library is in `rl/skill_library.py`; the probe that proves the rollout engine
holds the trainer's weights is in `rl/engine_sync.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from seedcli.rl.advantages import group_advantages, turn_scores
from seedcli.rl.logprobs import pack_by_length

# A score function: (input_ids [B, T], attention_mask [B, T], response_mask [B, T]) → per-token log-probs [B, T];
# a vision-language model's also takes `pixel_values=` and `image_grid_thw=` for the rows' images.
ScoreFn = Callable[..., torch.Tensor]
# The vision inputs of a micro-batch: the image sha256s of each row, in order → pixel_values and image_grid_thw.
VisionFn = Callable[[list[list[str]]], dict]
IMAGE_PLACEHOLDER = "<image>"
BLANK_IMAGE = "blank"  # the image of a padding forward (a vision tower must run on every rank under FSDP)


# --------------------------------------------------------------------------------------------- turn-samples


@dataclass
class TurnSample:
    """One training sample: one turn of one episode, and the scores re-scoring fills in (each [R] fp32, CPU).

    A rank renders (tokenises) only the samples it trains on; for the others it knows the token counts
    (`prompt_len`, `skill_prompt_len`), which is all that packing and loss normalisation need."""

    episode_index: int
    turn_index: int
    group_id: str
    prompt_ids: list[int] | None
    response_ids: list[int]
    skill_prompt_ids: list[int] | None
    score: float
    advantage: float = 0.0
    old_logp: torch.Tensor | None = field(default=None, repr=False)
    ref_logp: torch.Tensor | None = field(default=None, repr=False)
    skill_logp: torch.Tensor | None = field(default=None, repr=False)
    has_skill: bool = False  # a skill-augmented prompt exists (so ℓ_skill is scored and OPD applies)
    step_skill: bool = False  # that prompt carries the turn's step skill (skill_mode episode_step / step_only)
    prompt_len: int = -1
    skill_prompt_len: int = -1
    prompt: str = field(default="", repr=False)  # the turn's user message, kept until rendered
    skill_prompt: str | None = field(default=None, repr=False)
    images: list[str] = field(default_factory=list)  # sha256 of each image the prompt shows, in placeholder order
    # opd_contrast: the prompt with another episode's skill inserted, and the response's log-probs under it
    contrast_prompt: str | None = field(default=None, repr=False)
    contrast_prompt_ids: list[int] | None = field(default=None, repr=False)
    contrast_logp: torch.Tensor | None = field(default=None, repr=False)
    entropy: torch.Tensor | None = field(default=None, repr=False)  # [R] policy entropy at θ, set by the update

    def __post_init__(self) -> None:
        if self.prompt_ids is not None:
            self.prompt_len = len(self.prompt_ids)
        if self.skill_prompt_ids is not None:
            self.skill_prompt_len = len(self.skill_prompt_ids)
            self.has_skill = True

    @property
    def rendered(self) -> bool:
        return self.prompt_ids is not None

    @property
    def length(self) -> int:
        return self.prompt_len + len(self.response_ids)

    @property
    def skill_length(self) -> int:
        return max(self.skill_prompt_len, 0) + len(self.response_ids)

    @property
    def response_tokens(self) -> int:
        return len(self.response_ids)


def build_turn_samples(
    episodes: Sequence,
    skills: Sequence[str | None],
    render: Callable[[str], list[int]] | None,
    *,
    insert_skill: Callable[[str, str], str],
    with_skill_context: bool = True,
    win_reward: float = 10.0,
    invalid_penalty: float = 0.1,
    normalize_std: bool = True,
    contrast_skills: Sequence[str | None] | None = None,
    skill_mode: str = "episode_only",
    step_skills: Sequence[dict[int, str] | None] | None = None,
    insert_step_skill: Callable[[str, str], str] | None = None,
) -> list[TurnSample]:
    """Turn-samples of `episodes` (Trajectory records) with GRPO advantages: each turn scores
    `win_reward·won − invalid_penalty·invalid`, normalised over all turn-samples of its group (mean and std, or the
    mean only). `skills[i]` is episode i's skill (None: no valid skill, so no teacher context and no OPD on its
    tokens); `insert_skill(prompt, skill)` is the environment's skill-augmented prompt (the block after its task
    line). Turns without response tokens are dropped. `render=None` leaves the prompts untokenised: render the ones
    this rank needs with `render_samples`. `contrast_skills[i]` (opd_contrast): another episode's skill, inserted
    the same way into a second teacher prompt of each of episode i's turns that has an episode-skill prompt.

    Step skills (`skill_mode` episode_step / step_only; `step_skills[i]`: turn index -> step skill of episode i):
    a turn with a step skill gets `insert_step_skill(prompt, step skill)` as its teacher prompt, without the episode
    skill (the SEED code's skill_teacher_mode step_priority); under episode_step only in an episode that has an
    episode skill, whose other turns get the episode skill; under step_only the turns without a step skill get no
    teacher prompt, so no OPD."""
    samples: list[TurnSample] = []
    others = list(contrast_skills) if contrast_skills is not None else [None] * len(episodes)
    steps = list(step_skills) if (step_skills is not None and skill_mode != "episode_only") else [None] * len(episodes)
    for ei, (ep, skill, other, by_turn) in enumerate(zip(episodes, skills, others, steps, strict=True)):
        if skill_mode == "episode_step" and not skill:
            by_turn = None  # the SEED code: a trajectory without an episode skill gets no teacher at all
        for ti, turn in enumerate(ep.turns):
            if not turn.response_ids:
                continue
            step = (by_turn or {}).get(ti) if with_skill_context else None
            if step:
                skill_prompt = insert_step_skill(turn.prompt, step)
            elif skill and with_skill_context and skill_mode != "step_only":
                skill_prompt = insert_skill(turn.prompt, skill)
            else:
                skill_prompt = None
            contrast_prompt = (
                insert_skill(turn.prompt, other) if (skill_prompt is not None and other and not step) else None
            )
            samples.append(
                TurnSample(
                    episode_index=ei,
                    turn_index=ti,
                    group_id=ep.group_id,
                    prompt_ids=None,
                    response_ids=list(turn.response_ids),
                    skill_prompt_ids=None,
                    score=turn_scores(ep.won, turn.valid, win_reward=win_reward, invalid_penalty=invalid_penalty),
                    has_skill=skill_prompt is not None,
                    step_skill=bool(step),
                    prompt=turn.prompt,
                    skill_prompt=skill_prompt,
                    images=[turn.image] * turn.prompt.count(IMAGE_PLACEHOLDER) if turn.image else [],
                    contrast_prompt=contrast_prompt,
                )
            )
    if samples:
        adv = group_advantages(
            torch.tensor([s.score for s in samples], dtype=torch.float64),
            [s.group_id for s in samples],
            normalize_std=normalize_std,
        )
        for s, a in zip(samples, adv.tolist(), strict=False):
            s.advantage = float(a)
    if render is not None:
        render_samples(samples, range(len(samples)), render)
    return samples


def render_samples(samples: Sequence[TurnSample], indices: Iterable[int], render: Callable[..., list[int]]) -> None:
    """Tokenise the prompts (and skill prompts) of `samples[i]` for i in `indices`, in place. A sample that shows
    images is rendered with `render(text, images)` (the ids then hold each image's tokens), others `render(text)`."""
    for i in indices:
        s = samples[i]

        def tokens(text: str, s: TurnSample = s) -> list[int]:
            return list(render(text, s.images)) if s.images else list(render(text))

        s.prompt_ids = tokens(s.prompt)
        s.prompt_len = len(s.prompt_ids)
        if s.skill_prompt is not None:
            s.skill_prompt_ids = tokens(s.skill_prompt)
            s.skill_prompt_len = len(s.skill_prompt_ids)
        if s.contrast_prompt is not None:
            s.contrast_prompt_ids = tokens(s.contrast_prompt)


def share_lengths(samples: Sequence[TurnSample], mine: Sequence[int], gather: Callable[[Any], list[Any]]) -> None:
    """Every rank renders only its own samples; exchange the prompt lengths so every rank can pack and normalise
    every rank's share identically. `gather` is an all-gather of a picklable object (identity on one process)."""
    local = [(i, samples[i].prompt_len, samples[i].skill_prompt_len) for i in mine]
    for part in gather(local):
        for i, plen, slen in part:
            samples[i].prompt_len = plen
            samples[i].skill_prompt_len = slen


def pad_right(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B, T], attention_mask [B, T]) with each row right-padded to the longest."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


@torch.no_grad()
def score_responses(
    score_fn: ScoreFn,
    contexts: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    max_tokens: int,
    pad_id: int,
    device: torch.device | str = "cpu",
    sync_count: Callable[[int], int] | None = None,
    images: Sequence[list[str]] | None = None,
    vision: VisionFn | None = None,
    padding_ids: Sequence[int] | None = None,
) -> list[torch.Tensor]:
    """Log-prob of each response token given its prompt, for (prompt_ids, response_ids) pairs; returns one fp32
    CPU tensor [R_i] per pair. Pairs are packed into micro-batches by length (count × longest ≤ `max_tokens`).
    `images[i]` (with `vision`): pair i's image sha256s, whose pixels go to the score function with its batch.
    `padding_ids` (with `vision`): the prompt of a padding forward, holding the tokens of one `BLANK_IMAGE`.

    `sync_count(n)` → the largest n over all ranks: under FSDP every forward is a set of collectives, so a rank with
    fewer micro-batches (or none) runs padding forwards until every rank has run the same number."""
    out: list[torch.Tensor | None] = [None] * len(contexts)
    lengths = [len(p) + len(r) for p, r in contexts]
    batches = pack_by_length(lengths, max_tokens)
    total = sync_count(len(batches)) if sync_count is not None else len(batches)
    for batch in batches:
        rows = [list(contexts[i][0]) + list(contexts[i][1]) for i in batch]
        ids, attn = pad_right(rows, pad_id)
        resp = torch.zeros_like(ids, dtype=torch.float32)  # [B, T]
        for b, i in enumerate(batch):
            p, r = len(contexts[i][0]), len(contexts[i][1])
            resp[b, p : p + r] = 1
        extra = {}
        if vision is not None and images is not None and any(images[i] for i in batch):
            extra = {k: v.to(device) for k, v in vision([list(images[i]) for i in batch]).items()}
        logp = score_fn(ids.to(device), attn.to(device), resp.to(device), **extra).float().cpu()  # [B, T]
        for b, i in enumerate(batch):
            p, r = len(contexts[i][0]), len(contexts[i][1])
            out[i] = logp[b, p : p + r].clone()
    for _ in range(total - len(batches)):
        # a padding forward that touches every parameter (lm_head included), like a real micro-batch
        extra = {}
        row = [pad_id, pad_id, pad_id]
        if vision is not None and padding_ids is not None:  # the vision tower runs too, on a blank image
            row = [*padding_ids, pad_id]
            extra = {k: v.to(device) for k, v in vision([[BLANK_IMAGE]]).items()}
        ids, attn = pad_right([row], pad_id)
        resp = torch.zeros(ids.shape, dtype=torch.float32)
        resp[0, -1] = 1.0
        score_fn(ids.to(device), attn.to(device), resp.to(device), **extra)
    return out  # type: ignore[return-value]


def rescore_samples(
    samples: Sequence[TurnSample],
    *,
    old_fn: ScoreFn,
    ref_fn: ScoreFn | None,
    teacher: bool,
    max_tokens: int,
    pad_id: int,
    device: torch.device | str = "cpu",
    timings: dict[str, float] | None = None,
    sync_count: Callable[[int], int] | None = None,
    vision: VisionFn | None = None,
    padding_ids: Sequence[int] | None = None,
    contrast: bool = False,
) -> dict[str, int]:
    """Fill ℓ_old, ℓ_ref (when `ref_fn`) and ℓ_skill (when `teacher`, for samples with a skill prompt) in place, and
    ℓ_other (`contrast_logp`, when `teacher` and `contrast`, for samples with a contrast prompt: opd_contrast).
    `timings` (if given) receives seconds for 'old', 'ref', 'teacher' and 'contrast'. With `sync_count` (several ranks) every
    pass runs the same number of forwards on every rank. Returns the forwards run per pass (padding included) and
    this rank's padding forwards ("padding")."""
    import time

    counts: dict[str, int] = {}

    def counting(key: str) -> Callable[[int], int]:
        def fn(n: int) -> int:
            counts[key] = sync_count(n) if sync_count is not None else n
            counts["padding"] = counts.get("padding", 0) + counts[key] - n  # this rank's padding forwards
            return counts[key]

        return fn

    def timed(key: str, fn):
        t0 = time.perf_counter()
        result = fn()
        if timings is not None:
            timings[key] = timings.get(key, 0.0) + time.perf_counter() - t0
        return result

    kw = dict(max_tokens=max_tokens, pad_id=pad_id, device=device, vision=vision, padding_ids=padding_ids)
    plain = [(s.prompt_ids, s.response_ids) for s in samples]
    images = [s.images for s in samples]
    scored = timed("old", lambda: score_responses(old_fn, plain, sync_count=counting("old"), images=images, **kw))
    for s, lp in zip(samples, scored, strict=True):
        s.old_logp = lp
    if ref_fn is not None:
        scored = timed("ref", lambda: score_responses(ref_fn, plain, sync_count=counting("ref"), images=images, **kw))
        for s, lp in zip(samples, scored, strict=True):
            s.ref_logp = lp
    if teacher:
        with_skill = [s for s in samples if s.skill_prompt_ids is not None]
        ctx = [(s.skill_prompt_ids, s.response_ids) for s in with_skill]
        teacher_images = [s.images for s in with_skill]  # the same images: only the text differs (the skill block)
        scored = timed(
            "teacher",
            lambda: score_responses(old_fn, ctx, sync_count=counting("teacher"), images=teacher_images, **kw),
        )
        for s, lp in zip(with_skill, scored, strict=True):
            s.skill_logp = lp
        with_other = [s for s in samples if s.contrast_prompt_ids is not None]
        if contrast:  # the extra teacher pass of opd_contrast (every rank runs as many forwards)
            ctx = [(s.contrast_prompt_ids, s.response_ids) for s in with_other]
            scored = timed(
                "contrast",
                lambda: score_responses(
                    old_fn, ctx, sync_count=counting("contrast"), images=[s.images for s in with_other], **kw
                ),
            )
            for s, lp in zip(with_other, scored, strict=True):
                s.contrast_logp = lp
    return counts
