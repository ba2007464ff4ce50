"""seedcli: SEED (self-evolving on-policy distillation) for LLM agents, from a laptop to eight GPUs."""

__version__ = "0.1.0"
