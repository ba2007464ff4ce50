"""EZPoints (gym-cards, RL4VLM; vendored in verl-agent) as a standalone game: two cards, build a formula worth 12.

    env.py          `EZPointsEnv`, the environment protocol (what stages reach as `get_env("ezpoints")`)
    game.py         `EZPoints(seed)`: cards, the 13 actions, step rules and rewards, image and text observations,
                    data root, splits
    episode.py      `EZPointsGame`: one game played (reset / step -> StepResult)
    prompt.py       verl-agent's EZPoints template and seedcli's text variant, the turn prompt, the task line,
                    the analysis prompt's first sentence, tokenizer text
    projection.py   verl-agent's `gym_projection`: reply -> (action, valid); the JSON reply
    reward.py       what the trainer's reward is made of (success; the step reward is only logged), the leak rule
    rules.py        the offline rules analyzer's EZPoints skills
    expert.py       `solve(game)`: an action sequence that wins, found by enumerating formulas; the warm start's thought

Nothing here imports torch.
"""
