"""An OpenEnv environment built with OpenEnv's own server classes, for the openenv adapter's tests: guess a secret
number from 1 to 16 (the seed draws it) in at most five guesses, with "higher"/"lower" hints; reward 1 for the right
guess. Served by the adapter itself (`env_options '{app: tests.openenv_game:app}'`: uvicorn in a subprocess).
"""

from __future__ import annotations

import random
from typing import Any
from uuid import uuid4

from openenv.core.env_server import Action, Environment, Observation, State, create_app
from openenv.core.env_server.types import EnvironmentMetadata
from pydantic import Field

LOW, HIGH, TURNS = 1, 16, 5


class GuessAction(Action):
    guess: str = Field(description="the number guessed")


class GuessObservation(Observation):
    message: str = Field("", description="the game's answer")


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.secret = LOW

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.secret = random.Random(seed).randint(LOW, HIGH)
        return GuessObservation(message=f"Guess the secret number from {LOW} to {HIGH}; you have {TURNS} guesses.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        text = action.guess.strip().strip("[]")
        if not text.lstrip("-").isdigit():
            done = self._state.step_count >= TURNS
            return GuessObservation(message=f"{action.guess!r} is not a number.", reward=0.0, done=done)
        guess = int(text)
        if guess == self.secret:
            return GuessObservation(message=f"{guess} is right!", reward=1.0, done=True)
        hint = "higher" if guess < self.secret else "lower"
        return GuessObservation(
            message=f"{guess} is wrong: the secret is {hint}.", reward=0.0, done=self._state.step_count >= TURNS
        )

    @property
    def state(self) -> State:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="GuessNumber",
            description=f"find the secret number from {LOW} to {HIGH} in at most {TURNS} guesses",
            version="1.0.0",
        )


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess_number", max_concurrent_envs=32)
