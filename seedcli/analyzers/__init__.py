"""Analyzers: turn one finished episode into the hindsight-skill JSON `{"episode_summary", "episode_skill"}`.

| analyzer | what it is |
|---|---|
| glm     | Z.ai's GLM-5.2 over its OpenAI-compatible API — the paper's analyzer (`http.py`) |
| openai  | any OpenAI-compatible endpoint: OpenAI, `vllm serve`, SGLang (`http.py`) |
| policy  | a local model through the project's engines; also what `seed rl` uses to analyse its own episodes (`policy.py`) |
| rules   | an offline baseline that derives the skill from the trajectory without an LLM (`rules.py`); not the paper's |
| hindsight | offline stand-in for GLM: the episode replayed against the environment's expert (`hindsight.py`) |

Every analyzer answers with raw text that goes through the same parser (`parse.py`), so what is kept or rejected
does not depend on where the text came from.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from seedcli.prompts import IMAGE_PLACEHOLDER, SCHEMA_REMINDER


@dataclass
class AnalyzerResponse:
    """One raw answer and what it cost."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    retries: int = 0  # transport retries (429/5xx/timeouts) before this answer
    finish_reason: str = "stop"


class Analyzer(Protocol):
    """`batched` analyzers take a list of conversations per call (one generate call on a local engine); the others
    answer one conversation per call and are called from up to `concurrency` threads at once."""

    name: str  # glm | openai | policy | rules | hindsight
    model: str  # the model identity that goes into cache keys
    batched: bool

    def analyze(self, messages: list[dict], trajectory: Any = None) -> AnalyzerResponse: ...

    def analyze_batch(
        self, conversations: Sequence[list[dict]], trajectories: Sequence[Any] | None = None
    ) -> list[AnalyzerResponse]: ...

    def close(self) -> None: ...


# a schema retry resends at most this much of the failed answer: a long invalid answer (a model that rambled up to
# max_tokens) would otherwise push prompt + answer + reminder past the server's context
PREVIOUS_ANSWER_CHARS = 600


def analysis_messages(
    prompt: str,
    previous_answer: str | None = None,
    max_previous_chars: int | None = None,
    images: Sequence[bytes] = (),
    reminder: str = SCHEMA_REMINDER,
) -> list[dict]:
    """The chat for one attempt: the analysis prompt, and on the retry the failed answer (cut to
    `max_previous_chars` when given) plus the schema reminder (`reminder`: the step-skill prompts' own).

    `images` (PNG bytes, one per `<image>` placeholder of a visual prompt, in order) make the prompt an
    OpenAI-style multi-part message: text parts with an `image_url` part (a base64 data URL) where each placeholder
    stood, as the SEED code sends its visual analysis; the HTTP analyzers send it as it is and the policy analyzer
    turns the parts back into its engine's images."""
    content: str | list[dict] = prompt
    if images:
        content = image_parts(prompt, images)
    messages = [{"role": "user", "content": content}]
    if previous_answer is not None:
        if max_previous_chars is not None and len(previous_answer) > max_previous_chars:
            previous_answer = previous_answer[:max_previous_chars] + " …"
        messages += [
            {"role": "assistant", "content": previous_answer},
            {"role": "user", "content": reminder},
        ]
    return messages


def image_parts(text: str, images: Sequence[bytes]) -> list[dict]:
    """`text` as OpenAI content parts, the i-th `<image>` placeholder replaced by `images[i]` as a PNG data URL."""
    pieces = text.split(IMAGE_PLACEHOLDER)
    if len(pieces) - 1 != len(images):
        raise ValueError(f"the analysis prompt has {len(pieces) - 1} image placeholder(s) but {len(images)} image(s)")
    parts: list[dict] = []
    for i, piece in enumerate(pieces):
        if i:
            url = "data:image/png;base64," + base64.b64encode(images[i - 1]).decode("ascii")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def png_of_part(part: dict) -> bytes | None:
    """The PNG bytes of an `image_url` content part holding a base64 data URL (None for any other part)."""
    if part.get("type") != "image_url":
        return None
    url = str((part.get("image_url") or {}).get("url", ""))
    head, _, payload = url.partition(",")
    if not head.startswith("data:image/") or not head.endswith(";base64"):
        raise ValueError("an image part must hold a base64 data URL (data:image/...;base64,...)")
    return base64.b64decode(payload)


def request_key(
    analyzer: str,
    model: str,
    prompt_version: str,
    prompt: str,
    temperature: float,
    max_tokens: int,
    images: Sequence[str] = (),
    endpoint: str | None = None,
) -> str:
    """Cache key of one analysis: sha256 of (analyzer, model, prompt version, prompt text, sampling, the sha256 of
    each image a visual prompt shows, and the endpoint that answers: an HTTP analyzer's base URL, since two servers
    may give different models one name). The prompt is a function of the trajectory, so equal keys mean the same
    question asked of the same model at the same place."""
    fields = {
        "analyzer": analyzer,
        "model": model,
        "prompt_version": prompt_version,
        "prompt": prompt,
        "temperature": temperature,
        "max_tokens": max_tokens,
    }
    if images:  # text prompts keep the keys they always had
        fields["images"] = list(images)
    if endpoint is not None:  # the rules and policy analyzers keep theirs (the policy's model is its weights' hash)
        fields["endpoint"] = endpoint.rstrip("/")
    blob = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(blob).hexdigest()


def make_analyzer(cfg: Any, stop: threading.Event | None = None, env: Any = None) -> Analyzer:
    """The analyzer an AnnotateConfig asks for. `stop` lets the stage cut HTTP back-off waits short; `env` is the
    environment the hindsight analyzer replays episodes in (built as the episodes' run built it)."""
    if cfg.analyzer in ("glm", "openai"):
        from seedcli.analyzers.http import ChatClient

        return ChatClient(
            cfg.analyzer,
            cfg.base_url,
            cfg.model,
            cfg.api_key_env,
            timeout=cfg.timeout,
            max_retries=cfg.max_retries,
            temperature=cfg.temperature,
            max_tokens=cfg.max_tokens,
            backoff=getattr(cfg, "backoff", 1.0),
            stop=stop,
        )
    if cfg.analyzer == "rules":
        from seedcli.analyzers.rules import RulesAnalyzer

        return RulesAnalyzer()
    if cfg.analyzer == "hindsight":
        from seedcli.analyzers.hindsight import HindsightAnalyzer

        if env is None:
            raise ValueError("the hindsight analyzer needs the environment its episodes were played in")
        return HindsightAnalyzer(env)
    if cfg.analyzer == "policy":
        from seedcli.analyzers.policy import PolicyAnalyzer

        return PolicyAnalyzer.from_config(cfg)
    raise ValueError(f"unknown analyzer {cfg.analyzer!r}")
