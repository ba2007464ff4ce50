"""`--analyzer hindsight` (seedcli/envs/hindsight.py, envs/<env>/hindsight.py): on real episodes of every environment
with an expert, one won by the expert and one lost because the test replaced one of the expert's turns with a mistake
of its own, the skill names the turn that decided the episode, what was done there and the expert's action there
(read off the expert's own episode, never written into the test); skills differ between episodes and the project's
parser keeps them as the analyzer writes them."""

from __future__ import annotations

import copy
import re
from types import SimpleNamespace

import pytest

from seedcli.analyzers import make_analyzer
from seedcli.analyzers.parse import SKIPPED_SUCCESS, parse_skill
from seedcli.config import AnnotateConfig, RLConfig
from seedcli.envs import TextEnv, get_env
from seedcli.envs.ezpoints.expert import card_pair
from seedcli.envs.hindsight import ReplayMismatch, divergence, replay
from seedcli.envs.search.projection import parse_reply
from seedcli.envs.sokoban.expert import solve
from seedcli.envs.sokoban.game import ACTION_NAMES, Sokoban
from seedcli.errors import UserError
from seedcli.rl.analyse import analyse
from seedcli.rl.context import EnvHooks
from seedcli.rl.distributed import DistInfo
from seedcli.skill_leaks import leak_char_metrics
from seedcli.stages.rl import resolve_plan
from tests.helpers_play import ExpertWithSlips, play


def written(env, trajectory) -> tuple[str, str]:
    """(summary, skill) as `--analyzer hindsight` answers for `trajectory`, after the project's skill parser, which
    must keep it."""
    analyzer = make_analyzer(AnnotateConfig(analyzer="hindsight"), env=env)
    parsed = parse_skill(analyzer.analyze([], trajectory).text)
    assert parsed.kept, parsed.reason
    assert (parsed.summary, parsed.skill) == env.hindsight_skill(trajectory)
    return parsed.summary, parsed.skill


# ------------------------------------------------------------------------------------------------------ EZPoints


def test_ezpoints_names_the_formula_the_early_equals_and_the_expert_next_character():
    env = get_env("ezpoints")
    task = env.list_tasks("test")[0]
    (won,) = play(env, [task], ExpertWithSlips(env))
    (early,) = play(env, [task], ExpertWithSlips(env, {3: "="}))  # '=' after "a op": the game ends lost
    assert won.won and not early.won
    a, b, op = card_pair(won.task)
    expert = [t.action for t in won.turns]  # the expert's characters, in order: a, op, b, '='
    other = "*" if op == "+" else "+"
    (wrong_op,) = play(env, [task], ExpertWithSlips(env, {2: other}))
    assert not wrong_op.won

    _, skill = written(env, won)
    print(f"\n[ezpoints won] {skill}")
    assert f"turn 2 decided the game: after '{expert[0]}' the agent appended '{expert[1]}'" in skill
    assert f"{a} {op} {b} = 12" in skill and won.task in skill

    _, skill = written(env, early)
    print(f"[ezpoints lost] {skill}")
    assert f"At turn 3 the agent appended '=' to '{expert[0]}{expert[1]}'" in skill
    assert f"where the expert appended '{expert[2]}'" in skill and "Append '=' last" in skill

    _, skill_op = written(env, wrong_op)
    assert f"At turn 2 the agent appended '{other}' to '{expert[0]}'" in skill_op
    assert f"where the expert appended '{expert[1]}'" in skill_op
    assert len({written(env, t)[1] for t in (won, early, wrong_op)}) == 3
    assert env.leaks(won, written(env, won)[1])  # the cards and the formula: the leak audit counts them


# ------------------------------------------------------------------------------------------------------- Sokoban


def _dead_move(env) -> tuple[object, int, str]:
    """(task, turn, move) of the first test room whose expert path has a state where `move` leaves no plan."""
    for task in env.list_tasks("test")[:20]:
        game = Sokoban(int(task.task_id), **env.room, max_steps=env.max_steps)
        for turn, action in enumerate(solve(game, max_len=64) or [], start=1):
            for move in (1, 2, 3, 4):
                probe = copy.deepcopy(game)
                probe.step(move)
                if solve(probe, max_len=64) is None:
                    return task, turn, ACTION_NAMES[move]
            game.step(action)
    pytest.fail("no test room among the first 20 has a dead move on its expert path")


def test_sokoban_names_the_push_into_a_dead_spot_and_the_expert_move():
    env = get_env("sokoban")
    task, turn, move = _dead_move(env)
    (won,) = play(env, [task], ExpertWithSlips(env))
    (lost,) = play(env, [task], ExpertWithSlips(env, {turn: move}))
    assert won.won and not lost.won
    _, skill = written(env, won)
    print(f"\n[sokoban won] {skill}")
    last = won.turns[-1].action
    assert f"At turn {len(won.turns)} the agent pushed the box {last} from row " in skill and "onto a target" in skill

    summary, skill = written(env, lost)
    print(f"[sokoban lost] {skill}")
    expert = won.turns[turn - 1].action  # the expert's move in the same state (both episodes agree before it)
    assert f"At turn {turn} the agent pushed the box {move} from row " in skill
    assert f"where the expert moved {expert}" in skill and ("corner" in skill or "wall" in skill)
    assert "no sequence of moves can solve the room" in summary
    assert written(env, won)[1] != skill


# ------------------------------------------------------------------------------------------------------- WebShop

ASIN = re.compile(r"click\[(b[0-9a-z]{9})\]")


def test_webshop_names_the_item_against_the_goal_and_the_expert_click(shop):
    env = get_env("webshop")
    goals = [(t, shop.goals[env.goal_index(t)]) for t in env.list_tasks("test")[:40]]
    for task, goal in goals:
        if not goal["goal_options"]:
            continue
        (won,) = play(env, [task], ExpertWithSlips(env))
        if not won.won or not ASIN.fullmatch(won.turns[1].action):  # the goal item on the first results page
            continue

        def other_item(result, goal=goal):
            return next(a for a in result.admissible if ASIN.fullmatch(a) and goal["asin"].lower() not in a)

        (lost,) = play(env, [task], ExpertWithSlips(env, {2: other_item}))
        if not lost.won:
            break
    else:
        pytest.fail("no test goal among the first 40 with options, won by the expert, lost on another item")
    target = ASIN.fullmatch(won.turns[1].action).group(1)
    opened = ASIN.fullmatch(lost.turns[1].action).group(1)
    assert target == goal["asin"].lower() and opened != target

    _, skill = written(env, won)
    print(f"\n[webshop won] {skill}")
    assert f"At turn 2 the agent opened {target}" in skill
    assert all(f"{k}: {v}" in skill for k, v in goal["goal_options"].items())

    _, skill = written(env, lost)
    print(f"[webshop lost] {skill}")
    assert f"at turn 2 the agent opened {opened}" in skill and f"the expert clicked '{target}' there" in skill
    # how the item falls short: an option the goal names, the budget, the kind of product, or its attributes
    assert re.search(rf"{opened} \(.*\): (the goal asks for|the item costs|the item is)", skill)

    # the same goal bought without choosing its options: the expert's option click is named
    (bare,) = play(env, [task], ExpertWithSlips(env, {3: "click[buy now]"}))
    assert not bare.won
    _, skill_bare = written(env, bare)
    first_option = won.turns[2].action[len("click[") : -1]
    assert "at turn 3 the agent clicked 'buy now' on the right item" in skill_bare
    assert f"the expert clicked '{first_option}' first" in skill_bare
    assert len({written(env, t)[1] for t in (won, lost, bare)}) == 3
    assert env.leaks(lost, skill)  # the expert's click names the goal item: the leak audit counts it


# -------------------------------------------------------------------------------------------------------- Search


def test_search_names_the_passage_the_golden_answer_and_the_wrong_answer():
    env = get_env("search")
    for task in env.select_tasks(env.list_tasks("dev"), 12, seed=0):
        (won,) = play(env, [task], ExpertWithSlips(env))
        if won.won:
            break
    else:
        pytest.fail("the expert won none of 12 closed dev questions")
    answer = parse_reply(won.turns[1].action).content  # the golden answer the expert read in a passage
    (wrong,) = play(env, [task], ExpertWithSlips(env, {2: "<answer>Paris</answer>"}))
    (blind,) = play(env, [task], ExpertWithSlips(env, {1: "<answer>Paris</answer>"}))
    assert not wrong.won and not blind.won

    _, skill = written(env, won)
    print(f"\n[search won] {skill}")
    query = parse_reply(won.turns[0].action).content
    assert "at turn 1 the search" in skill and re.search(r"retrieved Doc \d \(", skill)
    assert f"which states '{answer}'" in skill and query[:30] in skill

    _, skill = written(env, wrong)
    print(f"[search lost] {skill}")
    assert "at turn 2 the agent answered 'Paris', although Doc" in skill
    assert f"the expert answered '{answer}' there" in skill
    _, skill_blind = written(env, blind)
    assert "at turn 1 the agent answered 'Paris' without searching" in skill_blind
    assert "the expert searched the question itself" in skill_blind and answer in skill_blind
    assert len({written(env, t)[1] for t in (won, wrong, blind)}) == 3
    assert env.leaks(wrong, skill)  # the golden answer: the leak audit counts it


# ------------------------------------------------------------------------------------------------------ ALFWorld


def test_alfworld_names_the_wrong_receptacle_and_the_expert_action(alfworld_root):
    env = get_env("alfworld", data_root=str(alfworld_root))
    task = env.select_tasks(env.list_tasks("valid_seen"), 1, seed=0)[0]
    (won,) = play(env, [task], ExpertWithSlips(env))
    assert won.won
    first = won.turns[0].action  # the expert's first move

    def elsewhere(result):
        return next(a for a in result.admissible if a.startswith("go to ") and a != result.expert_action)

    # one wrong receptacle first, and no more turns than the expert needs: a real loss
    (lost,) = play(env, [task], ExpertWithSlips(env, {1: elsewhere}), max_steps=len(won.turns))
    assert not lost.won
    _, skill = written(env, won)
    print(f"\n[alfworld won] {skill}")
    took = next(t for t in won.turns if t.action.startswith("take "))
    assert f"at turn {took.step} the agent did '{took.action}', the expert's move there" in skill

    summary, skill = written(env, lost)
    print(f"[alfworld lost] {skill}")
    assert f"at turn 1 the agent did '{lost.turns[0].action}' where the expert did '{first}'" in skill
    assert lost.turns[0].action != first and "Rule: " in skill
    assert skill != written(env, won)[1]


# ------------------------------------------------------------------------------------ a TextEnv: the generic default


class _Climb:
    """Climb to the top step."""

    max_steps = 4

    def tasks(self, split):
        return [{"id": "three", "top": 3}]

    def reset(self, task):
        self.at, self.top = 0, task["top"]
        return "You stand on step 0."

    def step(self, action):
        self.at = max(0, self.at + {"up": 1, "down": -1}.get(action, 0))
        return f"You stand on step {self.at}.", float(self.at == self.top), self.at == self.top

    def admissible(self):
        return ["up", "down", "wait"]


class Stairs(_Climb, TextEnv):
    def expert(self):
        return "up"


class Flat(_Climb, TextEnv):
    """The same game without an expert."""


def test_a_text_environment_with_an_expert_gets_the_generic_default():
    env = Stairs()
    task = env.list_tasks("test")[0]
    (won,) = play(env, [task], ExpertWithSlips(env))
    (lost,) = play(env, [task], ExpertWithSlips(env, {1: "wait", 3: "down"}))  # a wasted turn; later a step back
    assert won.won and not lost.won
    _, skill = written(env, won)
    assert "'up' completes the task" in skill and "You stand on step 2." in skill
    summary, skill = written(env, lost)
    print(f"\n[text lost] {skill}")
    # the turn that changed something is preferred over the earlier wasted one
    assert "at turn 3 the state was 'You stand on step 1.': the expert played 'up', the agent 'down'" in skill
    assert "played 'down', which led to 'You stand on step 0.'" in summary


# ------------------------------------------------------------------------------------------ the replay and the audit


def test_a_replay_that_is_not_the_episode_is_refused_and_the_analyzer_says_why():
    env = get_env("ezpoints")
    (won,) = play(env, env.list_tasks("test")[:1], ExpertWithSlips(env))
    flipped = won.model_copy(update={"won": False})
    with pytest.raises(ReplayMismatch, match="replayed game was won"):
        env.hindsight_skill(flipped)
    answer = make_analyzer(AnnotateConfig(analyzer="hindsight"), env=env).analyze([], flipped).text
    assert answer.startswith("no hindsight skill:") and not parse_skill(answer).kept
    # the divergence of the expert's own episode: none
    steps = replay(env.new_game(expert=True), env.list_tasks("test")[0], [t.action for t in won.turns], True)
    assert divergence(steps) is None and [s.expert for s in steps] == [t.action for t in won.turns]


def test_an_environment_without_an_expert_is_one_line():
    (won,) = play(Stairs(), Stairs().list_tasks("test"), ExpertWithSlips(Stairs()))
    with pytest.raises(UserError, match="Flat has no expert: --analyzer hindsight replays each episode against it"):
        Flat().hindsight_skill(won)


def test_rl_hindsight_writes_each_episodes_skill_and_rejects_a_replay_that_is_not_it():
    env = get_env("ezpoints")
    tasks = env.list_tasks("test")[:2]
    episodes = play(env, tasks, ExpertWithSlips(env)) + play(env, tasks, ExpertWithSlips(env, {3: "="}))
    episodes.append(episodes[-1].model_copy(update={"episode_id": "forged", "won": True}))

    def ctx(cfg):
        hooks = EnvHooks(insert_skill=env.insert_skill, hindsight_skill=env.hindsight_skill)
        return SimpleNamespace(cfg=cfg, plan=resolve_plan(cfg), engine=None, info=DistInfo(), images=None, hooks=hooks)

    cfg = RLConfig(env="ezpoints", analyzer="hindsight")
    assert ctx(cfg).plan.analyzer == "hindsight" and ctx(cfg).plan.teacher
    skills, reasons = analyse(ctx(cfg), episodes, step=1)
    assert skills[:4] == [env.hindsight_skill(ep)[1] for ep in episodes[:4]] and len(set(skills[:4])) == 4
    assert reasons == [None] * 4 + ["hindsight_replay_mismatch"] and skills[4] is None
    failed = analyse(ctx(RLConfig(env="ezpoints", analyzer="hindsight", analyze="failed")), episodes[:4], step=1)
    assert failed[1] == [SKIPPED_SUCCESS, SKIPPED_SUCCESS, None, None]
    with pytest.raises(UserError, match="not hindsight"):
        resolve_plan(RLConfig(env="ezpoints", analyzer="hindsight", algo="sdar"))


class _MarkedEnv:
    """Leaks: every "LEAK" in a skill, as two overlapping spans."""

    def leaks(self, trajectory, skill):
        k = skill.find("LEAK")
        return [] if k < 0 else [(k + 2, k + 4), (k, k + 3)]


def test_the_leak_audit_counts_the_characters_of_the_skills_that_name_the_answer():
    trajectories = [object(), object(), object()]
    skills = ["LEAK and six", "clean text", None]  # 12 + 10 characters, 4 of them leaked ("LEAK", merged)
    assert leak_char_metrics(_MarkedEnv(), trajectories, skills) == {"skills/leak_chars_frac": round(4 / 22, 4)}
    assert leak_char_metrics(_MarkedEnv(), trajectories[:1], [None]) == {"skills/leak_chars_frac": 0.0}
