"""Tiny models for tests: the tiny preset, a variant that ends its turns early, perturbed weights, and a bare
random Qwen2 for the pure loss and scoring tests."""

from __future__ import annotations

from pathlib import Path

import torch

from seedcli.engines.tiny import EOS_TOKEN, build_tiny_model
from seedcli.envs import sample_texts

# ALFWorld-like chats of clearly different lengths, so batches need padding
# a model shape small enough for warm-start tests on two shared cores: 2 layers, hidden 64 would break vLLM's head_dim
# rule but is fine for hf
SMALL_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}

CHATS = [
    [{"role": "user", "content": "look"}],
    [{"role": "user", "content": "Your task is to: put a clean mug in coffeemachine. You arrive at countertop 1."}],
    [
        {"role": "system", "content": "You are an expert agent operating in the ALFRED Embodied Environment."},
        {
            "role": "user",
            "content": "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a cabinet 2, "
            "a countertop 1, a fridge 1, a microwave 1, a sinkbasin 1. Your task is to: heat some egg and put it in "
            "garbagecan. Your admissible actions of the current situation are: [go to cabinet 1, go to fridge 1, look].",
        },
    ],
]


def build_test_model(out_dir: Path, seed: int = 0) -> Path:
    """The default tiny preset (BPE on the environments' data text, Qwen2 shape) at `out_dir`."""
    return build_tiny_model(out_dir, preset="tiny", seed=seed, corpus=sample_texts())


def build_stopping_model(src_dir: Path, out_dir: Path, strength: float = 6.0) -> Path:
    """Copy of `src_dir` with an untied lm_head whose <|im_end|> row points along the mean final hidden state, so
    sampled turns end after a few to a few dozen tokens (a random model almost never emits <|im_end|>)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(src_dir)
    model = AutoModelForCausalLM.from_pretrained(src_dir, tie_word_embeddings=False)
    im_end = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    prompts = [tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=False) for chat in CHATS]
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)
        hidden = torch.cat([model(torch.tensor([p]), output_hidden_states=True).hidden_states[-1][0] for p in prompts])
        mean = hidden.mean(0)  # [H]
        model.lm_head.weight[im_end] = strength * mean / mean.norm() ** 2
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def perturbed_state_dict(model_dir: Path, scale: float = 0.05, seed: int = 1) -> dict[str, torch.Tensor]:
    """The model's weights plus seeded Gaussian noise: a stand-in for one optimiser step."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, tensor in model.state_dict().items():
        noise = torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype) * scale
        state[name] = tensor + noise
    if model.config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


def tiny_lm(seed: int = 0, vocab: int = 97, max_positions: int = 128, tie: bool = True):
    """A random two-layer Qwen2ForCausalLM (hidden 32) in fp32 and eval mode; no tokenizer, no files."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=max_positions, tie_word_embeddings=tie,
    )  # fmt: skip
    return transformers.Qwen2ForCausalLM(config).float().eval()
