"""One conformance battery for every registered environment (seedcli.envs.base): real data, no model.

Each test runs once per environment in the registry, so a new environment is checked by registering it.
"""

from __future__ import annotations

import os
import random

import pytest

from seedcli.config import EvalConfig
from seedcli.envs import ENV_NAMES, get_env
from seedcli.envs.base import StepResult, Task
from seedcli.envs.pool import EnvPool
from seedcli.errors import UserError
from seedcli.prompts import SKILL_HEADING, SKILL_INSTRUCTION
from seedcli.records import Trajectory, read_jsonl
from seedcli.rollout import EpisodeSpec, ExpertPolicy, RandomPolicy, RolloutSettings, play_episodes

os.environ.setdefault("OMP_NUM_THREADS", "1")

N_TASKS = 4  # tasks per check: enough to see the expert beat the random policy, short enough for CPU


# every environment as registered, and each other observation mode it declares (the visual games' images)
VARIANTS = [*ENV_NAMES, *(f"{n}:{m}" for n in ENV_NAMES for m in get_env(n).observation_modes[1:])]


@pytest.fixture(scope="module", params=VARIANTS)
def env(request):
    name, _, mode = request.param.partition(":")
    return get_env(name, observation=mode) if mode else get_env(name)


@pytest.fixture(scope="module")
def tasks(env) -> list[Task]:
    """A few category-balanced tasks of the default eval split (seeded)."""
    split = env.eval_splits[0]
    return env.select_tasks(env.list_tasks(split), N_TASKS, seed=0)


def _play(env, tasks: list[Task], policy, workers: int = 0, expert: bool = False) -> list[Trajectory]:
    out: list[Trajectory] = []
    specs = [EpisodeSpec(f"e{i}", f"e{i}", task=t) for i, t in enumerate(tasks)]
    settings = RolloutSettings(max_steps=env.max_steps, history=env.history)
    with EnvPool(env, workers, expert=expert) as pool:
        played = play_episodes(specs, policy, pool, settings, {"policy": policy.name}, out.append)
    assert played == len(tasks)
    return sorted(out, key=lambda t: t.episode_id)


def test_declares_the_protocol(env):
    assert env.name in ENV_NAMES and env.title and env.prompt_version
    assert env.max_steps >= 1 and env.history >= 0
    assert env.success_reward > 0 and 0 < env.invalid_penalty < env.success_reward
    assert env.advantage_norm in ("mean_std", "mean")
    assert env.resolve_split(env.train_split) == env.train_split
    assert all(env.resolve_split(s) == s for s in env.eval_splits)
    assert env.card.metric_labels and set(env.card.metric_labels) <= {
        "macro_success",
        "micro_success",
        "mean_score",
        "macro_score",
    }
    for rows in env.card.paper_results.values():
        for row in rows.values():
            assert set(row) <= set(env.card.metric_labels) and all(0 < v <= 1 for v in row.values())
    assert env.analysis_description.startswith("You are an expert analyst") and env.analysis_description.endswith(".")
    with pytest.raises(UserError, match="unknown .*split"):
        env.resolve_split("no-such-split")
    # env-dependent config defaults: a bare `seed eval --env X` plays X's default split with X's turns and history
    cfg = EvalConfig(env=env.name)
    assert (cfg.max_steps, cfg.history) == (env.max_steps, env.history)
    assert env.resolve_split(cfg.split) == env.eval_splits[0]


def test_tasks_are_stable_and_balanced(env, tasks):
    split = env.eval_splits[0]
    all_tasks = env.list_tasks(split)
    ids = [t.task_id for t in all_tasks]
    assert len(ids) == len(set(ids)), "task ids must be unique"
    assert [t.task_id for t in env.list_tasks(split)] == ids, "list_tasks must be deterministic"
    assert all(t.split == split and t.category for t in all_tasks)
    assert [t.task_id for t in env.select_tasks(all_tasks, N_TASKS, seed=0)] == [t.task_id for t in tasks]
    present = {t.category for t in all_tasks}
    assert len({t.category for t in tasks}) == min(N_TASKS, len(present)), "selection must spread over categories"


def test_reset_step_and_unavailable_action(env, tasks):
    game = env.new_game(expert=True)
    try:
        first = game.reset(tasks[0])
        assert isinstance(first, StepResult) and first.task and isinstance(first.observation, str)
        assert (first.admissible is None) == env.free_text
        assert not first.done and not first.won and first.score == 0.0
        assert first.expert_action, "an expert game names the expert's next action"

        # an action the environment cannot carry out changes nothing and does not end the episode
        bogus = "zzz-not-an-action" if env.free_text else "click[zzz no such thing]"
        after = game.step(bogus)
        assert not after.done and not after.won and 0.0 <= after.score <= 1.0
        if not env.free_text:
            assert after.admissible == first.admissible
            assert bogus not in first.admissible

        step = game.step(first.expert_action)  # a real action moves on
        assert isinstance(step, StepResult) and 0.0 <= step.score <= 1.0 and step.task == first.task
    finally:
        game.close()


def test_prompt_task_line_and_skill_insertion(env, tasks):
    game = env.new_game()
    try:
        first = game.reset(tasks[0])
    finally:
        game.close()
    prompt = env.render_prompt(first.task, first.observation, first.admissible, 1, [], env.history)
    assert env.task_line_prefix in prompt
    if first.image is None:
        assert first.task.strip().rstrip(".") in prompt
    else:  # a visual prompt shows the game (EZPoints' cards, which name the task) in its one image
        assert prompt.count("<image>") == 1
    task_line_end = prompt.index("\n", prompt.index(env.task_line_prefix)) + 1
    skill = "Search first, compare the options with the task, and act only on evidence."
    skilled = env.insert_skill(prompt, skill)
    block = f"\n## {SKILL_HEADING}\n{SKILL_INSTRUCTION}\n{skill}\n\n"
    assert skilled == prompt[:task_line_end] + block + prompt[task_line_end:]
    # a later turn shows history and still has exactly one task line
    later = env.render_prompt(first.task, "obs 2", first.admissible, 3, [("obs 0", "a0"), ("obs 1", "a1")], 1)
    assert later.count(env.task_line_prefix) == 1


def test_parser_validity(env, tasks):
    game = env.new_game(expert=True)
    try:
        first = game.reset(tasks[0])
    finally:
        game.close()
    action = first.expert_action
    parsed, valid = env.parse_action(env.format_response("I reason about the task.", action))
    assert valid and parsed.strip().lower() == action.strip().lower()
    assert env.parse_action(env.expert_response(first))[1]
    # no tags at all is invalid in every environment
    assert env.parse_action("I will just do it.")[1] is False
    assert env.parse_action("")[1] is False
    rng = random.Random(0)
    assert env.parse_action(env.random_response(first, rng))[1], "the random policy writes valid responses"


def test_expert_wins_and_random_loses(env):
    # the validation split: ALFWorld's seen games, search's closed dev questions (answers in the bundled corpus)
    tasks = env.select_tasks(env.list_tasks(env.val_split), 6, seed=0)
    expert = _play(env, tasks, ExpertPolicy(env), expert=True)
    rand = _play(env, tasks, RandomPolicy(seed=0, env=env))
    expert_wins = sum(t.won for t in expert)
    random_wins = sum(t.won for t in rand)
    assert expert_wins >= 1 and expert_wins > random_wins, (expert_wins, random_wins)
    if env.name == "alfworld":
        assert expert_wins == len(tasks)  # the walkthrough expert wins every ALFWorld game
    for t in expert + rand:
        assert t.env == env.name and 0.0 <= t.score <= 1.0 and t.prompt_version == env.prompt_version
        assert t.reward == (env.success_reward if t.won else 0.0) and 1 <= t.length <= env.max_steps
        if t.won:
            assert t.score > 0
    # the offline rules analyzer writes a policy-facing rule for a success and for a failure
    for t in (next(e for e in expert if e.won), rand[0]):
        summary, skill = env.rules_skill(t)
        assert len(summary.split()) >= 5 and len(skill.split()) >= 5


def test_pool_with_workers_keeps_order(env, tasks):
    three = tasks[:3]
    local = env.new_game()
    try:
        expected = [local.reset(t).task for t in three]
    finally:
        local.close()
    with EnvPool(env, 2) as pool:
        slots = [5, 2, 8]  # workers 1, 0, 0: results must come back in the order asked
        firsts = pool.reset_many(list(zip(slots, three, strict=True)))
        assert [r.task for r in firsts] == expected
        again = pool.step_many([(8, "zzz"), (5, "zzz")])
        assert [r.task for r in again] == [expected[2], expected[0]]
        with pytest.raises(RuntimeError, match="slot 3 has no game"):
            pool.step_many([(3, "zzz")])


def test_collect_resumes_where_it_stopped(env, tasks, tmp_path):
    from seedcli.stages.common import play_to_file

    cfg = EvalConfig(env=env.name, workers=0)
    specs = [EpisodeSpec(f"g{i:04d}-r00", f"g{i:04d}", task=t) for i, t in enumerate(tasks)]
    out = tmp_path / "trajectories.jsonl"
    meta = {"engine": "none", "model_id": "expert", "model_hash": "", "policy": "expert"}
    first, resumed = play_to_file("c", specs[:2], ExpertPolicy(env), cfg, meta, out, expert=True, env=env)
    assert resumed == 0 and len(first) == 2
    everything, resumed = play_to_file("c", specs, ExpertPolicy(env), cfg, meta, out, expert=True, env=env)
    assert resumed == 2 and len(everything) == len(specs)
    on_disk = read_jsonl(out, Trajectory)
    assert sorted(t.episode_id for t in on_disk) == sorted(s.episode_id for s in specs)  # once each
    assert [t.task_id for t in sorted(on_disk, key=lambda t: t.episode_id)] == [t.task_id for t in tasks]
    # a file of another environment's episodes is refused, not mixed in
    other = next((n for n in ENV_NAMES if n != env.name), None)
    if other is not None:
        with pytest.raises(UserError, match="not what this run plays"):
            play_to_file("c", specs, ExpertPolicy(env), cfg, meta, out, expert=True, env=get_env(other))


def test_sample_texts_for_the_tokenizer(env):
    texts = env.sample_texts()
    assert texts and all(isinstance(t, str) for t in texts)
    assert sum(len(t) for t in texts) > 10_000


def test_environment_never_imports_torch(env):
    import subprocess
    import sys

    code = (
        "import sys\nfrom seedcli.envs import get_env\n"
        f"env = get_env({env.name!r})\ngame = env.new_game()\n"
        f"env.render_prompt('t', 'o', None if env.free_text else ['a'], 1, [], {env.history})\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
