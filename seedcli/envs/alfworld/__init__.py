"""ALFWorld (Shridhar et al., 2021) through the `alfworld` package over TextWorld's PDDL engine.

    env.py          `AlfWorldEnv`, the environment protocol (what stages reach as `get_env("alfworld")`)
    data.py         data root, splits, game discovery and selection
    game.py         TextWorld's PDDL environment for ALFRED games, built with its slow parts memoised
    episode.py      `AlfWorldGame`: one game played in this process (reset / step -> StepResult)
    prompt.py       the agent's turn prompt (versioned), the analysis prompt's first sentence, tokenizer text
    projection.py   reply -> (action, valid), and the reply that says an action
    reward.py       what the trainer's reward is made of (success), and the leak rule of hindsight skills
    rules.py        the offline rules analyzer's ALFWorld skills
    expert.py       the walkthrough expert and ALFWorld's hand-coded expert
    pool.py         `EnvPool`: ALFWorld game slots in worker processes with ALFWorld's own signature

Nothing here imports torch; alfworld and textworld are imported on a game's first reset.
"""
