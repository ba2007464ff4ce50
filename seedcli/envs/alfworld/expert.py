"""ALFWorld's experts: the game's stored walkthrough, handing over to ALFWorld's hand-coded expert.

The expert (`expert=True`) follows the game's stored walkthrough while the episode has kept to it (actions that
change nothing, such as `look`, `examine ...` or an inadmissible command, keep it on track): played from the start
it wins every valid_seen and valid_unseen game (bench/expert_check.py). After a state-changing deviation it hands
over to ALFWorld's hand-coded expert, which has watched every step: cheap, but not always right (after 3 random
actions it recovers in 96 of 134 unseen games within 30 steps; pick_two is its weak spot). Fast Downward's optimal
planner always recovers but needs 0.1-40 s per plan on kitchen games, so it is not used.

`expert="search"` skips the walkthrough: the hand-coded expert plays from the first step. It knows where nothing is
and searches the room (receptacles where the object class can be, opening closed ones), so its behaviour depends only
on what the agent can see: that is what `seed model init --warm-start expert` clones (a clone of the walkthrough
walks to where the object was in *its* game, and wins none of the others).

alfworld is imported lazily (`episode.AlfWorldGame` sets ALFWORLD_DATA first); this module never imports torch.
"""

from __future__ import annotations

import random
from pathlib import Path

# expert=False: no expert; True or "walkthrough": the stored walkthrough, hand-coded fallback; "search": hand-coded only
EXPERT_MODES = (False, True, "walkthrough", "search")

# Commands that leave the walkthrough valid: they only mark things as "checked" in the PDDL domain.
_NEUTRAL_VERBS = ("look", "inventory", "help", "examine")


class AlfWorldExpert:
    """The expert of one game slot: told every step of the episode, it names the next action (`next_action`)."""

    def __init__(self, search_only: bool = False):
        self.search_only = search_only
        self.walkthrough: list[str] = []
        self.on_track = True
        self.index = 0  # the walkthrough's next action
        self.handcoded = None
        self.handcoded_next: str | None = None

    def reset(self, env, path: Path, state) -> None:
        """A new game: `env` the TextWorld environment just reset on the game file `path`, `state` its first state."""
        self.walkthrough = [] if self.search_only else [str(a) for a in (env.unwrapped.walkthrough or [])]
        self.on_track, self.index = not self.search_only, 0
        self._start_handcoded(path, state.feedback)
        if self.search_only:
            self.watch(state, "look", path, 0)  # its first move (it is otherwise asked after each step)

    def follow(self, action: str, admissible_before: list[str]) -> None:
        """Keep the walkthrough pointer in step with the episode; a state-changing deviation ends it."""
        if not self.on_track:
            return
        if self.index < len(self.walkthrough) and action == self.walkthrough[self.index]:
            self.index += 1
        elif action in admissible_before and action.split(" ", 1)[0] not in _NEUTRAL_VERBS:
            self.on_track = False

    def watch(self, state, action: str, path: Path, steps: int) -> None:
        """Show the hand-coded expert step `steps` (`action` and the state it led to), for its next suggestion."""
        # Runs every step, on or off the walkthrough: it builds its picture of the room from what it has seen.
        if self.handcoded is None:
            return
        # It breaks ties with the global `random`: seed it per game and step, and leave the caller's stream alone.
        saved = random.getstate()
        random.seed(f"{'/'.join(path.parts[-3:])}/{steps}")  # task/trial/file: same on every machine
        try:
            self.handcoded_next = self.handcoded.act(state, 0, state["won"], action)
        except Exception:  # noqa: BLE001 - HandCodedAgentFailed/Timeout: no suggestion from here on
            self.handcoded, self.handcoded_next = None, None
        finally:
            random.setstate(saved)

    def next_action(self, won: bool, admissible: list[str]) -> str | None:
        """The expert's next action (None once the game is won): the walkthrough's while on track, else the
        hand-coded expert's, else `look`."""
        if won:
            return None
        if self.on_track and self.index < len(self.walkthrough):
            planned = self.walkthrough[self.index]
            if planned in admissible:
                return planned
        if self.handcoded_next and self.handcoded_next in admissible:
            return self.handcoded_next
        return "look"

    def _start_handcoded(self, path: Path, feedback: str) -> None:
        from alfworld.agents.expert import HandCodedTWAgent

        self.handcoded_next = None
        try:
            self.handcoded = HandCodedTWAgent(max_steps=10**9)
            self.handcoded.reset(str(path))  # reads traj_data.json beside the game file
            self.handcoded.observe(feedback)  # the banner tells it this is the room's intro
        except Exception:  # noqa: BLE001 - a fallback expert that cannot start just stays silent
            self.handcoded = None
