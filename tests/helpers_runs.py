"""Run directories built by hand for tests, sealed with a complete manifest as `Run.complete` seals a stage's run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from seedcli.artifacts import (
    MANIFEST,
    InputRef,
    Manifest,
    OutputFile,
    atomic_write_bytes,
    manifest_sha256,
    read_manifest,
    sha256_file,
    utc_now,
)
from seedcli.config import EvalConfig


def seal_run(
    run_dir: Path, stage: str, config: dict | None = None, inputs: Sequence[Path] = (), created: str | None = None
) -> Manifest:
    """Write `run_dir`/manifest.json: a complete `stage` run whose outputs are every file now in the directory (each
    hashed), chained to the run directories `inputs` by their manifests' sha256. An eval run's config is EvalConfig's
    defaults updated with `config`; another stage's is `config` as given."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if stage == "eval":
        config = {**EvalConfig().model_dump(mode="json"), **(config or {})}
    files = sorted(p for p in run_dir.rglob("*") if p.is_file() and p.name != MANIFEST)
    now = created or utc_now()
    manifest = Manifest(
        stage=stage,
        run_id=run_dir.name,
        status="complete",
        created=now,
        finished=now,
        config=config or {},
        config_hash="0" * 64,
        inputs=[
            InputRef(
                stage=read_manifest(d).stage,
                run_id=Path(d).name,
                path=str(Path(d).resolve()),
                manifest_sha256=manifest_sha256(d),
            )
            for d in inputs
        ],
        outputs=[
            OutputFile(path=p.relative_to(run_dir).as_posix(), bytes=p.stat().st_size, sha256=sha256_file(p))
            for p in files
        ],
    )
    atomic_write_bytes(run_dir / MANIFEST, manifest.model_dump_json(indent=2).encode())
    return manifest


def flip_byte(path: Path, offset: int = -1) -> None:
    """Change one byte of a file in place (the same size: only its sha256 tells)."""
    data = bytearray(Path(path).read_bytes())
    data[offset] ^= 0x01
    Path(path).write_bytes(bytes(data))
