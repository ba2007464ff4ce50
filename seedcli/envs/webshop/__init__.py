"""WebShop (Yao et al., 2022; princeton-nlp/WebShop, MIT) as a pure-Python text environment.

    env.py          `WebShopEnv`, the environment protocol (what stages reach as `get_env("webshop")`)
    data.py         products and synthetic goals exactly as WebShop builds them (6,910 goals; test 0-499)
    game.py         BM25 search (seedcli.envs.lucene) and the text pages and actions of WebShop's text env
    episode.py      `WebShopGame`: one goal played in a session (reset / step -> StepResult)
    prompt.py       verl-agent's WebShop templates, the turn prompt, the page text as the agent reads it, tokenizer text
    projection.py   verl-agent's `webshop_projection`: reply -> (action, valid)
    reward.py       WebShop's purchase reward, quirks included; what the trainer's reward is made of; the leak rule
    rules.py        the offline rules analyzer's WebShop skills
    expert.py       the expert (search, page to the goal product, choose its options, buy) and a random policy

Nothing here imports torch.
"""
