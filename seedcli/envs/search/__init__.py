"""Search-QA (Search-R1's protocol): questions and splits (`data`), exact match (`reward`), retrieval in process or
over Search-R1's HTTP API (`retriever`, `server`), the agent's text (`prompt`, `projection`), the environment on the
protocol (`env.SearchEnv`) and its rules analyzer (`rules`). Importing this package loads nothing heavy."""
