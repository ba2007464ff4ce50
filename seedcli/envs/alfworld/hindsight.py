"""ALFWorld's part of `--analyzer hindsight` (seedcli/envs/hindsight.py): the episode replayed against the expert.

The expert is the game's walkthrough (ALFWorld's hand-coded expert after a deviation), so its action in each state
is the next one of a winning plan. A lost episode's turn is the first action off that plan that changed the game
(`look`, `inventory`, `examine` and actions that get "Nothing happens." leave the plan as it was); the skill says
what the agent did there, what the expert did, where the task's object was (the expert's plan from the start,
`expert_plan`), and a rule from the expert's kind of action (search where the object was; take it; heat, cool or clean
it first; put it where the task says). A won episode's turn is the one that took the task's object. Numbered
instances ("countertop 1") leak by ALFWorld's rule (`reward.instance_spans`): the audit counts them.
"""

from __future__ import annotations

import re

from seedcli.envs.alfworld.rules import Goal, abstract, classify, parse_goal, task_text
from seedcli.envs.hindsight import Replayed, divergence, generic_skill

HINDSIGHT_VERSION = "alfworld-hindsight-v1"  # bump when the generated text changes
NEUTRAL = ("look", "inventory", "examine", "help")  # commands that change nothing in the game
TOOLS = {"clean": "sinkbasin", "heat": "microwave", "cool": "fridge"}


def _kind(instance: str | None) -> str:
    """The type of a numbered instance: "countertop 1" -> "countertop"."""
    return re.sub(r" \d+$", "", (instance or "").strip())


def wasted(step: Replayed) -> bool:
    """A turn that left the game as it was: a neutral command, or one the game answered "Nothing happens."."""
    verb = step.action.strip().lower().split(" ", 1)[0]
    return verb in NEUTRAL or step.after.observation.strip().lower().startswith("nothing happens")


def found_at(plan: list[str], goal: Goal) -> str | None:
    """Where the expert's plan takes the task's object from ("countertop 1"), if it does."""
    for action in plan:
        verb, obj, _ = classify(action)
        if verb == "take" and obj == goal.obj:
            return action.strip().lower().rsplit(" from ", 1)[-1]
    return None


def _rule(goal: Goal, expert: str, agent: str, where: str | None) -> str:
    """A rule that carries to other tasks, from the kind of action the expert took where the agent did not."""
    verb, obj, recep = classify(expert)
    what, into = goal.obj or "object the task names", goal.recep or "receptacle the task names"
    place = _kind(where)
    if verb == "go" and place and recep == place:
        return (
            f"look for a {what} at the {place} and places like it before anywhere else; walking to other "
            "receptacles first spends the step budget"
        )
    if verb == "go" and goal.kind in TOOLS and recep == TOOLS[goal.kind]:
        return f"once you hold the {what}, take it straight to the {recep} to {goal.kind} it"
    if verb == "go" and recep == goal.recep:
        return f"once the {what} is ready, take it straight to the {into}"
    if verb == "take":
        taken = classify(agent)
        if taken[0] == "take" and taken[1] != obj:
            return f"take only the object the task names (a {what}), not a {taken[1]}"
        return f"take the {what} as soon as you see it"
    if verb == "open":
        return f"open a closed {recep} and look inside before leaving it: the {what} may be in it"
    if verb in TOOLS:
        return f"{verb} the {what} with the {TOOLS[verb]} before you put it in the {into}"
    if verb == "move":
        return f"put the {what} in or on the {into} as soon as it is ready, and nowhere else"
    if verb == "use":
        return f"use the {recep or obj or 'lamp'} while you hold the {what}"
    return (
        f"act in the task's order: find the {what}, take it, prepare it if the task says so, and put it in the {into}"
    )


def hindsight_skill(trajectory, steps: list[Replayed], plan: list[str], title: str = "ALFWorld") -> tuple[str, str]:
    """(episode_summary, episode_skill) of one ALFWorld episode from its replay and the expert's plan from the start
    (`plan`: its actions)."""
    if not steps:
        return generic_skill(title, trajectory, steps)
    goal = parse_goal(trajectory.task)
    task = task_text(trajectory.task)
    n = len(steps)
    where = found_at(plan, goal)
    if trajectory.won:
        took = [
            s for s in steps if classify(s.action)[0] == "take" and classify(s.action)[1] == goal.obj and not wasted(s)
        ]
        turn = took[0] if took else steps[-1]
        after = [abstract(s.action) for s in steps[turn.index + 1 :] if not wasted(s) and classify(s.action)[0] != "go"]
        then = f"; then it did {', '.join(after)}" if after else ""
        summary = (
            f"The agent completed '{task}' in {n} step(s); the expert's plan takes {len(plan)}. Turn {turn.step} "
            f"decided it: '{turn.action}'."
        )
        place = _kind(turn.action.strip().lower().rsplit(" from ", 1)[-1]) if took else _kind(where)
        left = divergence(steps[: turn.index], wasted=wasted)
        detour = (
            f" (it left the plan at turn {left.step}: '{left.action}' where the expert did '{left.expert}')"
            if left
            else ""
        )
        skill = (
            f"For '{task}': at turn {turn.step} the agent did '{turn.action}', the expert's move there{then}, and "
            f"finished at turn {n}{detour}. Look for a {goal.obj or 'target object'} at the {place or 'likely receptacles'} "
            "first, take it as soon as you see it, and do what the task asks with it in order."
        )
        return summary, skill
    turn = divergence(steps, wasted=wasted)
    if turn is None:
        return generic_skill(title, trajectory, steps)
    result = " ".join(turn.after.observation.split())[:100]
    found = f"; the {goal.obj} was at {where}" if goal.obj and where else ""
    summary = (
        f"The agent failed '{task}' after {n} step(s). At turn {turn.step} it did '{turn.action}' ('{result}'), "
        f"where the expert did '{turn.expert}'{found}."
    )
    rule = _rule(goal, turn.expert or "", turn.action, where)
    skill = (
        f"For '{task}': at turn {turn.step} the agent did '{turn.action}' where the expert did '{turn.expert}'"
        f"{found}. Rule: {rule}."
    )
    return summary, skill
