"""Requests to an engine, and the two ways of serving them (`rollout: lockstep | async`).

A `Request` carries everything its completion depends on: token ids, images, its own seed and sampling settings.
So a completion is the same whichever batch it is served in, and the schedule only decides when it is served.

- `generate_requests`: a list of requests as `generate` calls (grouped by sampling settings, `max_batch` a call);
  each call decodes until its longest reply is done. Lockstep serves a turn this way.
- `ContinuousScheduler`: requests join a running batch as they arrive and leave it when done (the hf engine's
  `ContinuousBatcher` for text models; vLLM's own engine through `add_request` / `step`).
- `ReadyScheduler`: for the hf engine with a vision-language model (its M-RoPE offsets are per prefill): at each
  step, the requests that are waiting, through `generate_requests`.

`steps` counts decode iterations: the hardware-independent cost of serving (on a GPU, a decode step of a 3B model
costs about the same for 1 or 64 sequences). For `generate` it is each call's longest reply, per `max_batch`
sub-batch of the hf engine (which decodes its sub-batches one after another); a lockstep vLLM `generate` call
counts as many as its longest reply (vLLM decodes the call's requests together), a continuous scheduler its
engine iterations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from seedcli.engines.base import Completion, completion_text


@dataclass
class Request:
    tag: Any  # the caller's handle, returned with the completion
    ids: list[int]
    seed: int
    temperature: float
    top_p: float
    max_new_tokens: int
    images: list = field(default_factory=list)  # one per image placeholder of ids (vision-language models)
    ban_stop: bool = False  # the rollout bench forces a length: stop tokens are never drawn, the reply is cut there


def cut(engine: Any, c: Completion, length: int) -> Completion:
    """`c` cut to its first `length` tokens: the completion a request with that limit gets (rows are independent)."""
    if len(c.token_ids) <= length:
        return c
    ids = list(c.token_ids[:length])
    return Completion(completion_text(engine.tokenizer, ids, engine.stop_ids), ids, list(c.logprobs[:length]), "length")


def decode_steps(engine: Any, lengths: list[int]) -> int:
    """Decode iterations of one `generate` call whose replies have `lengths` tokens, in the engine's order."""
    if not lengths:
        return 0
    if getattr(engine, "name", "") != "hf":  # vLLM decodes the whole call together
        return max(lengths)
    size = max(1, int(getattr(engine, "max_batch", len(lengths))))  # the caller passes lengths in the engine's order
    return sum(max(lengths[i : i + size]) for i in range(0, len(lengths), size))


def generate_requests(engine: Any, requests: list[Request], gen_batch: int) -> tuple[list[Completion], int]:
    """Completions of `requests` (in order) through `generate`, `gen_batch` requests a call, one call per set of
    sampling settings; returns them with the decode steps spent."""
    out: list[Completion | None] = [None] * len(requests)
    steps = 0
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(requests):
        groups.setdefault((r.temperature, r.top_p, r.ban_stop), []).append(i)
    for (temperature, top_p, ban_stop), members in groups.items():
        for start in range(0, len(members), gen_batch):
            chunk = members[start : start + gen_batch]
            limit = max(requests[i].max_new_tokens for i in chunk)
            extra: dict[str, Any] = {}
            if any(requests[i].images for i in chunk):
                extra["images"] = [requests[i].images for i in chunk]
            if ban_stop:
                extra["ban_stop"] = True
            completions = engine.generate(
                [requests[i].ids for i in chunk],
                temperature=temperature,
                top_p=top_p,
                max_new_tokens=limit,
                seeds=[requests[i].seed for i in chunk],
                **extra,
            )
            order = sorted(range(len(chunk)), key=lambda k: len(requests[chunk[k]].ids))  # the hf engine's order
            steps += decode_steps(engine, [len(completions[k].token_ids) for k in order])
            for i, c in zip(chunk, completions, strict=True):
                out[i] = cut(engine, c, requests[i].max_new_tokens)
    return out, steps  # type: ignore[return-value]


class ReadyScheduler:
    """At each step, the waiting requests (at most `gen_batch`) through `generate_requests`."""

    def __init__(self, engine: Any, gen_batch: int):
        self.engine = engine
        self.gen_batch = gen_batch
        self.waiting: list[Request] = []
        self.steps = 0

    @property
    def busy(self) -> bool:
        return bool(self.waiting)

    def submit(self, request: Request) -> None:
        self.waiting.append(request)

    def step(self) -> list[tuple[Any, Completion]]:
        ready, self.waiting = self.waiting[: self.gen_batch], self.waiting[self.gen_batch :]
        completions, steps = generate_requests(self.engine, ready, self.gen_batch)
        self.steps += steps
        return [(r.tag, c) for r, c in zip(ready, completions, strict=True)]


class ContinuousScheduler:
    """Requests into the engine's continuous batcher as they arrive; each step decodes one token for all running."""

    def __init__(self, engine: Any):
        self.batcher = engine.batcher()
        self.tags: dict[int, Any] = {}
        self.next_key = 0

    @property
    def busy(self) -> bool:
        return self.batcher.busy

    @property
    def steps(self) -> int:
        return self.batcher.steps

    def submit(self, request: Request) -> None:
        extra = {"images": request.images} if request.images else {}  # vLLM serves a VLM's requests this way too
        self.batcher.add(
            self.next_key,
            request.ids,
            request.seed,
            temperature=request.temperature,
            top_p=request.top_p,
            max_new_tokens=request.max_new_tokens,
            ban_stop=request.ban_stop,
            **extra,
        )
        self.tags[self.next_key] = request.tag
        self.next_key += 1

    def step(self) -> list[tuple[Any, Completion]]:
        return [(self.tags.pop(key), c) for key, c in self.batcher.step()]


def make_scheduler(engine: Any, gen_batch: int) -> ReadyScheduler | ContinuousScheduler:
    """Continuous batching where the engine has it (vLLM; the hf engine with a text model); else ready batches."""
    if hasattr(engine, "batcher") and (getattr(engine, "name", "") == "vllm" or not getattr(engine, "vision", False)):
        return ContinuousScheduler(engine)
    return ReadyScheduler(engine, gen_batch)
