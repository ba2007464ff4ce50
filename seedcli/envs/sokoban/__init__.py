"""Sokoban as verl-agent runs it (visual agents, issue 17), ported without `gym`.

    env.py          `SokobanEnv`, the environment protocol (what stages reach as `get_env("sokoban")`)
    game.py         `Sokoban`: verl-agent's room generator and seeding, gym-sokoban 0.0.6's moves, step rewards, text
                    grid and rgb_array image; `train_seeds`, `test_seeds`; the tiles' data root
    episode.py      `SokobanGame`: one room played (reset / step -> StepResult)
    prompt.py       verl-agent's Sokoban templates, the turn prompt, the analysis prompt's first sentence, tokenizer text
    projection.py   verl-agent's `sokoban_projection`: reply -> (move, valid)
    reward.py       what the trainer's reward is made of (success; the step reward is only logged), the leak rule
    rules.py        the offline rules analyzer's Sokoban skills
    expert.py       `solve`: the shortest plan by breadth-first search over (player, boxes) states

Nothing here imports torch.
"""
