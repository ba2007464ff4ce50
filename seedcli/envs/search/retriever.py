"""Retrieval for the search environment: one client interface, two back ends.

- `BM25Retriever`: in process, BM25 with Lucene's parameters and a Lucene-like English analyzer
  (`seedcli.envs.lucene`, shared with WebShop) over a corpus in wiki-18 format (`{"id", "contents"}` a line).
- `HttpRetriever`: any server with Search-R1's API, `POST /retrieve` with `{"queries", "topk", "return_scores"}`
  → `{"result": [[{"document": {...}, "score": s}, ...], ...]}` (Search-R1's e5 + faiss server over wiki-18, or
  `seed retriever serve`). Batched, with timeouts and bounded retries; a dead server is a one-line UserError.

Both return, per query, a list of hits `{"document": {"id", "contents"}, "score": float}`, best first.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from seedcli.envs.search.data import iter_json_objects
from seedcli.errors import UserError

TOPK = 3  # Search-R1 and verl-agent show the top 3 passages
Hit = dict[str, Any]


class Retriever(ABC):
    """Search a passage collection; `search` is batched: one list of hits per query, in query order."""

    @abstractmethod
    def search(self, queries: Sequence[str], topk: int = TOPK) -> list[list[Hit]]:
        """The best `topk` passages for each query, as `{"document": {"id", "contents"}, "score"}` dicts."""

    def close(self) -> None:  # noqa: B027 - an optional hook, not every back end holds resources
        """Release connections or memory (a no-op by default)."""


# -- the corpus ---------------------------------------------------------------------------------------------------


def load_corpus(path: str | os.PathLike) -> list[dict[str, str]]:
    """Passages of a wiki-18-format JSONL (`{"id", "contents": "\\"Title\\"\\ntext"}`), in file order."""
    path = Path(path)
    if path.is_dir():
        inside = path / "corpus.jsonl"
        example = f" such as {inside}" if inside.is_file() else ""
        raise UserError(f'corpus {path} is a directory; give the JSONL file of {{"id", "contents"}} passages{example}')
    if not path.is_file():
        raise UserError(f'corpus {path} not found; give a JSONL of {{"id", "contents"}} passages (env.corpus)')
    docs: list[dict[str, str]] = []
    for lineno, rec in iter_json_objects(path):
        if not isinstance(rec.get("contents"), str):
            raise UserError(f"{path}:{lineno}: a passage needs a string field 'contents' (wiki-18 format)")
        docs.append({"id": str(rec.get("id", len(docs))), "contents": rec["contents"]})
    if not docs:
        raise UserError(f"corpus {path} is empty; it needs one JSON passage per line")
    return docs


def split_contents(contents: str) -> tuple[str, str]:
    """(title, text) of a wiki-18 passage: the first line, unquoted, and the rest (Search-R1's split)."""
    lines = contents.split("\n")
    return lines[0].strip('"'), "\n".join(lines[1:])


# -- in process ---------------------------------------------------------------------------------------------------


class BM25Retriever(Retriever):
    """BM25 over a wiki-18-format corpus, scored as pyserini's LuceneSearcher scores Search-R1's BM25 index
    (Anserini's English analyzer over `contents`, k1 0.9, b 0.4). Only passages sharing a term with the query are
    returned, as Lucene does; the index is built once per process and corpus file."""

    def __init__(self, corpus: str | os.PathLike):
        self.corpus_path = Path(corpus).expanduser().resolve()
        self.docs, self.index = _bm25_index(str(self.corpus_path))

    def __len__(self) -> int:
        return len(self.docs)

    def search(self, queries: Sequence[str], topk: int = TOPK) -> list[list[Hit]]:
        return [
            [{"document": dict(self.docs[i]), "score": float(score)} for i, score in self.index.search(str(q), topk)]
            for q in queries
        ]


_INDEX_CACHE: dict[str, tuple[list[dict[str, str]], Any]] = {}
_INDEX_LOCK = threading.Lock()


def _bm25_index(corpus: str) -> tuple[list[dict[str, str]], Any]:
    from seedcli.envs.lucene import BM25Index

    with _INDEX_LOCK:
        if corpus not in _INDEX_CACHE:
            docs = load_corpus(corpus)
            # Anserini breaks score ties by docid; the corpus ids play that part
            index = BM25Index.build([d["contents"] for d in docs], ids=[d["id"] for d in docs], k1=0.9, b=0.4)
            _INDEX_CACHE[corpus] = (docs, index)
        return _INDEX_CACHE[corpus]


def make_retriever(corpus: str | os.PathLike | None = None, search_url: str | None = None, **http: Any) -> Retriever:
    """`search_url` → the HTTP client (extra keywords: timeout, max_retries, backoff, batch_size); else BM25 over
    `corpus` (required then)."""
    if search_url:
        return HttpRetriever(search_url, **http)
    if corpus is None:
        raise UserError("no retriever: set env.corpus (a wiki-18-format JSONL) or env.search_url (a /retrieve server)")
    return BM25Retriever(corpus)


# -- over HTTP ----------------------------------------------------------------------------------------------------


class HttpRetriever(Retriever):
    """Client of Search-R1's `POST /retrieve`: batches of `batch_size` queries, `timeout` seconds a request,
    up to `max_retries` retries with doubling backoff on connection errors, timeouts and 5xx answers."""

    def __init__(
        self,
        url: str,
        timeout: float = 30.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        batch_size: int = 256,
    ):
        self.url = normalise_url(url)
        parts = urlsplit(self.url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._https else 80)
        self._path = parts.path + (f"?{parts.query}" if parts.query else "")
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.batch_size = batch_size
        self._local = threading.local()  # one keep-alive connection per thread

    def search(self, queries: Sequence[str], topk: int = TOPK) -> list[list[Hit]]:
        out: list[list[Hit]] = []
        for start in range(0, len(queries), self.batch_size):
            batch = [str(q) for q in queries[start : start + self.batch_size]]
            out.extend(self._post(batch, topk))
        return out

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = cls(self._host, self._port, timeout=self.timeout)
            self._local.conn = conn
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
        self._local.conn = None

    def _post(self, batch: list[str], topk: int) -> list[list[Hit]]:
        body = json.dumps({"queries": batch, "topk": topk, "return_scores": True}).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        reason, kind = "no attempt made", "error"
        for attempt in range(self.max_retries + 1):
            if attempt:
                # a slow or dead server shows itself while the run waits, one line per retry
                print(
                    f"retriever {self.url}: {reason}, retry {attempt}/{self.max_retries}", file=sys.stderr, flush=True
                )
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                conn = self._connection()
                conn.request("POST", self._path, body=body, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                # refused, reset, timed out, or a stale keep-alive connection: reconnect and retry
                self._drop_connection()
                if isinstance(exc, ConnectionRefusedError):
                    kind, reason = "refused", "connection refused"
                elif isinstance(exc, TimeoutError):
                    kind, reason = "timeout", f"no answer in {self.timeout:g}s"
                else:
                    kind, reason = "error", _short(exc)
                continue
            if resp.status >= 500:
                kind, reason = "http", f"HTTP {resp.status} ({_short(payload.decode(errors='replace')) or 'no body'})"
                self._drop_connection()
                continue
            if resp.status != 200:
                raise UserError(
                    f"retrieval server {self.url} answered HTTP {resp.status} ({_short(payload.decode(errors='replace'))}); "
                    "check env.search_url points at a Search-R1 /retrieve endpoint"
                )
            return _parse_result(payload, len(batch), self.url)
        tries = f"after {self.max_retries + 1} attempt{'s' if self.max_retries else ''}"
        if kind == "refused":
            advice = "nothing listens there: start it (`seed retriever serve --corpus FILE --port 8000`) or fix env.search_url"
        elif kind == "timeout":
            advice = (
                "the server is up but slow or hung: check it, or give it longer with env_options "
                f"'{{timeout: {max(2 * self.timeout, 60):g}}}'"
            )
        elif kind == "http":
            advice = "the server is running but failing: see its log"
        else:
            advice = "check env.search_url and that the server runs"
        raise UserError(f"retrieval server {self.url} failed {tries} ({reason}); {advice}")

    def close(self) -> None:
        self._drop_connection()


def normalise_url(url: str) -> str:
    """`host:port` or `http://host:port` → `http://host:port/retrieve`; a full endpoint URL is kept."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"search_url {url!r} is not an http(s) URL; example: http://127.0.0.1:8000/retrieve")
    if parts.path in ("", "/"):
        url = url.rstrip("/") + "/retrieve"
    return url


def _short(obj: object) -> str:
    text = " ".join(str(obj).split())
    return text if len(text) <= 120 else text[:117] + "..."


def _parse_result(payload: bytes, n_queries: int, url: str) -> list[list[Hit]]:
    try:
        data = orjson.loads(payload)
        result = data["result"]
        if not isinstance(result, list) or len(result) != n_queries:
            raise ValueError(f"{n_queries} result lists expected")
        out = []
        for hits in result:
            # a server may ignore return_scores and send bare documents (Search-R1 does when it is false)
            out.append(
                [
                    {"document": _doc(h["document"]), "score": h.get("score")}
                    if "document" in h
                    else {"document": _doc(h), "score": None}
                    for h in hits
                ]
            )
        return out
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise UserError(
            f"retrieval server {url} sent an answer that is not Search-R1's /retrieve format ({_short(exc)}); "
            "check env.search_url"
        ) from None


def _doc(doc: dict) -> dict:
    if "contents" not in doc:  # some servers send title and text instead
        doc = {**doc, "contents": f'"{doc.get("title", "")}"\n{doc.get("text", "")}'}
    return doc
