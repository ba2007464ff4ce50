"""Search-QA (Search-R1's protocol). Importing this package loads nothing heavy.

env.py          `SearchEnv`, the environment protocol (what stages reach as `get_env("search")`)
data.py         questions and splits (closed train/dev, the test sets, or a JSONL file), the bundled corpus
retriever.py    retrieval: BM25 in process (seedcli.envs.lucene) or Search-R1's HTTP `/retrieve` API
server.py       `seed search-server`: a Search-R1-compatible `/retrieve` server over the BM25 retriever
episode.py      `SearchGame`: one question played (searches, then an answer)
prompt.py       verl-agent's search templates, the turn prompt, passages as the agent reads them, tokenizer text
projection.py   verl-agent's search projection: reply -> (search or answer, valid)
reward.py       exact match as Search-R1 scores it; what the trainer's reward is made of; the leak rule
rules.py        the offline rules analyzer's search skills
expert.py       the oracle: search the question, answer with a golden answer the passages hold
"""
