"""`seed eval --env search --datasets ... --limit N` through the CLI on a hand-made corpus and question file."""

from __future__ import annotations

import json

import orjson

from seedcli.artifacts import verify_run
from tests.helpers_cli import seed_cli

PASSAGES = [
    {"id": "p0", "contents": '"Hamlet"\nHamlet is a tragedy written by William Shakespeare around 1600.'},
    {"id": "p1", "contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"id": "p2", "contents": '"Moon"\nThe Moon is the only natural satellite of Earth.'},
]
QUESTIONS = [
    ("a0", "Who wrote the tragedy Hamlet?", "William Shakespeare", "alpha"),
    ("a1", "What is the capital of France?", "Paris", "alpha"),
    ("a2", "What is the only natural satellite of Earth?", "The Moon", "alpha"),
    ("b0", "Who painted the Mona Lisa?", "Leonardo da Vinci", "beta"),
    ("b1", "What is the capital of France?", "Paris", "beta"),
    ("c0", "Who wrote Hamlet?", "Shakespeare", "gamma"),
]


def test_datasets_and_limit_per_source_through_the_cli(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    qfile = tmp_path / "toy.jsonl"
    qfile.write_text("".join(
        json.dumps({"id": i, "question": q, "golden_answers": [a], "data_source": s}) + "\n" for i, q, a, s in QUESTIONS
    ))  # fmt: skip
    runs = tmp_path / "runs"
    proc = seed_cli(
        "eval", "--env", "search", "--split", str(qfile), "--datasets", "alpha,beta", "--limit", "1",
        "--policy", "expert", "--env-options", f"{{corpus: {corpus}}}", "--workers", "0",
        "--runs-dir", str(runs), "--json",
    )  # fmt: skip
    run_dir = runs / "eval" / orjson.loads(proc.stdout.strip().splitlines()[-1])["run_id"]
    verify_run(run_dir, "eval")
    results = json.loads((run_dir / "results.json").read_text())
    played = {c: v["games"] for c, v in results["categories"].items() if v["games"]}
    # one question per chosen source, out of the 3 + 2 the two sources hold; gamma is not played
    assert played == {"alpha": 1, "beta": 1} and results["partial"] is True and results["expected_games"] == 5
    assert results["per_episode"]["search calls"] == 1.0  # the expert searches once, then answers
    report = (run_dir / "report.md").read_text()
    assert "Partial result: 2 of 5 questions" in report and "Gamma" not in report
    assert f"- Retriever: in-process BM25 over {corpus}" in report
    bad = seed_cli(
        "eval", "--env", "search", "--split", str(qfile), "--categories", "delta", "--policy", "expert",
        "--env-options", f"{{corpus: {corpus}}}", "--runs-dir", str(runs), check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "--categories delta: the split has no such data source" in bad.stderr
