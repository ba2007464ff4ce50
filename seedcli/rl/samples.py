"""Turn-samples and their scores (docs/design.md §1, Stage 2 steps 1 and 4).

Every turn of every episode becomes one turn-sample: prompt ids = the exact ids the policy saw (the chat template
applied to that turn's user message), response ids = the tokens it sampled. Its score is the training reward
`Reward` computes — the one place a training reward is computed: a turn scores `win·won − invalid_penalty·invalid`
(its own validity), an episode `win·won − invalid_penalty·(its invalid turns)`, GiGPO's step rewards are `win·won` on
an episode's last turn-sample and 0 before it — and its advantage is that score normalised over the turn-samples of
its group (GRPO, `group_advantages`), or, with GiGPO's step credit on, GiGPO's (`rl/advantages.py`).

Nothing here knows an environment: the stage hands in how a skill is inserted into a prompt (`insert_skill`) and
the reward convention (`Reward`). Re-scoring the samples is in `rl/rescore.py`, packing them in `rl/batching.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from seedcli.errors import UserError
from seedcli.prompts import IMAGE_PLACEHOLDER
from seedcli.rl.advantages import GiGPOSettings, gigpo_parts

BLANK_IMAGE = "blank"  # the image of a padding forward (a vision tower must run on every rank under FSDP)


# --------------------------------------------------------------------------------------------- the reward


@dataclass(frozen=True)
class Reward:
    """The environment's reward convention (ALFWorld 10 / 0.1, search 1 / 0.01; the stage hands it in)."""

    win: float = 10.0
    invalid_penalty: float = 0.1

    def of(self, won: bool, invalid: int) -> float:
        """`win` if won, minus `invalid_penalty` per invalid turn: the training reward, for a turn or an episode."""
        return self.win * float(won) - self.invalid_penalty * float(invalid)

    def turn(self, won: bool, valid: bool) -> float:
        """Score of a turn-sample: its episode's outcome, minus the penalty if this turn was invalid."""
        return self.of(won, not valid)

    def episode(self, episode: Any) -> float:
        """Reward of an episode (a Trajectory): its outcome, minus the penalty for each of its invalid turns."""
        return self.of(episode.won, episode.invalid_turns)

    def step(self, won: bool, last: bool) -> float:
        """GiGPO's step reward of a turn: `win` on the last turn of a won episode, else 0 (the environment's step reward
        in verl-agent for ALFWorld, WebShop and search, whose episodes pay only when they end)."""
        return self.win * float(won) if last else 0.0

    def penalty(self, valid: bool) -> float:
        """The invalid-action penalty of a turn (GiGPO subtracts it from the turn's discounted return)."""
        return self.invalid_penalty * float(not valid)


def episode_rewards(episodes: Sequence, reward: Reward) -> list[float]:
    """Each episode's training reward (`reward/mean` is their mean)."""
    return [reward.episode(ep) for ep in episodes]


@torch.no_grad()
def group_advantages(
    scores: torch.Tensor,
    group_ids: torch.Tensor | Sequence[Hashable],
    eps: float = 1e-6,
    normalize_std: bool = True,
    traj_ids: Sequence[Hashable] | None = None,
) -> torch.Tensor:
    """(score − group mean) / (group std + eps) per sample, with the unbiased std as in verl's GRPO;
    `normalize_std=False` gives score − group mean (the SEED code's WebShop setting).

    `scores` is [N]; `group_ids` [N] (an int tensor or any hashables) names each sample's group.
    A group of one sample has no baseline to compare against and gets advantage 0, and so does every sample of a
    group whose scores are all equal: exactly 0, not the rounding of its mean.

    `traj_ids` [N] (advantage_level episode): the group's mean and std are taken over its trajectories, one score
    each — the score of the trajectory's first sample in the order given — instead of over all its samples
    (verl-agent's `compute_grpo_outcome_advantage` with `compute_mean_std_cross_steps=False`, which keeps the first
    (uid, traj_uid) pair it meets); every sample is then normalised by its group's statistics. A group of one
    trajectory gets advantage 0.
    """
    scores = torch.as_tensor(scores)
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [N], got shape {tuple(scores.shape)}")
    ids = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    if len(ids) != scores.shape[0]:
        raise ValueError(f"got {scores.shape[0]} scores but {len(ids)} group ids")
    if not ids:
        return torch.zeros_like(scores, dtype=torch.get_default_dtype())

    index_of: dict[Hashable, int] = {}
    group = torch.tensor([index_of.setdefault(g, len(index_of)) for g in ids], device=scores.device)  # [N]
    n_groups = len(index_of)
    # float64 so a group of large equal scores normalises to exactly 0, not to rounding noise / eps
    s = scores.to(torch.float64)  # [N]
    if traj_ids is not None:  # the statistics over one score per trajectory: its first sample's
        if len(traj_ids) != len(ids):
            raise ValueError(f"got {len(ids)} group ids but {len(traj_ids)} trajectory ids")
        first_of: dict[tuple, int] = {}
        for i, key in enumerate(zip(ids, traj_ids, strict=True)):
            first_of.setdefault(key, i)
        first = list(first_of.values())
    else:
        first = list(range(len(ids)))
    pick = torch.tensor(first, device=s.device)
    stat_s, stat_group = s[pick], group[pick]
    count = torch.zeros(n_groups, dtype=torch.float64, device=s.device)
    count.index_add_(0, stat_group, torch.ones_like(stat_s))
    mean = torch.zeros_like(count).index_add_(0, stat_group, stat_s) / count  # [G]
    dev = stat_s - mean[stat_group]
    sq = torch.zeros_like(count).index_add_(0, stat_group, dev * dev)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))  # [G], unbiased like torch.std
    centred = s - mean[group]  # [N]
    adv = centred / (std[group] + eps) if normalize_std else centred
    adv = torch.where(count[group] > 1, adv, torch.zeros_like(adv))
    # a group whose scores are all equal has no signal: exactly 0 (its float mean can be one ulp off, and that ulp
    # over std 0 + eps became ±1e-11, which `zero_adv: drop` then kept as nonzero)
    adv = torch.where(_uniform(s, group, n_groups)[group], torch.zeros_like(adv), adv)
    out_dtype = scores.dtype if scores.is_floating_point() else torch.get_default_dtype()
    return adv.to(out_dtype)


def _uniform(values: torch.Tensor, group: torch.Tensor, n_groups: int) -> torch.Tensor:
    """[G] bool: whether every value of a group (each of `n_groups`, `group` [N] naming each value's) is the same."""
    lo = torch.full((n_groups,), float("inf"), dtype=values.dtype, device=values.device)
    hi = torch.full((n_groups,), float("-inf"), dtype=values.dtype, device=values.device)
    lo = lo.scatter_reduce(0, group, values, reduce="amin")
    hi = hi.scatter_reduce(0, group, values, reduce="amax")
    return lo == hi


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
    step_group: int = -1  # GiGPO's step group (same task group, same anchor observation); -1 without step credit

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
    reward: Reward = Reward(),
    normalize_std: bool = True,
    contrast_skills: Sequence[str | None] | None = None,
    skill_mode: str = "episode_only",
    step_skills: Sequence[dict[int, str] | None] | None = None,
    insert_step_skill: Callable[[str, str], str] | None = None,
    gigpo: GiGPOSettings | None = None,
    advantage_level: str = "turn",
) -> list[TurnSample]:
    """Turn-samples of `episodes` (Trajectory records) with GRPO advantages: each turn scores `reward.turn` (the
    environment's `win·won − invalid_penalty·invalid`), normalised over all turn-samples of its group (mean and std,
    or the mean only); `advantage_level` episode: over the group's episodes, one score each (its first
    turn-sample's; `group_advantages`' traj_ids). `skills[i]` is episode i's skill (None: no valid skill, so no
    teacher context and no OPD on its tokens); `insert_skill(prompt, skill)` is the environment's skill-augmented prompt (the block after its task
    line). Turns without response tokens are dropped. `render=None` leaves the prompts untokenised: render the ones
    this rank needs with `render_samples`. `contrast_skills[i]` (opd_contrast): another episode's skill, inserted
    the same way into a second teacher prompt of each of episode i's turns that has an episode-skill prompt.

    Step skills (`skill_mode` episode_step / step_only; `step_skills[i]`: turn index -> step skill of episode i):
    a turn with a step skill gets `insert_step_skill(prompt, step skill)` as its teacher prompt, without the episode
    skill (the SEED code's skill_teacher_mode step_priority); under episode_step only in an episode that has an
    episode skill, whose other turns get the episode skill; under step_only the turns without a step skill get no
    teacher prompt, so no OPD.

    `gigpo` (step_advantage gigpo): GiGPO's advantages instead (`gigpo_turn_advantages`); its `norm` replaces
    `normalize_std`."""
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
                    score=reward.turn(ep.won, turn.valid),
                    has_skill=skill_prompt is not None,
                    step_skill=bool(step),
                    prompt=turn.prompt,
                    skill_prompt=skill_prompt,
                    images=[turn.image] * turn.prompt.count(IMAGE_PLACEHOLDER) if turn.image else [],
                    contrast_prompt=contrast_prompt,
                )
            )
    if samples and gigpo is not None:
        gigpo_turn_advantages(samples, episodes, reward, gigpo)
    elif samples:
        adv = group_advantages(
            torch.tensor([s.score for s in samples], dtype=torch.float64),
            [s.group_id for s in samples],
            normalize_std=normalize_std,
            traj_ids=[s.episode_index for s in samples] if advantage_level == "episode" else None,
        )
        for s, a in zip(samples, adv.tolist(), strict=False):
            s.advantage = float(a)
    if render is not None:
        render_samples(samples, range(len(samples)), render)
    return samples


def anchor_of(turn: Any) -> str:
    """GiGPO's anchor state of a turn: the observation it acted on without history or prompt (verl-agent's
    `anchor_obs`): the observation image's sha256 when the prompt shows one (verl-agent anchors on the image), else
    the observation text."""
    return turn.image if turn.image else turn.observation


def gigpo_turn_advantages(
    samples: Sequence[TurnSample], episodes: Sequence, reward: Reward, settings: GiGPOSettings
) -> None:
    """GiGPO's advantages (`rl/advantages.py: gigpo_parts`) of `samples`, in place, and each one's step group. Inputs
    as verl-agent builds them: the episode score is the turn-sample's `Reward.turn` score (the episode's reward minus
    this turn's penalty), the step reward `Reward.step` (the win on the episode's last turn-sample), the penalty
    `Reward.penalty` subtracted from the discounted return, the anchor `anchor_of` the turn."""
    last = {s.episode_index: s.turn_index for s in samples}  # samples hold each episode's turns in order
    turns = [episodes[s.episode_index].turns[s.turn_index] for s in samples]
    anchors = [anchor_of(t) for t in turns]
    if settings.similarity and any(t.image for t in turns):
        raise UserError(
            "gigpo_similarity compares observation text, and this run's observations are images (verl-agent supports "
            "text only): set gigpo_similarity=false"
        )
    parts = gigpo_parts(
        [s.group_id for s in samples],
        [s.episode_index for s in samples],
        anchors,
        [reward.step(episodes[s.episode_index].won, s.turn_index == last[s.episode_index]) for s in samples],
        [s.score for s in samples],
        settings,
        step_penalties=[reward.penalty(t.valid) for t in turns],
    )
    for s, a, g in zip(samples, parts.advantages, parts.step_groups, strict=True):
        s.advantage, s.step_group = float(a), g


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
