"""Generation and scoring back ends (hf: transformers, vllm: vLLM) behind one interface, and tiny offline models."""

from seedcli.engines.base import Completion, Engine, load_engine

__all__ = ["Completion", "Engine", "load_engine"]
