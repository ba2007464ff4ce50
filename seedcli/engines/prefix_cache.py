"""A prefix cache for the hf engine's continuous batcher: the key/value states of prompts it has already prefilled,
so a prompt that begins like one of them prefills only its new tail.

An agent's turn prompts share most of their tokens: every episode of a group plays the same game, so their first
prompts are identical and their later ones differ only near the end (EZPoints: 370 of 475 SmolLM2 tokens are the
rules and the cards, the same for the whole group). vLLM keeps such blocks (automatic prefix caching); this is the
same idea for transformers' DynamicCache, at token granularity:

    store = PrefixStore(budget_bytes=512 << 20)
    n, entry = store.match(prompt)   # the longest stored prefix of `prompt`, at most len(prompt) - 1 tokens
    store.add(prompt, copy_layers)   # copy_layers(): per layer (keys [H, n, D], values [H, n, D]), if kept

Causal attention makes a prefix's keys and values independent of what follows it, so a completion served from the
cache is the one a full prefill gives, up to float noise (tests/unit/test_batching.py). The store lives with one
batcher (one rollout; the weights never change inside it) and is emptied when the engine's weights are replaced.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

MIN_SHARE = 16  # a prefix shorter than this is not worth a forward of its own


@dataclass
class Entry:
    tokens: tuple[int, ...]
    layers: list[tuple[Any, Any]]  # per layer (keys [H, n, D], values [H, n, D])
    nbytes: int


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


class PrefixStore:
    """Prompts' key/value states, least recently used first out once they hold more than `budget_bytes`."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self.entries: OrderedDict[tuple[int, ...], Entry] = OrderedDict()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self.entries)

    def clear(self) -> None:
        self.entries.clear()
        self.nbytes = 0

    def match(self, tokens: Sequence[int]) -> tuple[int, Entry | None]:
        """(n, entry): the stored entry sharing the longest prefix with `tokens`, capped at len(tokens) - 1 (the
        last prompt token is always prefilled: its logits draw the first reply token); (0, None) when none shares
        MIN_SHARE tokens."""
        limit = len(tokens) - 1
        best_n, best = 0, None
        for entry in self.entries.values():
            if min(len(entry.tokens), limit) <= best_n:
                continue
            n = min(common_prefix(entry.tokens, tokens), limit)
            if n > best_n:
                best_n, best = n, entry
        if best is None or best_n < MIN_SHARE:
            return 0, None
        self.entries.move_to_end(best.tokens)
        return best_n, best

    def add(self, tokens: Sequence[int], copy_layers: Callable[[], list[tuple[Any, Any]]]) -> None:
        """Store `tokens`' states; `copy_layers()` copies them out of their batch (per layer (keys [H, n, D], values
        [H, n, D])) and runs only when they are kept. A prompt that is a prefix of a stored one adds nothing; stored
        prompts that are prefixes of it are dropped (it serves them all)."""
        key = tuple(tokens)
        if len(key) < MIN_SHARE:
            return
        covered = []
        for stored in self.entries:
            shared = common_prefix(stored, key)
            if shared == len(key):  # already covered
                self.entries.move_to_end(stored)
                return
            if shared == len(stored):
                covered.append(stored)
        layers = copy_layers()
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if nbytes > self.budget_bytes:
            return
        for stored in covered:  # covered by the new one
            self._drop(stored)
        self.entries[key] = Entry(key, layers, nbytes)
        self.nbytes += nbytes
        while self.nbytes > self.budget_bytes:
            self._drop(next(iter(self.entries)))

    def _drop(self, key: tuple[int, ...]) -> None:
        self.nbytes -= self.entries.pop(key).nbytes


def shared_prefixes(prompts: list[list[int]], store: PrefixStore) -> list[list[int]]:
    """The prefixes two or more of `prompts` share that the store cannot yet give them, shortest first: prefilled
    once each, they serve every prompt that begins with them (a group's identical first prompts prefill once)."""
    ordered = sorted(tuple(p) for p in prompts)
    wanted: dict[tuple[int, ...], None] = {}
    for a, b in zip(ordered, ordered[1:], strict=False):
        n = min(common_prefix(a, b), len(a) - 1, len(b) - 1)  # a prompt's own last token is always prefilled
        if n < MIN_SHARE:
            continue
        prefix = a[:n]
        have, _ = store.match(prefix + (-1,))  # what the store gives this prefix (capped at its length)
        if have < n:
            wanted[prefix] = None
    return [list(p) for p in sorted(wanted, key=len)]
