"""Episode slots of any registered environment, hosted by worker processes.

    env = get_env("webshop")
    tasks = env.select_tasks(env.list_tasks("test"), n=12, seed=0)
    with EnvPool(env, workers=2, expert=True) as pool:
        first = pool.reset_many([(slot, task) for slot, task in enumerate(tasks)])
        after = pool.step_many([(slot, r.expert_action) for slot, r in enumerate(first)])

Each worker is a fresh interpreter that imports only the environment's module (never torch): it rebuilds the
environment from `env.spec()` and keeps one `EnvGame` per slot it hosts (slot -> worker `slot % workers`).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import traceback
import weakref
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from seedcli.envs import get_env
from seedcli.envs.base import EnvGame, Environment, StepResult, Task
from seedcli.errors import EnvFault, UserError

_REPO_ROOT = Path(__file__).resolve().parents[2]


def _label(task: Any) -> str:
    return task.label if isinstance(task, Task) else str(task)


def _worker_main(fd: int, env_name: str, spec_json: str, expert: bool | str) -> None:
    """Run the worker loop; when the parent is gone (killed), its pipe breaks: exit quietly, no traceback."""
    try:
        _serve(fd, env_name, spec_json, expert)
    except (BrokenPipeError, ConnectionResetError, EOFError):
        sys.stderr.flush()
        os._exit(0)


def _serve(fd: int, env_name: str, spec_json: str, expert: bool | str) -> None:
    """Worker loop: serve ("reset", [(slot, task)]) / ("step", [(slot, action)]) / ("close",) over connection `fd`."""
    # Ctrl-C reaches the whole process group: the parent handles it and closes the pool; no worker tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Anything an environment's libraries print goes to stderr, never into the parent's stdout.
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    conn = Connection(fd)
    env = get_env(env_name, **json.loads(spec_json))
    games: dict[int, EnvGame] = {}
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        kind = msg[0]
        if kind == "close":
            for g in games.values():
                g.close()
            conn.send(("ok", None))
            return
        out = []
        for slot, arg in msg[1]:
            try:
                if kind == "reset":
                    game = games.get(slot)
                    if game is None:
                        game = games[slot] = env.new_game(expert=expert)
                    out.append(game.reset(arg))
                else:
                    if slot not in games:
                        raise RuntimeError(f"slot {slot} has no game: reset_many() it first")
                    out.append(games[slot].step(arg))
            except Exception as e:  # noqa: BLE001 - reported to the parent, which raises with the task's name
                conn.send(("error", slot, type(e).__name__, str(e), traceback.format_exc()))
                break
        else:
            conn.send(("ok", out))


class _Worker:
    def __init__(self, index: int, env: Environment, expert: bool | str, extra_env: dict[str, str]):
        self.index = index
        self.conn, child = multiprocessing.Pipe()
        environ = dict(os.environ)
        environ.update(extra_env)
        environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), environ.get("PYTHONPATH")) if p)
        environ.setdefault("OMP_NUM_THREADS", "1")
        spec = json.dumps(env.spec())
        code = (
            "from seedcli.envs.pool import _worker_main; "
            f"_worker_main({child.fileno()}, {env.name!r}, {spec!r}, {expert!r})"
        )
        # A fresh interpreter (not fork, not multiprocessing's spawn, which re-imports the parent's __main__ and
        # with it torch): the worker imports only the environment and its libraries.
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], pass_fds=(child.fileno(),), env=environ, stdin=subprocess.DEVNULL
        )
        child.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()


def _shutdown(workers: list[_Worker]) -> None:
    for w in workers:
        try:
            if w.proc.poll() is None:
                w.conn.send(("close",))
        except (OSError, BrokenPipeError):
            pass
    deadline = time.monotonic() + 5.0
    for w in workers:
        try:
            w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        w.kill()


class EnvPool:
    """Episode slots of `env` hosted by `workers` worker processes (slot -> worker `slot % workers`; workers=0:
    this process).

    reset_many / step_many run each worker's requests in parallel with the other workers' and return results in
    input order. A worker that dies or exceeds `timeout_s` seconds per request raises RuntimeError naming the task."""

    def __init__(
        self,
        env: Environment,
        workers: int,
        expert: bool | str = False,
        timeout_s: float = 300.0,
        worker_environ: dict[str, str] | None = None,
    ):
        if workers < 0:
            raise UserError(f"env workers must be >= 0, got {workers}")
        if expert not in env.expert_modes:
            if env.expert_modes == (False,):
                raise UserError(f"{env.no_expert()}; play it with the model or the random policy")
            raise ValueError(f"{env.name}: expert must be one of {env.expert_modes}, got {expert!r}")
        self.env = env
        self.workers = workers
        self.expert = expert
        self.timeout_s = timeout_s
        self._slot_task: dict[int, str] = {}
        self._local: dict[int, EnvGame] = {}
        self._procs: list[_Worker] = [_Worker(i, env, expert, worker_environ or {}) for i in range(workers)]
        self._finalizer = weakref.finalize(self, _shutdown, self._procs)

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def reset_many(self, items: Sequence[tuple[int, Task]]) -> list[StepResult]:
        """Start a task in each slot (a slot's previous episode is dropped)."""
        requests = []
        for slot, task in items:
            self._slot_task[slot] = _label(task)
            requests.append((slot, self._task_arg(task)))
        return self._run("reset", requests)

    def step_many(self, items: Sequence[tuple[int, str]]) -> list[StepResult]:
        """Send one action to each slot's episode."""
        return self._run("step", [(slot, action) for slot, action in items])

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        for g in self._local.values():
            g.close()
        self._local.clear()
        self._finalizer()

    # -- internals ------------------------------------------------------------------------------------------------

    def _task_arg(self, task: Task) -> Any:
        """What is sent to the worker for a reset (the task itself; subclasses may convert)."""
        return task

    def _run(self, kind: str, requests: list[tuple[int, Any]]) -> list[StepResult]:
        if len({slot for slot, _ in requests}) != len(requests):
            raise ValueError(f"{kind}_many: a slot appears twice in one call")
        if self.workers == 0:
            return [self._run_local(kind, slot, arg) for slot, arg in requests]
        if not self._finalizer.alive:
            raise RuntimeError("EnvPool is closed")
        by_worker: dict[int, list[int]] = {}
        for i, (slot, _) in enumerate(requests):
            by_worker.setdefault(slot % self.workers, []).append(i)
        for w, idx in by_worker.items():
            try:
                self._procs[w].conn.send((kind, [requests[i] for i in idx]))
            except (OSError, BrokenPipeError):
                self._fail(w, [requests[i][0] for i in idx], "its pipe is closed")
        results: list[StepResult | None] = [None] * len(requests)
        error = None
        start = time.monotonic()
        for w, idx in by_worker.items():  # read every reply, even after an error, so no answer is left in a pipe
            slots = [requests[i][0] for i in idx]
            reply = self._receive(w, slots, deadline=start + self.timeout_s * len(idx))
            if reply[0] == "error":
                error = error or (w, *reply[1:])
                continue
            for i, res in zip(idx, reply[1], strict=True):
                results[i] = res
        if error is not None:
            w, slot, exc_type, message, tb = error
            task = self._slot_task.get(slot, "?")
            if exc_type == "UserError":
                raise UserError(message)
            if exc_type == "EnvFault":  # the environment's own fault: its one line, the worker's traceback kept
                raise EnvFault(message, tb)
            raise RuntimeError(f"env worker {w} failed on {kind} of slot {slot} ({task}): {exc_type}: {message}\n{tb}")
        return results  # type: ignore[return-value]

    def _run_local(self, kind: str, slot: int, arg: Any) -> StepResult:
        if kind == "step" and slot not in self._local:
            raise RuntimeError(f"slot {slot} has no game: reset_many() it first")
        try:
            if kind == "reset":
                game = self._local.get(slot)
                if game is None:
                    game = self._local[slot] = self.env.new_game(expert=self.expert)
                return game.reset(arg)
            return self._local[slot].step(arg)
        except UserError:
            raise
        except Exception as e:  # same message as from a worker: which task failed
            task = self._slot_task.get(slot, "?")
            raise RuntimeError(f"{kind} of slot {slot} ({task}) failed: {type(e).__name__}: {e}") from e

    def _receive(self, w: int, slots: list[int], deadline: float):
        worker = self._procs[w]
        while True:
            try:
                if worker.conn.poll(0.2):
                    return worker.conn.recv()
            except (EOFError, OSError):
                time.sleep(0.05)  # the worker is gone: let it exit, then the check below reports it
            code = worker.proc.poll()
            if code is not None:
                self._fail(w, slots, f"it exited with code {code}")
            if time.monotonic() > deadline:
                self._fail(w, slots, f"no answer within {self.timeout_s:.0f} s per game (it was killed)")

    def _fail(self, w: int, slots: list[int], why: str):
        names = ", ".join(f"slot {s} ({self._slot_task.get(s, '?')})" for s in slots)
        self.close()
        raise RuntimeError(f"env worker {w} failed while playing {names}: {why}; the pool is closed")
