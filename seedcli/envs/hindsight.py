"""`--analyzer hindsight`: the offline stand-in for GLM, written from the environment's expert.

GLM reads a finished episode with its outcome and writes what went wrong or what won it. This analyzer does the same
job without a language model: it plays the episode's recorded actions again in an expert game of the same task
(`replay`; the games are deterministic, so the replay is the episode), where every state also names the expert's
action there (`StepResult.expert_action`). The turn that mattered is the first one whose action left the expert's
path (`divergence`) in a lost episode, the one that decided the win in a won one (`winning` by default); the skill
says what happened at that turn, what the expert did instead, and a rule that carries to other tasks. Each
environment phrases its own (`envs/<env>/hindsight.py`); `generic_skill` is the default every other environment with
an expert gets (`Environment.hindsight_skill`, a `TextEnv` that defines `expert` included).

It is privileged, as GLM reading the outcome is: the expert knows the task's answer. It is a lesson from this
episode, not the answer given before the task is played; how much of each skill names the answer is what the
skill-leak audit reports (`seedcli/skill_leaks.py`). This module imports no environment (each hands in its game).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


class ReplayMismatch(ValueError):
    """The replay did not reproduce the episode (another data root, other env options, a changed game)."""


@dataclass
class Replayed:
    """One turn of an episode played again in an expert game."""

    index: int  # 0-based turn index (the prompt's step number is index + 1)
    action: str  # the action the episode sent
    before: Any  # the StepResult the turn saw; its expert_action is the expert's action in that state
    after: Any  # the StepResult the action led to
    probe_before: Any = None  # what the environment's probe read off the game before the turn (a plan's length)
    probe_after: Any = None  # the same after the turn

    @property
    def step(self) -> int:
        return self.index + 1

    @property
    def expert(self) -> str | None:
        """The expert's action in the state this turn saw (None: the expert had none)."""
        return self.before.expert_action


def replay(
    game: Any,
    task: Any,
    actions: Sequence[str],
    won: bool,
    probe: Callable[[Any, Any], Any] | None = None,
) -> list[Replayed]:
    """`actions` (an episode's, in order) played in `game` (an expert game, closed at the end) from `task`'s start;
    `probe(game, result)` reads what the environment needs off the game after the reset and after every step.
    Raises ReplayMismatch when the game ends before the actions do or its outcome is not `won`."""
    try:
        result = game.reset(task)
        seen = probe(game, result) if probe else None
        out: list[Replayed] = []
        for i, action in enumerate(actions):
            if result.done:
                raise ReplayMismatch(f"the replayed game ended after {i} of the episode's {len(actions)} turns")
            after = game.step(action)
            now = probe(game, after) if probe else None
            out.append(Replayed(i, action, result, after, seen, now))
            result, seen = after, now
    finally:
        game.close()
    if bool(result.won) != bool(won):
        outcome = "won" if result.won else "lost"
        raise ReplayMismatch(f"the replayed game was {outcome}, the episode {'won' if won else 'lost'}")
    return out


def same_action(a: str | None, b: str | None) -> bool:
    """Two actions are the same up to case and spacing."""
    return " ".join(str(a or "").lower().split()) == " ".join(str(b or "").lower().split())


def changed_nothing(step: Replayed) -> bool:
    """The turn left the game as it was: the observation did not change and the episode did not end."""
    return not step.after.done and step.after.observation == step.before.observation


def divergence(
    steps: Sequence[Replayed],
    on_path: Callable[[Replayed], bool] | None = None,
    wasted: Callable[[Replayed], bool] = changed_nothing,
) -> Replayed | None:
    """The first turn that left the expert's path: its action is not the expert's in that state (`on_path` decides;
    default: the same text; a state where the expert has no action is on the path). A turn that changed something is
    preferred over a wasted one (`wasted`: default, nothing changed), which is only returned when every turn off the
    path was wasted. None when every turn followed the expert."""
    on_path = on_path or (lambda s: s.expert is None or same_action(s.action, s.expert))
    off = [s for s in steps if not on_path(s)]
    return next((s for s in off if not wasted(s)), off[0] if off else None)


def winning(steps: Sequence[Replayed]) -> Replayed | None:
    """The turn whose action won the episode (None when none did)."""
    return next((s for s in steps if s.after.won), None)


def quote(text: str | None, limit: int = 90) -> str:
    """`text` on one line, cut to about `limit` characters with an ellipsis."""
    line = " ".join(str(text or "").split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def generic_skill(title: str, trajectory: Any, steps: Sequence[Replayed]) -> tuple[str, str]:
    """(episode_summary, episode_skill) for any environment with an expert: the won episode's winning turn, or the
    lost one's turn off the expert's path with the expert's action there; the rule from whether that turn changed
    anything."""
    n = len(steps)
    if trajectory.won:
        win = winning(steps) or steps[-1]
        left = divergence(steps[: win.index])
        detour = (
            f"; it left the expert's path once, at turn {left.step} ('{quote(left.action, 40)}' where the expert played "
            f"'{quote(left.expert, 40)}'), and came back"
            if left
            else ", on the expert's path throughout"
        )
        summary = f"The agent won the {title} task in {n} step(s){detour}. Turn {win.step}'s '{quote(win.action, 60)}' won it."
        skill = (
            f"In {title}, when the observation reads '{quote(win.before.observation, 80)}', '{quote(win.action, 60)}' "
            "completes the task, as the expert's move there does. Act on the latest observation and take the "
            "finishing action as soon as the game offers it."
        )
        return summary, skill
    turn = divergence(steps)
    if turn is None:
        summary = (
            f"The agent lost the {title} task: its {n} action(s) were the expert's at every turn, but the steps ran out "
            "before the task was done."
        )
        skill = (
            f"In {title}, spend no turn on anything but the expert's kind of progress: this episode followed the right "
            f"moves for {n} step(s) and still ran out; the last state was '{quote(steps[-1].after.observation, 80)}'."
            if steps
            else f"In {title}, act from the first turn: this episode took no action."
        )
        return summary, skill
    effect = "which changed nothing" if changed_nothing(turn) else f"which led to '{quote(turn.after.observation, 70)}'"
    summary = (
        f"The agent lost the {title} task after {n} step(s). It left the expert's path at turn {turn.step}: seeing "
        f"'{quote(turn.before.observation, 70)}', it played '{quote(turn.action, 50)}', {effect}; the expert played "
        f"'{quote(turn.expert, 50)}' there."
    )
    why = (
        "a move that changes nothing wastes a turn"
        if changed_nothing(turn)
        else "a move that is not the expert's can lead away from the goal"
    )
    skill = (
        f"In {title}, at turn {turn.step} the state was '{quote(turn.before.observation, 70)}': the expert played "
        f"'{quote(turn.expert, 50)}', the agent '{quote(turn.action, 50)}' and it lost. Before each action, check it "
        f"against the task and the latest observation: {why}."
    )
    return summary, skill
