"""An OpenEnv environment server as an environment (`--env openenv`, `pip install -e '.[openenv]'`).

Every episode slot talks to the server through OpenEnv's own client (`openenv.core.GenericEnvClient`, synchronous
wrapper; one WebSocket session, so one environment instance on the server, per slot): `reset(seed=...)`, then
`step({action_field: reply's action})`. The server is either one the user started (`url: http://host:port`) or one
seedcli starts (`app: package.module:app`, an app made with OpenEnv's `create_app`): uvicorn serves it on a free local
port in a subprocess, from the first game to the end of the run; the env worker processes use the same server.

A task is a reset seed: train holds seeds 0..train_size-1, test the seeds from 1,000,000 on (OpenEnv passes the seed
to the environment's `reset`). The task line is the server's own description (`GET /metadata`); an observation is the
observation's fields, one per line (or `observation_field` alone); the reply's action fills the Action's one string
field (read from `GET /schema`; `action_field` names it when there are several). The server's reward and end are
used: the episode ends when the observation says done, its reward is the sum of the step rewards, and it is a win
when that sum reaches `win_reward`. OpenEnv has no expert.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from seedcli.envs.adapters import require
from seedcli.envs.base import EnvOptions
from seedcli.envs.card import EnvCard
from seedcli.envs.text import TextEnv
from seedcli.errors import UserError

PYPI = "openenv-core==0.3.0"
EXTRA = "openenv"
TITLE = "OpenEnv"
TEST_OFFSET = 1_000_000  # the test split's first seed
START_TIMEOUT_S = 60.0
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # a local or named server: no proxy


def _library():
    return require("openenv.core", EXTRA, PYPI, TITLE)


class OpenEnvOptions(EnvOptions):
    url: str | None = Field(None, description="a running OpenEnv server, http://host:port (or give app)")
    app: str | None = Field(
        None, description="an OpenEnv server app, package.module:app (OpenEnv's create_app), that seedcli serves itself"
    )
    action_field: str | None = Field(
        None, description="the Action field the reply fills (default: its one string field)"
    )
    observation_field: str | None = Field(None, description="the observation field shown (default: all, one a line)")
    win_reward: float = Field(1.0, description="an episode whose rewards sum to at least this is a win")
    train_size: int = Field(1000, ge=1, le=TEST_OFFSET, description="reset seeds in the train split")
    test_size: int = Field(100, ge=1, le=TEST_OFFSET, description="reset seeds in the test split")

    @field_validator("url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://", "ws://", "wss://")):
            raise ValueError("give the server's address as http://host:port")
        return value.rstrip("/") if value else value

    @field_validator("app")
    @classmethod
    def _module_path(cls, value: str | None, info) -> str | None:
        if value is not None and (":" not in value or not all(value.split(":", 1))):
            raise ValueError("give the server app as package.module:app (the object OpenEnv's create_app returned)")
        if value is not None and info.data.get("url"):
            raise ValueError("give url (a running server) or app (one seedcli starts), not both")
        return value


class OpenEnvEnv(TextEnv):
    """OpenEnv (see the module docstring)."""

    title = TITLE
    prompt_version = "openenv-v1"
    max_steps = 20
    history = 4
    rules_version = "openenv-rules-v1"
    options_model = OpenEnvOptions
    card = EnvCard(
        metric_labels={"micro_success": "success", "mean_score": "score"},
        offline_note="Episodes are played on an OpenEnv server through OpenEnv's own client.",
    )

    def __init__(self, data_root: str | None = None, **options: Any):
        super().__init__(data_root, **options)
        self.opts = OpenEnvOptions(**self.options)
        self.client: Any = None
        self.field = ""
        self.description = ""

    # -- the server ----------------------------------------------------------------------------------------------

    def base_url(self) -> str:
        """The server's address: `url`, or the local server of `app` (started on first use)."""
        _library()
        if self.opts.url:
            return self.opts.url
        if self.opts.app:
            return serve(self.opts.app)
        raise UserError("openenv needs a server: env_options '{url: http://host:port}' or '{app: package.module:app}'")

    def spec(self) -> dict[str, Any]:
        self.base_url()  # an `app` server is up before the pool starts its workers, which then use it too
        return super().spec()

    def resolve_data_root(self) -> Path:
        """OpenEnv's own folder (the environment is the server's; a `data_root` given is kept)."""
        if not (self.opts.url or self.opts.app):
            self.base_url()  # says what is missing
        library = _library()
        return super().resolve_data_root() if self.data_root else Path(library.__file__).resolve().parent

    def _get(self, path: str) -> dict:
        url = self.base_url()
        try:
            with _DIRECT.open(f"{url.replace('ws', 'http', 1)}{path}", timeout=30) as reply:
                return json.loads(reply.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise UserError(f"OpenEnv server at {url} did not answer GET {path} ({exc}); is it running?") from None

    def _action_field(self) -> str:
        if self.opts.action_field:
            return self.opts.action_field
        schema = self._get("/schema").get("action", {})
        props = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
        strings = [k for k, v in props.items() if v.get("type") == "string"]
        required = [k for k in strings if k in schema.get("required", [])]
        if len(required or strings) != 1:
            raise UserError(
                f"OpenEnv server's action has fields {', '.join(props) or 'none'}: name the one the reply fills with "
                "env_options '{action_field: NAME}'"
            )
        return (required or strings)[0]

    # -- the game ------------------------------------------------------------------------------------------------

    def tasks(self, split: str) -> list[dict]:
        start, n = (TEST_OFFSET, self.opts.test_size) if split == "test" else (0, self.opts.train_size)
        return [{"id": str(seed), "seed": seed} for seed in range(start, start + n)]

    def task_text(self, task: dict) -> str:
        return self.description

    def reset(self, task: dict) -> str:
        if self.client is None:
            meta = self._get("/metadata")
            self.description = str(meta.get("description") or meta.get("name") or "play the OpenEnv environment")
            self.field = self._action_field()
            self.client = _library().GenericEnvClient(base_url=self.base_url()).sync()
            self.client.connect()
        return self._observation(self.client.reset(seed=task["seed"]))[0]

    def step(self, action: str) -> tuple[str, float, bool]:
        return self._observation(self.client.step({self.field: action}))

    def _observation(self, result) -> tuple[str, float, bool]:
        fields = dict(result.observation or {})
        if self.opts.observation_field:
            if self.opts.observation_field not in fields:
                raise UserError(
                    f"OpenEnv observation has no field {self.opts.observation_field!r} (it has {', '.join(fields)})"
                )
            text = str(fields[self.opts.observation_field])
        elif len(fields) == 1:
            text = str(next(iter(fields.values())))
        else:
            text = "\n".join(f"{k}: {v}" for k, v in fields.items())
        return text, float(result.reward or 0.0), bool(result.done)

    def is_won(self, episode_return: float, done: bool) -> bool:
        return bool(done and episode_return >= self.opts.win_reward)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(app: str) -> str:
    """The address of a local OpenEnv server for `app`: this process's (or, in an env worker, its parent's, named in
    an environment variable), else one started now with uvicorn, stopped when this process exits."""
    key = "SEEDCLI_OPENENV_" + hashlib.sha256(app.encode()).hexdigest()[:12].upper()
    if os.environ.get(key):
        return os.environ[key]
    port = _free_port()
    log = tempfile.TemporaryFile()
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)}
    cmd = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=environ)
    atexit.register(_stop, proc)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = _log_lines(log)
            raise UserError(
                f"OpenEnv server app {app} did not start: {tail[-1] if tail else f'exit {proc.returncode}'}"
            )
        try:
            with _DIRECT.open(f"{url}/health", timeout=2):
                os.environ[key] = url
                return url
        except urllib.error.HTTPError as exc:  # uvicorn serves it, but it is no OpenEnv app: it will never answer
            _stop(proc)
            why = next((line.strip() for line in reversed(_log_lines(log)) if "Error" in line), "")
            raise UserError(
                f"OpenEnv server app {app} is not an OpenEnv server: GET /health answered HTTP {exc.code}"
                f"{f' ({why})' if why else ''}; give app the object OpenEnv's create_app returned (package.module:app)"
            ) from None
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    _stop(proc)
    raise UserError(f"OpenEnv server app {app} did not answer on {url} within {START_TIMEOUT_S:.0f} s")


def _log_lines(log) -> list[str]:
    """The server's log so far, its non-blank lines."""
    log.seek(0)
    return [line for line in log.read().decode(errors="replace").splitlines() if line.strip()]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
