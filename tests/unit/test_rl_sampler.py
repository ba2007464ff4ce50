"""The RL task sampler: seeded, type-balanced, a prefix for train_fraction, wrap-around reshuffles, exact resume."""

from collections import Counter
from dataclasses import dataclass

import pytest

from seedcli.rl.sampler import TaskSampler, balanced_order, hash_seed, interleave_by_type

TYPES = ["clean", "cool", "heat", "look", "pick", "two"]


@dataclass(frozen=True)
class G:
    name: str
    task_type: str


def games(per_type: int) -> list[G]:
    return [G(f"{t}-{i}", t) for t in TYPES for i in range(per_type)]


def test_interleave_round_robin_keeps_order():
    items = [G("a1", "a"), G("a2", "a"), G("a3", "a"), G("b1", "b")]
    assert [g.name for g in interleave_by_type(items, lambda g: g.task_type)] == ["a1", "b1", "a2", "a3"]


def test_balanced_order_every_prefix_balanced_and_seeded():
    order = balanced_order(games(4), seed=0)
    assert sorted(order, key=lambda g: g.name) == sorted(games(4), key=lambda g: g.name)
    for k in (6, 12, 18):
        counts = Counter(g.task_type for g in order[:k])
        assert set(counts.values()) == {k // 6}, counts
    assert balanced_order(games(4), seed=0) == order
    assert balanced_order(games(4), seed=1) != order


def test_train_fraction_takes_a_balanced_prefix():
    s = TaskSampler(games(4), batch_tasks=3, seed=0, train_fraction=0.5)
    assert len(s.pool) == 12
    assert Counter(g.task_type for g in s.pool) == {t: 2 for t in TYPES}


def test_batches_walk_the_pool_then_reshuffle():
    s = TaskSampler(games(2), batch_tasks=4, seed=3)  # pool of 12: three batches per pass
    first_pass = s.next_batch() + s.next_batch() + s.next_batch()
    assert first_pass == s.pool
    second_pass = s.next_batch() + s.next_batch() + s.next_batch()
    assert sorted(second_pass, key=lambda g: g.name) == sorted(s.pool, key=lambda g: g.name)
    assert second_pass != first_pass  # reshuffled by pass
    assert s.epoch == pytest.approx(2.0)


def test_batch_crossing_a_pass_boundary():
    s = TaskSampler(games(1), batch_tasks=4, seed=0)  # pool of 6
    s.next_batch()
    b = s.next_batch()  # positions 4..7: two from pass 0, two from pass 1
    assert b[:2] == s.pool[4:6]
    assert b[2:] == [s.game_at(6), s.game_at(7)]


def test_resume_from_state_draws_the_same_batches():
    a = TaskSampler(games(3), batch_tasks=5, seed=7)
    for _ in range(5):
        a.next_batch()
    state = a.state_dict()
    b = TaskSampler(games(3), batch_tasks=5, seed=7)
    b.load_state_dict(state)
    assert [b.next_batch() for _ in range(4)] == [a.next_batch() for _ in range(4)]


def test_state_for_another_pool_is_refused():
    a = TaskSampler(games(3), batch_tasks=2, seed=0)
    b = TaskSampler(games(2), batch_tasks=2, seed=0)
    with pytest.raises(ValueError, match="pool of 18"):
        b.load_state_dict(a.state_dict())


def test_hash_seed_stable():
    assert hash_seed("x", 1) == hash_seed("x", 1)
    assert hash_seed("x", 1) != hash_seed("x", 2)
    assert 0 <= hash_seed("anything") < 2**31
