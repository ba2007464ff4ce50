"""EZPoints (gym-cards, RL4VLM; vendored in verl-agent) as a standalone game: two cards, build a formula worth 12.

    game.py     `EZPoints(seed)`: cards, the 13 actions, step rules, image and text observations, data root, splits
    expert.py   `solve(game)`: an action sequence that wins, found by enumerating formulas

    env.py      `EZPointsEnv`: the environment protocol (prompt, reply parser, tasks, expert); rules.py its rules skills

Nothing here imports torch.
"""

from seedcli.envs.ezpoints.expert import solve
from seedcli.envs.ezpoints.game import ACTION_NAMES, EZPoints, resolve_data_root, test_seeds, train_seeds

__all__ = ["ACTION_NAMES", "EZPoints", "resolve_data_root", "solve", "test_seeds", "train_seeds"]
