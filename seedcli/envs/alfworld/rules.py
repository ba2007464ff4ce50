"""ALFWorld's part of the offline `rules` analyzer: a hindsight skill derived from the trajectory itself.

A baseline so the pipeline runs end to end without an API key or a GPU — not the paper's analyzer (GLM-5.2 writes
the paper's skills). For a success it writes the ordered workflow of the decisive actions with object numbers
abstracted ("take apple 1 from countertop 1" → "take the apple from the countertop"); for a failure it writes an
avoidance rule from what went wrong (format errors, "Nothing happens.", loops, running out of steps) that names the
task's object and receptacle. It answers with the same JSON text an LLM would, so the same parser judges it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from seedcli.envs.alfworld.projection import parse_action
from seedcli.envs.alfworld.prompt import TASK_LINE_PREFIX

_NUMBERED = re.compile(r"\b([a-z]+) \d+\b")
_OBJ = r"([a-z]+)(?: \d+)?"

_ACTIONS = [
    ("go", re.compile(rf"^go to {_OBJ}$")),
    ("take", re.compile(rf"^take {_OBJ} from {_OBJ}$")),
    ("move", re.compile(rf"^move {_OBJ} to {_OBJ}$")),
    ("move", re.compile(rf"^put {_OBJ} (?:in|on|in/on|into|onto) {_OBJ}$")),
    ("open", re.compile(rf"^open {_OBJ}$")),
    ("close", re.compile(rf"^close {_OBJ}$")),
    ("clean", re.compile(rf"^clean {_OBJ} with {_OBJ}$")),
    ("heat", re.compile(rf"^heat {_OBJ} with {_OBJ}$")),
    ("cool", re.compile(rf"^cool {_OBJ} with {_OBJ}$")),
    ("slice", re.compile(rf"^slice {_OBJ} with {_OBJ}$")),
    ("use", re.compile(rf"^use {_OBJ}$")),
]
_STATE_CHANGING = {"take", "move", "clean", "heat", "cool", "slice", "use"}
_TRANSFORM_TOOL = {"clean": "sinkbasin", "heat": "microwave", "cool": "fridge"}


@dataclass
class Goal:
    """What the task asks for: kind (pick | clean | heat | cool | two | look | unknown), object, receptacle/lamp."""

    kind: str
    obj: str | None
    recep: str | None


_GOALS = [
    ("look", re.compile(r"^look at (?:sliced )?(\w+) under the (\w+)$")),
    ("look", re.compile(r"^examine the (?:sliced )?(\w+) with the (\w+)$")),
    ("two", re.compile(r"^put two (?:sliced )?(\w+) (?:in|on) (\w+)$")),
    ("two", re.compile(r"^find two (?:sliced )?(\w+) and put them (?:in|on) (\w+)$")),
    ("mod", re.compile(r"^put an? (clean|hot|cool|cold) (?:\w+ of )?(?:sliced )?(\w+) (?:in|on) (\w+)$")),
    ("mod", re.compile(r"^(clean|heat|cool) some (?:sliced )?(\w+) and put it (?:in|on) (\w+)$")),
    ("pick", re.compile(r"^put (?:an?|some) (?:sliced )?(\w+) (?:in|on) (\w+)$")),
]
_MOD = {"clean": "clean", "hot": "heat", "heat": "heat", "cool": "cool", "cold": "cool"}


def task_text(task: str) -> str:
    """The task without the "Your task is to:" prefix or the final period."""
    task = task.strip()
    if TASK_LINE_PREFIX.strip().lower() in task.lower():
        task = task[task.lower().index(TASK_LINE_PREFIX.strip().lower()) + len(TASK_LINE_PREFIX.strip()) :]
    return task.strip().rstrip(".").strip()


def parse_goal(task: str) -> Goal:
    """Object and receptacle from ALFWorld's task templates ("put a clean cloth in bathtubbasin." → cloth,
    bathtubbasin); a last-resort guess for other phrasings."""
    text = " ".join(task_text(task).lower().split())
    for kind, rx in _GOALS:
        m = rx.match(text)
        if not m:
            continue
        if kind == "mod":
            return Goal(_MOD[m.group(1)], m.group(2), m.group(3))
        return Goal(kind, m.group(1), m.group(2))
    words = text.split()
    obj = next((words[i + 1] for i, w in enumerate(words[:-1]) if w in ("a", "an", "some", "two", "the")), None)
    recep = words[-1] if len(words) > 2 and words[-1] != obj else None
    return Goal("unknown", obj, recep)


def abstract(action: str) -> str:
    """Object numbers out: "take apple 1 from countertop 1" → "take the apple from the countertop"."""
    return _NUMBERED.sub(r"the \1", action.strip().lower())


def classify(action: str) -> tuple[str, str | None, str | None]:
    """(verb, object type, receptacle type) of an ALFWorld command; verb "other" when unknown."""
    action = " ".join(action.strip().lower().split())
    for verb, rx in _ACTIONS:
        m = rx.match(action)
        if m:
            groups = m.groups()
            if verb in ("go", "open", "close"):
                return verb, None, groups[0]
            if verb == "use":
                return verb, groups[0], None
            return verb, groups[0], groups[1]
    return "other", None, None


@dataclass
class _Step:
    index: int
    action: str
    verb: str
    obj: str | None
    recep: str | None
    valid: bool
    result: str | None  # the next observation; None after the last step
    ok: bool  # the game carried the action out


def _steps(trajectory) -> list[_Step]:
    turns = trajectory.turns
    out = []
    for i, turn in enumerate(turns):
        action = turn.action or parse_action(turn.response)[0]
        result = turns[i + 1].observation.strip() if i + 1 < len(turns) else None
        if result is None:
            ok = bool(trajectory.won)  # the last action of a won episode is the one that finished it
        else:
            ok = not result.lower().startswith("nothing happens")
        verb, obj, recep = classify(action)
        out.append(_Step(i, action, verb, obj, recep, turn.valid, result, ok and bool(action)))
    return out


def _relevant(step: _Step, goal: Goal) -> bool:
    if step.verb not in _STATE_CHANGING or not step.ok:
        return False
    if goal.obj is None:
        return True
    if step.verb == "use":
        return goal.kind in ("look", "unknown") or step.obj == goal.recep
    return step.obj == goal.obj


def decisive_steps(trajectory, goal: Goal | None = None) -> list[_Step]:
    """The actions that made a success: state changes on the task's object (take, move, clean/heat/cool, use the
    lamp), the opens they needed, and the navigation right before each; detours (searching, repeats, an object put
    down somewhere else and picked up again) dropped."""
    goal = goal or parse_goal(trajectory.task)
    steps = _steps(trajectory)
    core = [s for s in steps if _relevant(s, goal)]
    # a detour: the object moved somewhere other than the target and later taken back from there
    dropped: set[int] = set()
    for i, s in enumerate(core):
        if s.verb == "move" and goal.recep and s.recep != goal.recep:
            later = next((t for t in core[i + 1 :] if t.verb == "take" and t.obj == s.obj and t.recep == s.recep), None)
            if later is not None:
                dropped.update({s.index, later.index})
    core = [s for s in core if s.index not in dropped]
    kept: list[_Step] = []
    prev = -1
    for s in core:
        window = steps[prev + 1 : s.index]
        last_go = max((w.index for w in window if w.verb == "go" and w.ok), default=None)
        needed_open = None
        if s.recep is not None:
            after = last_go if last_go is not None else prev
            needed_open = next(
                (w for w in reversed(steps[after + 1 : s.index]) if w.verb == "open" and w.ok and w.recep == s.recep),
                None,
            )
        if last_go is not None:
            kept.append(steps[last_go])
        if needed_open is not None:
            kept.append(needed_open)
        kept.append(s)
        prev = s.index
    return kept


def _goal_phrase(goal: Goal) -> str:
    obj, recep = goal.obj or "target object", goal.recep or "target receptacle"
    if goal.kind == "look":
        return f"find the {obj}, take it to the {recep} and use the {recep}"
    if goal.kind == "two":
        return f"find two {obj}s and move them one at a time to the {recep}"
    if goal.kind in _TRANSFORM_TOOL:
        return f"find the {obj}, {goal.kind} it with the {_TRANSFORM_TOOL[goal.kind]}, and move it to the {recep}"
    return f"find the {obj}, take it, and move it to the {recep}"


def success_skill(trajectory, goal: Goal) -> tuple[str, str]:
    kept = decisive_steps(trajectory, goal)
    task = task_text(trajectory.task)
    n = len(trajectory.turns)
    if kept:
        workflow = ", then ".join(abstract(s.action) for s in kept)
        skill = f"To {task}, follow this order: {workflow}."
    else:
        skill = f"To {task}, {_goal_phrase(goal)}."
    summary = (
        f"The agent completed '{task}' in {n} step(s). {len(kept)} of them were decisive "
        f"(navigation, opening and state changes on the {goal.obj or 'target object'}); the rest were detours."
    )
    return summary, skill


def failure_skill(trajectory, goal: Goal) -> tuple[str, str]:
    steps = _steps(trajectory)
    task = task_text(trajectory.task)
    obj, recep = goal.obj or "target object", goal.recep or "target receptacle"
    n = len(steps)
    invalid = sum(not s.valid for s in steps)
    nothing = [s for s in steps if s.valid and s.result is not None and not s.ok]
    repeats = Counter(s.action for s in steps if s.valid and s.action)
    top_action, top_count = repeats.most_common(1)[0] if repeats else ("", 0)
    max_steps = (trajectory.sampling or {}).get("max_steps")
    out_of_steps = max_steps is not None and n >= int(max_steps)

    def did(verb: str, what: str | None = obj, where: str | None = None) -> bool:
        return any(
            s.verb == verb and s.ok and (what is None or s.obj == what) and (where is None or s.recep == where)
            for s in steps
        )

    seen = bool(goal.obj) and any(
        re.search(rf"\b{re.escape(goal.obj)} \d+\b", (s.result or "") + " " + t.observation, re.IGNORECASE)
        for s, t in zip(steps, trajectory.turns, strict=True)
    )
    # the next stage the episode never reached decides what to do instead
    if not seen:
        fix, progress = f"search receptacles you have not visited or opened yet for the {obj}", f"never found the {obj}"
    elif not did("take"):
        fix, progress = f"take the {obj} as soon as you see it", f"saw the {obj} but never picked it up"
    elif goal.kind in _TRANSFORM_TOOL and not did(goal.kind):
        tool = _TRANSFORM_TOOL[goal.kind]
        fix = f"go to the {tool} and {goal.kind} the {obj} with it before going to the {recep}"
        progress = f"picked up the {obj} but never managed to {goal.kind} it"
    elif goal.kind == "look" and not did("use", None):
        fix, progress = (
            f"carry the {obj} to the {recep} and use the {recep}",
            f"held the {obj} but never used the {recep}",
        )
    elif goal.kind == "two" and did("move", where=goal.recep):
        fix = f"after the first {obj} is in the {recep}, search other receptacles for the second {obj}"
        progress = f"placed one {obj} but not the second"
    else:
        fix = f"go to the {recep} and move the {obj} to it"
        progress = f"had the {obj} but never put it in the {recep}"

    if invalid >= max(2, n / 3):
        mistake = f"replies without a well-formed <think>...</think> and <action>...</action> ({invalid} of {n} steps)"
        sign = "a reply missing either tag"
    elif len(nothing) >= 2:
        worst, times = Counter(abstract(s.action) for s in nothing).most_common(1)[0]
        mistake = f"actions that are not in the admissible list ('{worst}' got 'Nothing happens.' {times} time(s))"
        sign = "the observation 'Nothing happens.'"
    elif top_count >= 3:
        mistake = f"repeating '{abstract(top_action)}' ({top_count} times) without progress"
        sign = "an observation you have already seen"
    elif out_of_steps:
        mistake = f"spending all {n} steps without finishing"
        sign = f"half the step budget used without the {obj} in hand"
    else:
        mistake = "stopping before the task is finished"
        sign = f"the {obj} not yet in the {recep}"
    skill = f"When you must {task}, avoid {mistake}; warning sign: {sign}. Instead, {fix}."
    ended = "ran out of steps" if out_of_steps else "ended unfinished"
    summary = (
        f"The agent failed '{task}' after {n} step(s): {invalid} format error(s), {len(nothing)} 'Nothing happens.' "
        f"result(s), most repeated action '{abstract(top_action) or 'none'}' x{top_count}. It {progress} and {ended}."
    )
    return summary, skill


def rules_skill(trajectory) -> tuple[str, str]:
    """(episode_summary, episode_skill) for one trajectory."""
    goal = parse_goal(trajectory.task)
    return success_skill(trajectory, goal) if trajectory.won else failure_skill(trajectory, goal)
