"""Sokoban as verl-agent runs it (visual agents, issue 17), ported without `gym`.

game.py     `Sokoban`: verl-agent's room generator and seeding, gym-sokoban 0.0.6's moves, rewards, text grid
            and rgb_array image; `train_seeds`, `test_seeds`
expert.py   `solve`: the shortest plan by breadth-first search over (player, boxes) states
"""

from seedcli.envs.sokoban.game import Sokoban

__all__ = ["Sokoban"]
