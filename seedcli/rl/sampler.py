"""Which training tasks each RL update plays: a seeded, category-balanced order, its first `train_fraction`, walked
`batch_tasks` games at a time and reshuffled at every pass over it. The whole state is one integer (`position`),
saved with each checkpoint, so a resumed run plays exactly the games an uninterrupted one would have played.
"""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

G = TypeVar("G")


def category_of(task: Any) -> str:
    """A task's category (`Task.category`; older game objects name it `task_type`)."""
    category = getattr(task, "category", None)
    return category if category is not None else task.task_type


def _rng(*parts: object) -> random.Random:
    return random.Random(int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little"))


def interleave_by_type(games: Sequence[G], type_of: Callable[[G], str]) -> list[G]:
    """Round-robin over task types, keeping each type's order: every prefix is as type-balanced as it can be."""
    by_type: dict[str, list[G]] = defaultdict(list)
    for g in games:
        by_type[type_of(g)].append(g)
    out: list[G] = []
    queues = [by_type[t] for t in sorted(by_type)]
    for i in range(max((len(q) for q in queues), default=0)):
        out.extend(q[i] for q in queues if i < len(q))
    return out


def balanced_order(games: Sequence[G], seed: int, type_of: Callable[[G], str] = category_of) -> list[G]:
    """A seeded order of `games`: shuffled within each task type, then interleaved round-robin over the types."""
    by_type: dict[str, list[G]] = defaultdict(list)
    for g in games:
        by_type[type_of(g)].append(g)
    shuffled: list[G] = []
    for t in sorted(by_type):
        group = list(by_type[t])
        _rng("type-order", seed, t).shuffle(group)
        shuffled.extend(group)
    return interleave_by_type(shuffled, type_of)


class TaskSampler(Generic[G]):
    """`next_batch()` → the next `batch_tasks` games. Pass 0 walks the balanced order; pass e ≥ 1 walks a reshuffle of
    the same pool (again type-balanced) seeded by e. A batch that crosses the end of a pass continues into the next."""

    def __init__(
        self,
        games: Sequence[G],
        batch_tasks: int,
        seed: int,
        train_fraction: float = 1.0,
        type_of: Callable[[G], str] = category_of,
    ):
        if not games:
            raise ValueError("no training games to sample from")
        if batch_tasks < 1:
            raise ValueError(f"batch_tasks must be ≥ 1, got {batch_tasks}")
        order = balanced_order(games, seed, type_of)
        keep = max(1, round(train_fraction * len(order)))
        self.pool: list[G] = order[:keep]
        self.batch_tasks = batch_tasks
        self.seed = seed
        self.type_of = type_of
        self.position = 0
        self._passes: dict[int, list[G]] = {0: self.pool}

    def _pass(self, epoch: int) -> list[G]:
        if epoch not in self._passes:
            self._passes[epoch] = balanced_order(self.pool, hash_seed(self.seed, epoch), self.type_of)
        return self._passes[epoch]

    def game_at(self, position: int) -> G:
        epoch, i = divmod(position, len(self.pool))
        return self._pass(epoch)[i]

    def next_batch(self) -> list[G]:
        batch = [self.game_at(self.position + i) for i in range(self.batch_tasks)]
        self.position += self.batch_tasks
        return batch

    @property
    def epoch(self) -> float:
        """Passes over the training pool so far (fractional)."""
        return self.position / len(self.pool)

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position, "pool_size": len(self.pool), "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("pool_size") not in (None, len(self.pool)):
            raise ValueError(
                f"sampler state is for a pool of {state['pool_size']} games, this run has {len(self.pool)}: "
                "the training games changed since the checkpoint"
            )
        self.position = int(state["position"])


def hash_seed(*parts: object) -> int:
    """A 31-bit seed derived from `parts` (stable across processes, unlike `hash`)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "little") & 0x7FFFFFFF
