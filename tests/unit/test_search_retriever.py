"""The retrieval client against a stand-in /retrieve server (stdlib, in a thread), and BM25 on a small corpus."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from seedcli.envs.search.retriever import BM25Retriever, HttpRetriever, load_corpus, normalise_url
from seedcli.errors import UserError


class FakeServer:
    """Answers Search-R1's /retrieve; `plan` holds per-request behaviours: 'ok', a status code, or 'sleep'."""

    def __init__(self, plan: list = ()):
        self.plan = list(plan)
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                what = outer.plan.pop(0) if outer.plan else "ok"
                if what == "sleep":
                    time.sleep(0.6)
                    what = "ok"
                if what == "ok":
                    result = [
                        [{"document": {"id": f"{q}-{k}", "contents": f'"{q}"\npassage {k}'}, "score": 10.0 - k}
                         for k in range(body["topk"])]
                        for q in body["queries"]
                    ]  # fmt: skip
                    data, status = json.dumps({"result": result}).encode(), 200
                else:
                    data, status = b'{"detail": "nope"}', int(what)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and hung up: that is the point of the timeout test

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/retrieve"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = FakeServer()
    yield s
    s.close()


def test_batches_and_request_shape(server: FakeServer) -> None:
    client = HttpRetriever(server.url, batch_size=2)
    out = client.search(["a", "b", "c", "d", "e"], topk=3)
    # 5 queries in batches of 2 -> 3 requests, results in query order
    assert [len(r["queries"]) for r in server.requests] == [2, 2, 1]
    assert server.requests[0] == {"queries": ["a", "b"], "topk": 3, "return_scores": True}
    assert [hits[0]["document"]["id"] for hits in out] == ["a-0", "b-0", "c-0", "d-0", "e-0"]
    assert [h["score"] for h in out[4]] == [10.0, 9.0, 8.0]
    client.close()


def test_retries_server_errors_then_succeeds(server: FakeServer) -> None:
    server.plan = [503, 502]
    client = HttpRetriever(server.url, max_retries=2, backoff=0.01)
    assert client.search(["q"], topk=1)[0][0]["document"]["id"] == "q-0"
    assert len(server.requests) == 3  # two failures, one success


def test_gives_up_after_bounded_retries(server: FakeServer, capsys) -> None:
    server.plan = [503] * 10
    client = HttpRetriever(server.url, max_retries=2, backoff=0.01)
    with pytest.raises(UserError, match=r"failed after 3 attempts \(HTTP 503 .*nope.*\)") as err:
        client.search(["q"])
    assert len(server.requests) == 3
    # a server that answers is running: the error says it fails, and does not advise starting one
    assert "running but failing" in str(err.value) and "seed retriever serve" not in str(err.value)
    assert capsys.readouterr().err.splitlines() == [
        f'retriever {server.url}: HTTP 503 ({{"detail": "nope"}}), retry {n}/2' for n in (1, 2)
    ]


def test_client_error_is_not_retried(server: FakeServer) -> None:
    server.plan = [404]
    client = HttpRetriever(server.url, max_retries=3, backoff=0.01)
    with pytest.raises(UserError, match="answered HTTP 404"):
        client.search(["q"])
    assert len(server.requests) == 1


def test_timeout_is_an_error_not_a_hang(server: FakeServer) -> None:
    server.plan = ["sleep"] * 5
    client = HttpRetriever(server.url, timeout=0.2, max_retries=1, backoff=0.01)
    start = time.monotonic()
    with pytest.raises(UserError, match=r"failed after 2 attempts \(no answer in 0.2s\); the server is up but") as e:
        client.search(["q"])
    assert time.monotonic() - start < 2.0  # 2 × 0.2 s timeouts + backoff, not the server's 0.6 s each
    assert "timeout: 60" in str(e.value) and "seed retriever serve" not in str(e.value)


def test_a_hanging_server_shows_each_retry_while_the_run_waits(server: FakeServer, capsys) -> None:
    server.plan = ["sleep"] * 5
    client = HttpRetriever(server.url, timeout=0.2, max_retries=2, backoff=0.01)
    with pytest.raises(UserError):
        client.search(["q"])
    assert capsys.readouterr().err.splitlines() == [
        f"retriever {server.url}: no answer in 0.2s, retry 1/2",
        f"retriever {server.url}: no answer in 0.2s, retry 2/2",
    ]


def test_dead_server_is_one_line_error() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = HttpRetriever(f"127.0.0.1:{port}", max_retries=2, backoff=0.01)
    with pytest.raises(UserError) as err:
        client.search(["q"])
    msg = str(err.value)
    assert "\n" not in msg and f"http://127.0.0.1:{port}/retrieve failed after 3 attempts (connection refused)" in msg
    assert "nothing listens there: start it" in msg and "seed retriever serve" in msg


def test_normalise_url() -> None:
    assert normalise_url("localhost:8000") == "http://localhost:8000/retrieve"
    assert normalise_url("http://h:1/") == "http://h:1/retrieve"
    assert normalise_url("https://h/api/retrieve") == "https://h/api/retrieve"
    with pytest.raises(UserError, match="not an http"):
        normalise_url("ftp://h/retrieve")


def test_bm25_on_a_small_corpus(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    rows = [
        {"id": "d0", "contents": '"Hamlet"\nHamlet is a tragedy written by William Shakespeare.'},
        {"id": "d1", "contents": '"Macbeth"\nMacbeth is a tragedy by Shakespeare about a Scottish king.'},
        {"id": "d2", "contents": '"Paris"\nParis is the capital of France.'},
    ]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = BM25Retriever(corpus)
    hits = r.search(["who wrote the tragedy hamlet", "capital of france", "the of"], topk=3)
    assert hits[0][0]["document"] == rows[0] and hits[0][0]["score"] > hits[0][1]["score"] > 0
    assert [h["document"]["id"] for h in hits[1]] == ["d2"]  # only passages sharing a term, as Lucene
    assert hits[2] == []  # stop words only: nothing matches
    assert len(r) == 3


def test_bad_corpus(tmp_path: Path) -> None:
    bad = tmp_path / "c.jsonl"
    bad.write_text('{"id": "x", "text": "no contents"}\n')
    with pytest.raises(UserError, match=r"c.jsonl:1: a passage needs a string field 'contents'"):
        load_corpus(bad)
    with pytest.raises(UserError, match="not found"):
        load_corpus(tmp_path / "missing.jsonl")
    (tmp_path / "corpus.jsonl").write_text('{"id": "d0", "contents": "x"}\n')
    with pytest.raises(
        UserError, match=rf"corpus {tmp_path} is a directory; give the JSONL file .* {tmp_path}/corpus.jsonl"
    ):
        load_corpus(tmp_path)


class EchoRetriever:
    """Stands in for BM25: one hit per query, scored by the query's length."""

    def search(self, queries, topk=3):
        return [[{"document": {"id": q, "contents": f'"{q}"\ntext'}, "score": float(len(q))}] * topk for q in queries]


def test_server_api_shapes() -> None:
    from fastapi.testclient import TestClient

    from seedcli.envs.search.server import create_app

    client = TestClient(create_app(EchoRetriever(), default_topk=2))
    # Search-R1's request, with scores
    out = client.post("/retrieve", json={"queries": ["ab", "c"], "topk": 1, "return_scores": True}).json()
    assert out == {"result": [[{"document": {"id": "ab", "contents": '"ab"\ntext'}, "score": 2.0}],
                              [{"document": {"id": "c", "contents": '"c"\ntext'}, "score": 1.0}]]}  # fmt: skip
    # without scores: bare documents; no topk: the server's default (2)
    out = client.post("/retrieve", json={"queries": ["ab"]}).json()
    assert out == {"result": [[{"id": "ab", "contents": '"ab"\ntext'}] * 2]}
    # verl-agent's single `query`
    assert len(client.post("/retrieve", json={"query": "x", "topk": 3}).json()["result"][0]) == 3
    assert client.post("/retrieve", json={"topk": 3}).status_code == 422
    assert client.post("/retrieve", json={"queries": ["x"], "topk": -1}).status_code == 422
    # topk 0 means "the default", as in Search-R1's server (`if not request.topk`)
    assert len(client.post("/retrieve", json={"queries": ["x"], "topk": 0}).json()["result"][0]) == 2
