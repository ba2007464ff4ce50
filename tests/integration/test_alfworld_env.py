"""Real ALFWorld games through AlfWorldGame and EnvPool (short: a few games, a few steps)."""

from __future__ import annotations

import json
import re
import sys

import pytest

from seedcli.envs.alfworld.data import list_games, select_games
from seedcli.envs.alfworld.episode import AlfWorldGame
from seedcli.envs.alfworld.pool import EnvPool
from seedcli.envs.base import StepResult
from seedcli.errors import UserError


@pytest.fixture(scope="module")
def games(alfworld_root):
    # look games are the shortest (3-4 expert steps); one of another type too, for the pool
    unseen = list_games(alfworld_root, "unseen")
    return select_games(unseen, 3, seed=0, task_types=["look"]) + select_games(unseen, 1, seed=0, task_types=["pick"])


def _task_in_file(path) -> str:
    # the game's text grammar holds its task sentence: "rhs": "Your task is to: <task>"
    grammar = json.loads(path.read_text())["grammar"]
    return re.search(r'"Your task is to: (.*?)"', grammar).group(1).strip()


def test_reset_and_step_a_real_game(games):
    game = AlfWorldGame()
    argv = list(sys.argv)
    try:
        first = game.reset(games[0])
        assert sys.argv == argv  # Fast Downward's translator overwrites sys.argv; the module puts it back
        assert isinstance(first, StepResult)
        assert first.observation.startswith("You are in the middle of a room.")
        assert "Welcome to TextWorld" not in first.observation
        assert first.task and first.task in first.observation and not first.task.startswith("Your task")
        assert first.won is False and first.done is False and first.expert_action is None
        assert all(isinstance(a, str) for a in first.admissible) and "help" not in first.admissible
        assert "look" in first.admissible and "inventory" in first.admissible

        go = next(a for a in first.admissible if a.startswith("go to "))
        after = game.step(go)
        assert after.observation.startswith(f"You arrive at {go[len('go to ') :]}")
        assert after.task == first.task and after.won is False

        assert game.step("fly to the moon").observation == "Nothing happens."
        # a second reset of the same env replays the same start
        assert game.reset(games[0]).observation == first.observation
    finally:
        game.close()


def _play_expert(expert: bool | str, game_spec, limit: int) -> tuple[StepResult, int]:
    """Play the expert's suggestions from a reset until won or `limit` steps; every suggestion must be admissible."""
    game = AlfWorldGame(expert=expert)
    try:
        result = game.reset(game_spec)
        steps = 0
        while not result.won and steps < limit:
            assert result.expert_action in result.admissible
            result = game.step(result.expert_action)
            steps += 1
        return result, steps
    finally:
        game.close()


def test_expert_wins_a_short_game(games):
    result, steps = _play_expert(True, games[0], 10)
    assert result.won and result.done and steps <= 6
    assert result.expert_action is None  # nothing left to do


def test_expert_survives_a_detour(games):
    game = AlfWorldGame(expert=True)
    try:
        first = game.reset(games[1])
        planned = first.expert_action
        # neutral actions keep the walkthrough
        assert game.step("look").expert_action == planned
        assert game.step("jump around").expert_action == planned
        # a state-changing detour hands over to the hand-coded expert: still an admissible suggestion
        detour = next(a for a in first.admissible if a.startswith("go to ") and a != planned)
        after = game.step(detour)
        assert after.expert_action in after.admissible
    finally:
        game.close()


def test_search_expert_finds_what_the_walkthrough_knows(games):
    """expert="search": the hand-coded expert from the first step (no walkthrough). It knows where nothing is, so it
    searches: it still wins the shortest game with admissible suggestions only, in no fewer steps than the
    walkthrough (the planner's plan)."""
    walked, walk_steps = _play_expert(True, games[0], 10)
    searched, search_steps = _play_expert("search", games[0], 40)
    assert walked.won and searched.won and searched.expert_action is None
    assert search_steps >= walk_steps
    with pytest.raises(ValueError, match="expert must be one of"):
        AlfWorldGame(expert="oracle")


def test_pool_two_workers_in_order(games, alfworld_root):
    three = games[1:4]  # two look games and a pick game, three different tasks
    expected_tasks = [_task_in_file(g.path(alfworld_root)) for g in three]
    assert len(set(expected_tasks)) == 3
    with EnvPool(workers=2, expert=True) as pool:
        slots = [5, 2, 8]  # workers 1, 0, 0: order must come back as given
        firsts = pool.reset_many(list(zip(slots, three, strict=True)))
        assert [r.task for r in firsts] == expected_tasks
        assert all(r.observation.startswith("You are in the middle of a room.") for r in firsts)
        assert all(r.expert_action in r.admissible for r in firsts)

        steps = pool.step_many([(s, r.expert_action) for s, r in zip(slots, firsts, strict=True)])
        assert len(steps) == 3 and all(isinstance(r, StepResult) for r in steps)
        for r, first in zip(steps, firsts, strict=True):
            assert r.task == first.task and r.observation != first.observation

        # only some slots this time, in another order
        two = pool.step_many([(8, "look"), (5, "look")])
        assert two[0].task == firsts[2].task and two[1].task == firsts[0].task

        with pytest.raises(RuntimeError, match="slot 3 has no game"):
            pool.step_many([(3, "look")])
        # the pool is still usable after a request error
        assert pool.step_many([(2, "look")])[0].task == firsts[1].task


def test_pool_worker_crash_names_the_game(games):
    pool = EnvPool(workers=1)
    try:
        pool.reset_many([(0, games[0])])
        pool._procs[0].proc.kill()
        with pytest.raises(RuntimeError, match=rf"env worker 0 failed while playing slot 0 \({games[0].name}\)"):
            pool.step_many([(0, "look")])
    finally:
        pool.close()


def test_pool_missing_game_is_a_user_error(alfworld_root, tmp_path):
    with EnvPool(workers=1) as pool:
        with pytest.raises(UserError, match="ALFWorld game not found"):
            pool.reset_many([(0, tmp_path / "nope" / "game.tw-pddl")])
