"""The `policy` analyzer: a local model (through the project's engines, hf or vllm) writes the skill JSON, greedy.

`seed annotate --analyzer policy --model DIR` uses it on a collect run; `seed rl` calls `analyze_with_engine` with
its live engine so the frozen π_old analyses its own finished episodes (docs/design.md §1, Stage 2 step 2). Both run the
same code: one batched generate call for all prompts, the shared parser, retries with the schema reminder (one by
default; `seed rl`'s `analyzer_parse_retries` counts the attempts).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seedcli.analyzers import AnalyzerResponse, analysis_messages, png_of_part
from seedcli.analyzers.parse import MIN_SKILL_WORDS, SKIPPED_SUCCESS, ParsedSkill, parse_skill
from seedcli.engines import load_engine
from seedcli.engines.scheduling import Request
from seedcli.engines.tiny import model_hash
from seedcli.engines.vision import request_tokens
from seedcli.envs import env_class
from seedcli.errors import UserError
from seedcli.hub import resolve_model
from seedcli.images import decode_png
from seedcli.prompts import analysis_images, render_trajectory_analysis, schema_reminder


def model_fingerprint(model_dir: Path) -> str:
    """Content hash of the weights (the engines' model_hash), or of file names, sizes and times when there is none."""
    try:
        return model_hash(model_dir)
    except (ImportError, FileNotFoundError):
        digest = hashlib.sha256()
        for f in sorted(p for p in Path(model_dir).rglob("*") if p.is_file()):
            st = f.stat()
            digest.update(f"{f.relative_to(model_dir)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return digest.hexdigest()


class PolicyAnalyzer:
    """An Engine (`render(messages) -> ids`, `generate(prompts, temperature, top_p, max_new_tokens, seed)`) as analyzer."""

    name = "policy"
    batched = True

    def __init__(
        self,
        engine: Any,
        model: str = "policy",
        *,
        max_new_tokens: int = 4096,
        temperature: float = 0.0,
        seed: int = 0,
        key_model: str | None = None,
        owns_engine: bool = False,
    ):
        self.engine = engine
        self.model = model
        self.key_model = key_model or model
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.seed = seed
        self._owns_engine = owns_engine

    @classmethod
    def from_config(cls, cfg: Any) -> PolicyAnalyzer:
        """Load `cfg.model` with `cfg.engine`; the cache key holds the weights' hash, not the directory name."""
        if not cfg.model:
            raise UserError(
                "--analyzer policy needs --model DIR (a Hugging Face model directory, e.g. an sft run's model/)"
            )
        path = resolve_model(cfg.model)  # a Hub id ORG/NAME[@REVISION]: its snapshot in the Hugging Face cache
        if not (path / "config.json").exists():
            raise UserError(f"--model {path}: no config.json; pass a Hugging Face model directory")

        engine = load_engine(cfg.engine, path, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed)
        return cls(
            engine,
            str(path),
            max_new_tokens=cfg.max_tokens,
            temperature=cfg.temperature,
            seed=cfg.seed,
            key_model="sha256:" + model_fingerprint(path)[:16],
            owns_engine=True,
        )

    def analyze_batch(
        self,
        conversations: Sequence[list[dict]],
        trajectories: Sequence[Any] | None = None,  # noqa: ARG002
    ) -> list[AnalyzerResponse]:
        """All conversations through one generate call (greedy at temperature 0)."""
        if not conversations:
            return []
        local = [engine_prompt(self.engine, m) for m in conversations]
        prompts = [ids for ids, _ in local]
        extra = {}
        if any(images for _, images in local):  # a visual analysis: the engine sees each step's image
            extra["images"] = [images for _, images in local]
        t0 = time.monotonic()
        completions = self.engine.generate(
            prompts,
            temperature=self.temperature,
            top_p=1.0,
            max_new_tokens=self.max_new_tokens,
            seed=self.seed,
            **extra,
        )
        per_item = (time.monotonic() - t0) / len(prompts)  # one batch: its latency is shared by its items
        return [
            AnalyzerResponse(
                text=c.text,
                prompt_tokens=len(ids),
                completion_tokens=len(c.token_ids),
                latency_s=per_item,
                finish_reason=c.finish_reason or "stop",
            )
            for ids, c in zip(prompts, completions, strict=True)
        ]

    def analyze(self, messages: list[dict], trajectory: Any = None) -> AnalyzerResponse:
        return self.analyze_batch([messages], [trajectory])[0]

    def close(self) -> None:
        if self._owns_engine:
            self.engine.close()


def engine_messages(messages: list[dict]) -> tuple[list[dict], list]:
    """OpenAI-style messages as the local engine takes them: each `image_url` part becomes a chat-template image
    part, and its PNG the engine's image (uint8 H×W×3), in order. Text-only messages pass through unchanged."""

    out: list[dict] = []
    images: list = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                png = png_of_part(part)
                if png is None:
                    parts.append(part)
                else:
                    parts.append({"type": "image"})
                    images.append(decode_png(png))
            message = {**message, "content": parts}
        out.append(message)
    return out, images


def engine_prompt(engine: Any, messages: list[dict]) -> tuple[list[int], list]:
    """(token ids, images) of OpenAI-style analysis messages on a local engine; images need a vision tower."""
    local, images = engine_messages(messages)
    if images and not getattr(engine, "vision", False):
        raise UserError(
            "the episodes were played from images but the analyzer's model has no vision tower; analyse them "
            "with a vision-language model (e.g. one from `seed model init --preset tiny-vl`)"
        )
    return list(engine.render(local)), images


def question_images(trajectory: Any, prompt: str, images: Any) -> list[bytes]:
    """The PNGs a trajectory's analysis `prompt` shows (none for a text episode), read from `images` (the run's
    ImageStore, sha256 checked)."""
    shas = analysis_images(trajectory, prompt)
    if shas and images is None:
        raise ValueError("a visual episode's analysis needs the run's images (pass images=ImageStore)")
    return [images.load(sha) for sha in shas]


# a retry resends the failed answer: its text re-encoded can take a few tokens more than were generated
RETRY_SLACK_TOKENS = 16


def context_limit(engine: Any) -> int | None:
    """The most tokens one request (prompt + reply) may hold in `engine`: vLLM's max_model_len, else the positions
    of the engine's model (its text config's max_position_embeddings); None when neither says."""
    limit = getattr(engine, "max_model_len", None)
    if isinstance(limit, int) and limit > 0:
        return limit
    config = getattr(getattr(engine, "model", None), "config", None)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    positions = getattr(text, "max_position_embeddings", None)
    return positions if isinstance(positions, int) and positions > 0 else None


def message_tokens(engine: Any, messages: list[dict]) -> int:
    """Tokens of the engine's request for `messages`, each image counted at the tokens it takes (its processor's)."""
    ids, images = engine_prompt(engine, messages)
    processor = getattr(engine, "image_processor", None)
    if images and processor is not None:
        return request_tokens(ids, images, processor)
    return len(ids)


def fit_analysis_prompt(
    engine: Any,
    trajectory: Any,
    max_chars: int | None,
    max_new_tokens: int,
    *,
    images: Any = None,
    attempts: int = 1,
    skill_mode: str = "episode_only",
    max_step_skills: int = 0,
) -> tuple[str, list[bytes]]:
    """A trajectory's analysis prompt and its images, cut by tokens: the oldest steps are dropped (as `max_chars`
    drops them) until the request and `max_new_tokens` fit the engine's context, and with `attempts` > 1 also the
    retry (the prompt, the failed answer, the reminder). The longest prompt that fits is kept; a UserError when even
    the prompt without its steps does not fit."""
    prompt = _render(trajectory, max_chars, skill_mode, max_step_skills)
    limit = context_limit(engine)
    if limit is None:
        return prompt, question_images(trajectory, prompt, images)
    budget = limit - max_new_tokens
    if attempts > 1:  # the retry's own turns: the answer (at most max_new_tokens) and the reminder
        plain = message_tokens(engine, analysis_messages("x"))
        retry = message_tokens(engine, analysis_messages("x", "", reminder=schema_reminder(skill_mode)))
        budget -= retry - plain + max_new_tokens + RETRY_SLACK_TOKENS

    def tokens(text: str) -> int:
        return message_tokens(engine, analysis_messages(text, images=question_images(trajectory, text, images)))

    n = tokens(prompt)
    if n > budget:
        # the longest prompt that fits: a prompt grows with max_chars (fewer steps dropped), so bisect on it
        low, high, best = 0, len(prompt) - 1, None
        while low <= high:
            mid = (low + high) // 2
            candidate = _render(trajectory, mid, skill_mode, max_step_skills)
            if tokens(candidate) <= budget:
                best, low = candidate, mid + 1
            else:
                high = mid - 1
        if best is None:
            shortest = tokens(_render(trajectory, 0, skill_mode, max_step_skills))
            retry_note = " and a retry" if attempts > 1 else ""
            raise UserError(
                f"episode {trajectory.episode_id}: its analysis prompt takes {shortest} tokens even without its "
                f"steps; with {max_new_tokens} new tokens{retry_note} it does not fit the engine's context of "
                f"{limit} tokens; raise max_model_len or lower analyzer_max_new_tokens"
            )
        prompt = best
    return prompt, question_images(trajectory, prompt, images)


def analyze_with_engine(
    engine: Any,
    items: Sequence[Any],
    max_new_tokens: int = 4096,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    max_prompt_chars: int | None = None,
    images: Any = None,
    attempts: int = 2,
    min_words: int = MIN_SKILL_WORDS,
    skill_mode: str = "episode_only",
    max_step_skills: int = 0,
) -> list[ParsedSkill]:
    """Skills for trajectories (or already-rendered analysis prompts): one generate call for all, then up to
    `attempts − 1` more for those whose answer did not parse, each showing the previous answer and the schema reminder.
    `ParsedSkill.kept` says whether each skill is usable (`min_words` words at least). An episode played from images
    is analysed with the visual prompt and its steps' images, read from `images` (the run's ImageStore). A
    trajectory's prompt is cut to the engine's context by tokens (`fit_analysis_prompt`), after `max_prompt_chars`.
    `skill_mode` other than episode_only also asks for (and parses) up to `max_step_skills` step skills; it needs
    trajectories, whose length bounds the step numbers."""
    if skill_mode != "episode_only" and any(isinstance(item, str) for item in items):
        raise ValueError("step skills need the trajectories (their length bounds the step numbers), not prompts")
    prompts: list[str] = []
    pngs: list[list[bytes]] = []
    for item in items:
        if isinstance(item, str):
            prompts.append(item)
            pngs.append([])
            continue
        prompt, shown = fit_analysis_prompt(
            engine,
            item,
            max_prompt_chars,
            max_new_tokens,
            images=images,
            attempts=attempts,
            skill_mode=skill_mode,
            max_step_skills=max_step_skills,
        )
        prompts.append(prompt)
        pngs.append(shown)

    def parse(i: int, text: str) -> ParsedSkill:
        steps = 0 if isinstance(items[i], str) else len(items[i].turns)
        out = parse_skill(text, min_words, skill_mode=skill_mode, steps=steps, max_step_skills=max_step_skills)
        out.prompt = prompts[i]
        return out

    reminder = schema_reminder(skill_mode)
    analyzer = PolicyAnalyzer(engine, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    first = analyzer.analyze_batch([analysis_messages(p, images=im) for p, im in zip(prompts, pngs, strict=True)])
    parsed = [parse(i, r.text) for i, r in enumerate(first)]
    last = [r.text for r in first]
    for attempt in range(2, attempts + 1):
        again = [i for i, p in enumerate(parsed) if not p.kept]
        if not again:
            break
        answers = analyzer.analyze_batch(
            [analysis_messages(prompts[i], last[i], images=pngs[i], reminder=reminder) for i in again]
        )
        for i, r in zip(again, answers, strict=True):
            parsed[i] = parse(i, r.text)
            parsed[i].attempts = attempt
            last[i] = r.text
    return parsed


def _render(trajectory: Any, max_chars: int | None, skill_mode: str, max_step_skills: int) -> str:
    """A trajectory's analysis prompt under `skill_mode` (the environment's description opens it)."""
    return render_trajectory_analysis(
        trajectory,
        max_chars,
        description=env_class(trajectory.env).analysis_description,
        skill_mode=skill_mode,
        max_step_skills=max_step_skills,
    )


class SelfAnalysis:
    """π_old analysing its own episodes inside the rollout (`play_episodes(followups=...)`): a finished episode's
    analysis request enters the engine at once, greedy, and an answer that does not parse is asked again with the
    schema reminder — the same `attempts` `analyze_with_engine` makes, served while other episodes still play.
    `results[episode_id]` is the parsed skill (with its step skills under `skill_mode` episode_step / step_only);
    with `failed_only` a won episode is not analysed (`skipped_success`)."""

    def __init__(
        self,
        engine: Any,
        max_new_tokens: int,
        *,
        seed: int = 0,
        max_prompt_chars: int | None = None,
        images: Any = None,
        attempts: int = 2,
        min_words: int = MIN_SKILL_WORDS,
        failed_only: bool = False,
        skill_mode: str = "episode_only",
        max_step_skills: int = 0,
    ):
        self.engine = engine
        self.skill_mode = skill_mode
        self.max_step_skills = max_step_skills
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.max_prompt_chars = max_prompt_chars
        self.images = images
        self.attempts = attempts
        self.min_words = min_words
        self.failed_only = failed_only
        self.results: dict[str, ParsedSkill] = {}
        self._asked: dict[str, tuple[str, list[bytes], int]] = {}  # episode id -> (prompt, images, turns)

    def _request(self, episode_id: str, attempt: int, messages: list[dict]) -> Any:
        ids, images = engine_prompt(self.engine, messages)
        return Request(
            tag=(episode_id, attempt),
            ids=ids,
            seed=self.seed,
            temperature=0.0,
            top_p=1.0,
            max_new_tokens=self.max_new_tokens,
            images=images,
        )

    def first(self, trajectory: Any) -> list:
        if self.failed_only and trajectory.won:
            self.results[trajectory.episode_id] = ParsedSkill(None, None, SKIPPED_SUCCESS, attempts=0)
            return []
        prompt, pngs = fit_analysis_prompt(
            self.engine,
            trajectory,
            self.max_prompt_chars,
            self.max_new_tokens,
            images=self.images,
            attempts=self.attempts,
            skill_mode=self.skill_mode,
            max_step_skills=self.max_step_skills,
        )
        self._asked[trajectory.episode_id] = (prompt, pngs, len(trajectory.turns))
        return [self._request(trajectory.episode_id, 0, analysis_messages(prompt, images=pngs))]

    def land(self, tag: tuple[str, int], completion: Any) -> list:
        episode_id, attempt = tag
        prompt, pngs, steps = self._asked[episode_id]
        parsed = parse_skill(
            completion.text,
            self.min_words,
            skill_mode=self.skill_mode,
            steps=steps,
            max_step_skills=self.max_step_skills,
        )
        parsed.attempts = attempt + 1
        parsed.prompt = prompt
        if parsed.kept or attempt + 1 >= self.attempts:
            self.results[episode_id] = parsed
            return []
        messages = analysis_messages(prompt, completion.text, images=pngs, reminder=schema_reminder(self.skill_mode))
        return [self._request(episode_id, attempt + 1, messages)]
