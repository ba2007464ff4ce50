"""WebShop (Yao et al., 2022; princeton-nlp/WebShop, MIT) as a pure-Python text environment.

    data.py     products and synthetic goals exactly as WebShop builds them (6,910 goals; test 0-499)
    engine.py   BM25 search (seedcli.envs.lucene) and the text pages and actions of WebShop's text env
    reward.py   WebShop's purchase reward, quirks included
    expert.py   the expert (search, page to the goal product, choose its options, buy) and a random policy
    rules.py    the offline rules analyzer's WebShop skills
    env.py      `WebShopEnv`, the environment protocol (verl-agent's prompt, parser and rewards)

Nothing here imports torch.
"""
