"""Models by Hugging Face Hub id: `--model ORG/NAME[@REVISION]` resolved through `huggingface_hub`, so its cache,
HF_HOME (HF_HUB_CACHE), HF_HUB_OFFLINE and a token from the environment (HF_TOKEN, `hf auth login`) all apply.

    resolve_model("Qwen/Qwen2.5-0.5B-Instruct")       # → <cache>/models--Qwen--Qwen2.5-0.5B-Instruct/snapshots/<sha>
    resolve_model("runs/sft/latest/model")             # a path that exists is a path, whatever its spelling
    hub_origin(path)                                   # ("Qwen/Qwen2.5-0.5B-Instruct", "<sha>") for a snapshot

A spec is a Hub id only when nothing exists at that path and it reads `ORG/NAME` (huggingface_hub's own rules) with
an optional `@REVISION` (a branch, tag or commit). The files a model needs are downloaded (config, tokenizer,
safetensors; `pytorch_model*.bin` only where there are no safetensors); offline, the cached snapshot is used as it
is. Each id resolves once per process, so the preflight check and the stage read the same commit. The resolved
snapshot's path names the repository and the commit (`hub_origin`): the stages record both in the manifest.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from fnmatch import fnmatch
from functools import lru_cache
from pathlib import Path

from seedcli.errors import UserError

# what transformers (and vLLM) read from a model repository: config, generation config, tokenizer (json, BPE merges,
# sentencepiece, tiktoken), chat template, image processor; the weights as safetensors
MODEL_FILES = ["*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja", "*.safetensors"]
BIN_WEIGHTS = ["pytorch_model*.bin"]  # only for a repository that has no safetensors
_SPEC = re.compile(r"(?P<repo>[^/@\s]+/[^/@\s]+)(?:@(?P<revision>[^@\s]+))?")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_HUB_HINT = "`hf download {id}` (huggingface_hub's CLI; `huggingface-cli download` before 1.0)"


def parse_hub_id(spec: str | os.PathLike) -> tuple[str, str | None] | None:
    """(repo id, revision or None) when `spec` names a Hub model, else None: a path that exists always stays a path,
    and so does anything that is not `ORG/NAME[@REVISION]` by huggingface_hub's rules for a repo id."""
    text = str(spec)
    if isinstance(spec, Path) or os.path.lexists(text) or not (m := _SPEC.fullmatch(text)):
        return None
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(m["repo"])
    except HFValidationError:
        return None
    return m["repo"], m["revision"]


def resolve_model(spec: str | os.PathLike, flag: str = "--model") -> Path:
    """The local directory `spec` names: itself where it is not a Hub id (`parse_hub_id`), else the Hub snapshot
    it resolves to (downloaded where the Hub is reachable, from the cache otherwise), or a one-line UserError."""
    check_spelling(spec, flag)
    hub = parse_hub_id(spec)
    if hub is None:
        return Path(spec)
    from huggingface_hub import constants

    return _snapshot(*hub, str(constants.HF_HUB_CACHE), bool(constants.HF_HUB_OFFLINE), flag)


def check_spelling(spec: str | os.PathLike, flag: str = "--model") -> None:
    """Refuse, in one line, a spec that is neither a path this system can hold nor a Hub id: a name longer than a
    path may be (the filesystem's ENAMETOOLONG), or `ORG/NAME@` with nothing after the `@`."""
    text = str(spec)
    try:
        os.lstat(text)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise UserError(
                f"{flag} {text[:40]}…: a name of {len(text):,} characters, longer than a path may be here and than a "
                "Hub id; pass a model directory or a Hub id ORG/NAME[@REVISION]"
            ) from None
        if not isinstance(spec, Path) and text.endswith("@") and _SPEC.fullmatch(text[:-1]):
            raise UserError(
                f"{flag} {text}: nothing after the '@'; name a revision (ORG/NAME@REVISION: a branch, tag or commit) "
                f"or drop the '@' for the main branch ({text[:-1]})"
            ) from None


def hub_origin(model_dir: str | os.PathLike) -> tuple[str, str] | None:
    """(repo id, commit sha) when `model_dir` is a snapshot of huggingface_hub's cache
    (`.../models--ORG--NAME/snapshots/<sha>`), else None."""
    path = Path(model_dir).resolve()
    repo = path.parent.parent.name
    if path.parent.name != "snapshots" or not repo.startswith("models--") or not _COMMIT.fullmatch(path.name):
        return None
    return repo.removeprefix("models--").replace("--", "/"), path.name


def hub_fields(model_dir: str | os.PathLike, prefix: str = "inputs/model") -> dict[str, str]:
    """The manifest fields that name a Hub model exactly: `{prefix}_repo` and `{prefix}_commit` (the resolved
    sha); none for a model directory outside the Hub cache."""
    origin = hub_origin(model_dir)
    return {} if origin is None else {f"{prefix}_repo": origin[0], f"{prefix}_commit": origin[1]}


def copy_model(src: Path, dest: Path, spec: str) -> None:
    """Copy the files a model needs from `src` (a Hub snapshot's links followed) into the new directory `dest`, and
    for a Hub snapshot a provenance.json that names the id given, the repository and the resolved commit."""
    dest.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        if f.is_file() and any(fnmatch(f.name, p) for p in MODEL_FILES + BIN_WEIGHTS):
            shutil.copyfile(f, dest / f.name)
    if (origin := hub_origin(src)) is not None:
        provenance = {"model": spec, "hub_repo": origin[0], "hub_commit": origin[1]}
        (dest / "provenance.json").write_text(json.dumps(provenance, indent=1) + "\n")


@lru_cache(maxsize=32)
def _snapshot(repo: str, revision: str | None, cache_dir: str, offline: bool, flag: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    rev = revision or "main"
    shown = f"{flag} {repo}" + (f"@{revision}" if revision else "")
    get = _HUB_HINT.format(id=repo + (f" --revision {revision}" if revision else ""))
    kw = {"repo_id": repo, "revision": rev, "cache_dir": cache_dir, "local_files_only": offline}
    try:
        path = Path(snapshot_download(allow_patterns=MODEL_FILES, **kw))
        if not offline and not any(path.glob("*.safetensors")):
            path = Path(snapshot_download(allow_patterns=BIN_WEIGHTS, **kw))
    except RevisionNotFoundError:
        raise UserError(
            f"{shown}: the Hub repository {repo} has no revision {rev!r}; pass a branch, tag or commit it has"
        ) from None
    except (GatedRepoError, RepositoryNotFoundError):
        raise UserError(
            f"{shown}: no such directory, and no Hub repository {repo} this token can read (a private or gated one "
            "needs HF_TOKEN or `hf auth login`); check the spelling or pass a model directory"
        ) from None
    except LocalEntryNotFoundError as exc:
        if type(exc).__name__ == "IncompleteSnapshotError":
            why = f"its cached snapshot in {cache_dir} is incomplete"
        elif offline:
            why = f"not in the Hugging Face cache {cache_dir} (HF_HUB_OFFLINE=1)"
        else:
            why = f"not in the Hugging Face cache {cache_dir}, and the Hub cannot be reached"
        raise UserError(
            f"{shown}: no such directory, and {why}; run {get} on a machine that reaches the Hub, copy its cache "
            "here and point HF_HOME (or HF_HUB_CACHE) at it, or pass a model directory"
        ) from None
    except (HfHubHTTPError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{shown}: the Hub download failed ({first}); run the command again, or use {get}") from None
    return path
