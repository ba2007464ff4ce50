"""Real episodes without a model, played in this process through the rollout loop: the expert, or the expert with
some turns replaced by the test's own actions (a real lost episode whose mistake the test knows)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from seedcli.envs.base import Environment, StepResult, Task
from seedcli.envs.pool import EnvPool
from seedcli.records import Trajectory
from seedcli.rollout import EpisodeSpec, RolloutSettings, play_episodes
from seedcli.rollout.episode import Generated


class ExpertWithSlips:
    """The expert, except at the turns of `slips` (1-based turn -> an action, or a function of the turn's
    StepResult that returns one)."""

    name = "expert"

    def __init__(self, env: Environment, slips: dict[int, str | Callable[[StepResult], str]] | None = None):
        self.env = env
        self.slips = dict(slips or {})

    def act(self, prompts, episodes, call) -> list[Generated]:
        out = []
        for ep in episodes:
            slip = self.slips.get(len(ep.turns) + 1)
            if slip is None:
                out.append(Generated(self.env.expert_response(ep.last)))
                continue
            action = slip(ep.last) if callable(slip) else slip
            out.append(Generated(self.env.format_response("I try something else.", action)))
        return out


def play(
    env: Environment, tasks: Sequence[Task], policy, max_steps: int | None = None, seed: int = 0
) -> list[Trajectory]:
    """`tasks` played once each by `policy` in an expert pool in this process, in task order."""
    out: list[Trajectory] = []
    specs = [EpisodeSpec(f"e{i:03d}", f"g{i:03d}", task=t) for i, t in enumerate(tasks)]
    settings = RolloutSettings(max_steps=max_steps or env.max_steps, history=env.history, seed=seed)
    with EnvPool(env, 0, expert=True) as pool:
        play_episodes(specs, policy, pool, settings, {"policy": policy.name}, out.append)
    return sorted(out, key=lambda t: t.episode_id)
