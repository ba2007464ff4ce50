"""Trajectory, turn and skill records and their JSON Lines I/O (orjson, append-as-produced, crash tolerant).

Record schema 2 (environment plug-ins): a trajectory names its `env`, `task_id`, `category` and `score`. Schema-1
records (ALFWorld only: `game_file`, `task_type`, no `schema_version`) still load: they are migrated on read
(task_id = game_file, category = task_type, env = alfworld, score = won). A record of a newer schema is refused
with a one-line error naming both versions.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from seedcli.errors import UserError

T = TypeVar("T", bound=BaseModel)

RECORD_SCHEMA_VERSION = 2


def _migrate(data: object, kind: str, legacy: dict[str, str]) -> object:
    """Schema-1 fields renamed to schema 2 (ALFWorld's only); a newer schema is refused."""
    if not isinstance(data, dict):
        return data
    version = data.get("schema_version", 1)
    if isinstance(version, int) and version > RECORD_SCHEMA_VERSION:
        raise ValueError(
            f"{kind} record schema {version} is newer than this seedcli's ({RECORD_SCHEMA_VERSION}); upgrade seedcli"
        )
    if any(old in data for old in legacy):
        data = dict(data)
        for old, new in legacy.items():
            if old in data:
                value = data.pop(old)
                data.setdefault(new, value)
        data.setdefault("env", "alfworld")
    return data


class Turn(BaseModel):
    """One agent turn: what the agent saw, what it wrote, and what the game made of it."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(description="1-based step number within the episode")
    observation: str = Field(description="observation shown in this turn's prompt")
    admissible: list[str] = Field(
        description="admissible actions shown in the prompt (without 'help'); empty for free-text environments"
    )
    prompt: str = Field(description="the user message of this turn (before the chat template)")
    response: str = Field(description="the generated text")
    response_ids: list[int] = Field(default_factory=list, description="generated token ids, stop token included")
    logprobs: list[float] = Field(default_factory=list, description="engine log-prob of each generated token")
    action: str = Field(description="the action the environment's parser sent to the game")
    valid: bool = Field(description="the response follows the environment's format (ALFWorld: both tags, an action)")
    admissible_action: bool = Field(
        default=False, description="the action was one of the admissible actions (free text: the turn was valid)"
    )
    finish_reason: str = Field(default="stop", description="'stop' or 'length'")
    reward: float = Field(default=0.0, description="the environment's raw reward of this turn's step")
    image: str | None = Field(
        default=None, description="sha256 of the observation image (images/<sha256>.png in the run); None: text only"
    )


class Trajectory(BaseModel):
    """One finished episode of one task."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = Field(RECORD_SCHEMA_VERSION, description="record schema (2: env plug-ins)")
    episode_id: str
    group_id: str = Field(description="episodes of the same task in the same run share a group id")
    env: str = Field("alfworld", description="environment name (alfworld | webshop | search)")
    task_id: str = Field(description="the task's stable id (ALFWorld: game.tw-pddl path relative to ALFWORLD_DATA)")
    split: str
    category: str = Field(description="ALFWorld task type, WebShop product category, search data source")
    task: str
    turns: list[Turn]
    won: bool
    score: float = Field(0.0, ge=0.0, le=1.0, description="the episode's score in [0, 1] (ALFWorld: won)")
    reward: float = Field(description="success reward if won else 0 (invalid-turn penalties are per turn, in rl)")
    length: int
    engine: str
    model_id: str
    model_hash: str
    sampling: dict = Field(description="temperature, top_p, max_new_tokens, max_steps, history")
    prompt_version: str
    seed: int
    policy: str = Field(default="model", description="model | expert | random")

    @model_validator(mode="before")
    @classmethod
    def _schema1(cls, data: object) -> object:
        data = _migrate(data, "trajectory", {"game_file": "task_id", "task_type": "category"})
        if isinstance(data, dict) and "score" not in data and "won" in data and data.get("env") == "alfworld":
            data = {**data, "score": 1.0 if data["won"] else 0.0}
        return data

    @property
    def invalid_turns(self) -> int:
        return sum(not t.valid for t in self.turns)

    @property
    def env_return(self) -> float:
        """The sum of the environment's raw step rewards (Sokoban: -0.1 a step, +1 a box on target, +10 solved)."""
        return sum(t.reward for t in self.turns)

    @property
    def task_type(self) -> str:
        """Schema-1 name of `category`."""
        return self.category

    @property
    def game_file(self) -> str:
        """Schema-1 name of `task_id` (ALFWorld)."""
        return self.task_id

    def same_play(self, other: Trajectory | None, tol: float = 1e-4) -> bool:
        """Whether `other` played the same replies: the same tokens every turn, log-probs within `tol` (the benches'
        check that two schedules or two engine settings served the same work)."""
        if other is None or len(self.turns) != len(other.turns):
            return False
        return all(
            a.response_ids == b.response_ids
            and max((abs(p - q) for p, q in zip(a.logprobs, b.logprobs, strict=True)), default=0.0) < tol
            for a, b in zip(self.turns, other.turns, strict=True)
        )


class SkillRecord(BaseModel):
    """A hindsight skill written for one trajectory (kept), or the reason it was rejected."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = Field(RECORD_SCHEMA_VERSION, description="record schema (2: env plug-ins)")
    episode_id: str
    key: str = Field(description="hash of (analyzer, model, prompt version, trajectory)")
    env: str = Field("alfworld", description="environment of the trajectory")
    category: str = Field(description="the trajectory's category (ALFWorld task type)")
    task: str
    won: bool
    analyzer: str
    model: str
    prompt_version: str
    prompt: str = Field(description="the analysis prompt that was sent")
    images: list[str] = Field(
        default_factory=list,
        description="sha256 of each image a visual prompt showed, one per <image> placeholder (images/ of the collect run)",
    )
    raw: str = Field(description="the analyzer's raw answer")
    episode_summary: str | None = None
    episode_skill: str | None = None
    reason: str | None = Field(default=None, description="why the record was rejected; None when kept")
    usage: dict = Field(default_factory=dict, description="prompt_tokens, completion_tokens, latency_s, attempts")

    @model_validator(mode="before")
    @classmethod
    def _schema1(cls, data: object) -> object:
        return _migrate(data, "skill", {"task_type": "category"})

    @property
    def task_type(self) -> str:
        """Schema-1 name of `category`."""
        return self.category


def visible_floats(value: object) -> object:
    """`value` (a metrics row, or a list or dict inside one) with each non-finite float spelled out as the string
    "nan", "inf" or "-inf": orjson writes them as null, which a reader takes for "not logged"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: visible_floats(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [visible_floats(v) for v in value]
    return value


def dumps(record: BaseModel | dict) -> bytes:
    """One JSON line."""
    data = record.model_dump(mode="json") if isinstance(record, BaseModel) else record
    return orjson.dumps(data) + b"\n"


class JsonlWriter:
    """Appends records as a journal does: each line goes to the file at once (no buffer), and a write that fails
    part-way (a full disk, Ctrl-C) is cut back to the last whole record, so a killed or failed process leaves whole
    lines only and nothing is written again later (a buffered file retries its pending bytes when it is closed or
    collected, which can put a whole record after the half of it that reached the disk)."""

    def __init__(self, path: Path, fsync: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        repair_tail(self.path)
        self._fh = open(self.path, "ab", buffering=0)
        self._fsync = fsync

    def write(self, record: BaseModel | dict) -> None:
        view = memoryview(dumps(record))
        end = os.fstat(self._fh.fileno()).st_size  # where this record starts (another writer may have appended)
        try:
            while view:  # a short write (a disk filling up) writes the rest, or fails on the next call
                view = view[self._fh.write(view) :]
        except BaseException:
            self._cut(end)
            raise
        if self._fsync:
            os.fsync(self._fh.fileno())

    def _cut(self, end: int) -> None:
        """Drop what a failed write left after the last whole record (truncating needs no free space)."""
        try:
            os.ftruncate(self._fh.fileno(), end)
        except OSError:
            pass  # the reader cuts a half-written last line too (`repair_tail`)

    def close(self) -> None:
        if self._fh.closed:
            return
        try:
            os.fsync(self._fh.fileno())
        finally:
            self._fh.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def repair_tail(path: Path, model: type[BaseModel] | None = None) -> int:
    """Drop a half-written last line left by a crash or a full disk, as a journal does; returns the number of bytes
    removed. A last line without its newline is cut; with `model`, so is a last line that ends in a newline but does
    not parse as one record (a write that failed part-way and was retried whole after it). Only the last line: a bad
    line before good ones is damage the reader reports."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return 0
    with open(path, "rb+") as fh:
        size = fh.seek(0, os.SEEK_END)
        data_start = max(0, size - (1 << 22))
        fh.seek(data_start)
        tail = fh.read()
        body = tail[:-1] if tail.endswith(b"\n") else tail
        if body is tail or (model is not None and body.strip() and not _parses(body[body.rfind(b"\n") + 1 :], model)):
            cut = body.rfind(b"\n")
            if cut < 0 and data_start > 0:
                return 0  # a single line longer than 4 MiB: leave it to the reader to report
            new_size = data_start + cut + 1
            fh.truncate(new_size)
            if size > new_size:
                print(f"{path}: cut its half-written last line ({size - new_size} bytes)", file=sys.stderr)
            return size - new_size
    return 0


def _parses(line: bytes, model: type[BaseModel]) -> bool:
    """Whether `line` is one whole record of `model` (a newer schema's counts: the reader refuses it by name)."""
    try:
        data = orjson.loads(line)
        version = data.get("schema_version") if isinstance(data, dict) else None
        if not (isinstance(version, int) and version > RECORD_SCHEMA_VERSION):
            model.model_validate(data)
    except Exception:  # noqa: BLE001 - any parse or validation problem: not a whole record
        return False
    return True


def iter_jsonl(path: Path, model: type[T] | None = None) -> Iterator[T | dict]:
    """Read records; a malformed line is a one-line UserError naming the file and line."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: file not found")
    with open(path, "rb") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                data = orjson.loads(line)
                version = data.get("schema_version") if isinstance(data, dict) else None
                newer = model is not None and isinstance(version, int) and version > RECORD_SCHEMA_VERSION
                record = data if model is None or newer else model.model_validate(data)
            except Exception as exc:  # noqa: BLE001 - any parse/validation problem is the same user error
                first = str(exc).splitlines()[0][:200]
                raise UserError(
                    f"{path}:{lineno}: not a valid {model.__name__ if model else 'JSON'} record ({first}); "
                    "the file was modified or is from another version — rerun the stage that wrote it"
                ) from None
            if newer:
                raise UserError(
                    f"{path}:{lineno}: record schema {version} is newer than this seedcli's ({RECORD_SCHEMA_VERSION}); "
                    "upgrade seedcli to read it"
                )
            yield record


def read_jsonl(path: Path, model: type[T] | None = None) -> list[T | dict]:
    return list(iter_jsonl(path, model))


def write_jsonl(path: Path, records: Iterable[BaseModel | dict]) -> int:
    """Write a whole file atomically (temp + rename); returns the record count."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    try:
        with open(tmp, "wb") as fh:
            for record in records:
                fh.write(dumps(record))
                n += 1
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, Ctrl-C: no temp file is left behind, `path` stays as it was
        tmp.unlink(missing_ok=True)
        raise
    return n
