"""`seed retriever serve` as a subprocess on a free loopback port: it serves exactly what in-process BM25 returns,
the search environment plays identically through it, and a server killed mid-run is a one-line error."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from seedcli.envs.search.data import default_corpus, load_split
from seedcli.envs.search.env import SearchEnv
from seedcli.envs.search.retriever import BM25Retriever, HttpRetriever
from seedcli.errors import UserError

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(corpus: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "seedcli", "retriever", "serve", "--corpus", str(corpus), "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120  # indexing 10k passages takes a few seconds on a busy core
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {proc.stdout.read()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as resp:
                if json.load(resp) == {"status": "ok"}:
                    return proc
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise AssertionError("server did not come up within 120 s")


@pytest.fixture(scope="module")
def corpus() -> Path:
    try:
        return default_corpus()
    except UserError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def server(corpus: Path):
    port = free_port()
    proc = start_server(corpus, port)
    yield f"http://127.0.0.1:{port}/retrieve"
    proc.kill()
    proc.wait()


def test_served_equals_in_process(corpus: Path, server: str) -> None:
    questions = [q.question for q in load_split("dev")[:40]]
    queries = [*questions, "the of and", "", "Ælfgar, Earl of Mercia", "\u00e9t\u00e9 \u2013 1990s"]
    local = BM25Retriever(corpus).search(queries, topk=3)
    served = HttpRetriever(server, batch_size=16).search(queries, topk=3)
    assert served == local  # same documents, same order, bit-identical scores (floats survive JSON)
    assert sum(len(h) for h in local) >= 3 * len(questions)  # the questions do retrieve passages
    # Search-R1's shape without scores: bare documents
    body = json.dumps({"queries": queries[:2], "topk": 2}).encode()
    req = urllib.request.Request(server, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        bare = json.load(resp)["result"]
    assert bare == [[h["document"] for h in hits[:2]] for hits in local[:2]]


def test_env_plays_the_same_through_the_server(server: str) -> None:
    """The expert on the first 30 dev questions: identical observations and scores with either back end."""
    local, remote = SearchEnv(), SearchEnv(search_url=server)
    tasks = local.list_tasks("dev")[:30]
    scores = {}
    for name, env in (("local", local), ("remote", remote)):
        played = []
        for task in tasks:
            game = env.new_game(expert=True)
            r = game.reset(task)
            trace = []
            while not r.done:
                r = game.step(env.parse_action(env.expert_response(r))[0])
                trace.append((r.observation, r.score))
            played.append(trace)
        scores[name] = played
    assert scores["remote"] == scores["local"]
    assert 0 < sum(t[-1][1] for t in scores["local"]) < len(tasks)  # some found, some not: a real comparison


def test_killed_server_is_a_one_line_error(corpus: Path) -> None:
    port = free_port()
    proc = start_server(corpus, port)
    client = HttpRetriever(f"http://127.0.0.1:{port}/retrieve", timeout=5, max_retries=2, backoff=0.1)
    questions = [q.question for q in load_split("dev")[:10]]
    try:
        for i, q in enumerate(questions):
            if i == 5:
                proc.kill()  # mid-run
                proc.wait()
                start = time.monotonic()
                with pytest.raises(UserError) as err:
                    client.search([q])
                elapsed = time.monotonic() - start
                break
            assert len(client.search([q])[0]) == 3
    finally:
        if proc.poll() is None:
            proc.kill()
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"retrieval server http://127.0.0.1:{port}/retrieve failed after 3 attempts")
    assert elapsed < 5  # refused connections fail fast: backoff 0.1 + 0.2 s, no hang


def test_port_in_use_is_one_line(corpus: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "seedcli", "retriever", "serve", "--corpus", str(corpus), "--port", str(port)],
            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
    assert out.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def seed_eval(runs: Path, *options: str) -> dict:
    cmd = [sys.executable, "-m", "seedcli", "eval", "--env", "search", "--policy", "expert", "--workers", "2",
           "--runs-dir", str(runs), "--json", *options]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    run_dir = runs / "eval" / summary["run_id"]
    episodes = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    return {"results": json.loads((run_dir / "results.json").read_text()), "episodes": episodes}


@pytest.mark.slow
def test_seed_eval_same_in_process_and_served(tmp_path: Path, server: str) -> None:
    """`seed eval --env search --policy expert` on dev (10 questions per data source): identical figures and
    episodes with in-process BM25 and through `seed retriever serve`."""
    local = seed_eval(tmp_path / "a", "--split", "dev", "env_options={limit: 10}")
    served = seed_eval(tmp_path / "b", "--split", "dev", f"env_options={{limit: 10, search_url: '{server}'}}")
    keys = ("macro_success", "micro_success", "mean_score", "macro_score", "wins", "categories")
    assert {k: local["results"][k] for k in keys} == {k: served["results"][k] for k in keys}
    assert local["results"]["episodes"] == 30
    turns = [[(t["observation"], t["response"]) for t in ep["turns"]] for ep in local["episodes"]]
    assert turns == [[(t["observation"], t["response"]) for t in ep["turns"]] for ep in served["episodes"]]
    assert 0 < local["results"]["wins"] < 30
