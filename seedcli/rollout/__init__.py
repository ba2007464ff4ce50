"""Play episodes of any registered environment with a policy: collect, eval and rl all use this loop.

Two schedules, the same trajectories in fp32 (every request carries its own seed; vLLM on CUDA draws each request's
noise from (seed, position)); in bf16 the logits depend on the batch make-up, so a near-tie can part the two unless
vLLM runs batch-invariant kernels (`scripts/gpu_smoke.py` reports the share of identical trajectories):
- `async` (the default): each episode sends its next request as soon as its own environment step has returned; the
  engine decodes whatever requests are waiting, continuously (the hf engine's `ContinuousBatcher`: a finished reply
  leaves the batch at once and a waiting one takes its row), and the environment steps run in a thread, in the
  worker processes, while the engine generates for other episodes. An engine without continuous batching (vLLM
  here, a vision-language model) gets the requests that are ready, as one `generate` call.
- `lockstep`: every active episode advances together: one batched generation call per turn, which returns when its
  longest reply is done, then one parallel environment step for all.

Episodes are stepped in parallel worker processes (`seedcli.envs.pool.EnvPool`). The environment (`pool.env`)
renders the prompt, parses the action and sets the reward convention; nothing here knows which environment it plays.
A finished episode is handed to `on_done` at once, so the caller can append it to disk and a crash loses only
episodes still in play.
"""

from __future__ import annotations

from seedcli.rollout.episode import EpisodeSpec, EpisodeState, Generated, RolloutSettings, _derive_seed, turn_images
from seedcli.rollout.loop import episode_metrics, play_episodes
from seedcli.rollout.policies import ExpertPolicy, ModelPolicy, Policy, RandomPolicy

__all__ = [
    "EpisodeSpec",
    "EpisodeState",
    "ExpertPolicy",
    "Generated",
    "ModelPolicy",
    "Policy",
    "RandomPolicy",
    "RolloutSettings",
    "_derive_seed",
    "episode_metrics",
    "play_episodes",
    "turn_images",
]
