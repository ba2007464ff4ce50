"""`seed retriever serve`: Search-R1's retrieval-server API (`POST /retrieve`) over the in-process BM25 index, so
one machine can host retrieval for many rollout workers (FastAPI + uvicorn).

    seed retriever serve --corpus ../shared/search/corpus.jsonl --port 8000
    curl -s localhost:8000/retrieve -H 'Content-Type: application/json' \\
        -d '{"queries": ["who wrote hamlet"], "topk": 3, "return_scores": true}'
"""

# no `from __future__ import annotations`: FastAPI must see the request model as a class, not a string
import socket
import threading
from pathlib import Path
from typing import Any

from seedcli.envs.search.retriever import TOPK, BM25Retriever, Retriever
from seedcli.errors import UserError


def create_app(retriever: Retriever, default_topk: int = TOPK) -> Any:
    """The FastAPI app: Search-R1's request and response shapes (verl-agent's single `query` is accepted too)."""
    from fastapi import FastAPI, HTTPException
    from pydantic import BaseModel, Field

    class QueryRequest(BaseModel):
        queries: list[str] | None = Field(None, description="queries to search (Search-R1)")
        query: str | None = Field(None, description="one query (verl-agent's server)")
        topk: int | None = Field(None, description="passages per query (default: the server's --topk)")
        return_scores: bool = Field(False, description="wrap each document as {document, score}")

    app = FastAPI(title="seed retriever", description="Search-R1 /retrieve API over BM25")
    lock = threading.Lock()  # FastAPI runs sync endpoints in a thread pool; the index is searched one batch at a time

    @app.post("/retrieve")
    def retrieve(request: QueryRequest) -> dict:
        if request.queries is None and request.query is None:
            raise HTTPException(status_code=422, detail="give 'queries' (a list of strings) or 'query'")
        queries = request.queries if request.queries is not None else [request.query or ""]
        topk = request.topk or default_topk
        if topk < 1:
            raise HTTPException(status_code=422, detail="topk must be >= 1")
        with lock:
            results = retriever.search(queries, topk)
        if request.return_scores:
            return {"result": results}
        return {"result": [[hit["document"] for hit in hits] for hits in results]}

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    return app


def serve(
    corpus: str | Path, host: str = "127.0.0.1", port: int = 8000, topk: int = TOPK, log_level: str = "warning"
) -> None:
    """Index `corpus` with BM25 and serve it until interrupted."""

    import uvicorn

    if not 1 <= port <= 65535:
        raise UserError(f"--port {port}: a TCP port is 1-65535; pick a free one such as 8000")
    # check the port before the index is built, so a clash is one line at once rather than uvicorn's log later
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise UserError(f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port or --host") from None
    retriever = BM25Retriever(corpus)
    app = create_app(retriever, topk)
    print(f"serving {len(retriever)} passages from {corpus} at http://{host}:{port}/retrieve", flush=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
