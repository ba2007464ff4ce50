"""`seed annotate`'s skill-leak audit end to end: a hand-built search collect run (questions from a JSONL split, so
no search data is needed), a real local chat-completions server whose analyzer writes the golden answer into every
skill (`skills/leak_frac` >= 0.9) or writes generic skills (0), the stage in-process and the CLI's printed summary."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from seedcli.artifacts import open_run, read_manifest
from seedcli.config import AnnotateConfig, CollectConfig
from seedcli.records import Trajectory, Turn, read_jsonl, write_jsonl
from seedcli.stages import annotate
from tests.fake_chat_server import FakeChatServer
from tests.helpers_cli import ENV, seed_cli

KEY = "sk-test-leaks-0123456789"
QUESTIONS = [  # (id, question, golden answers, data source): no question contains its answer
    ("nq-1", "Who wrote the novel Carrie?", ["Stephen King"], "nq"),
    ("nq-2", "What is the capital city of Australia?", ["Canberra"], "nq"),
    ("hp-1", "Which band recorded the album Abbey Road?", ["The Beatles", "Beatles"], "hotpotqa"),
    ("hp-2", "In which year did the Berlin Wall fall?", ["1989"], "hotpotqa"),
    ("hp-3", "Which river flows through the city of Cairo?", ["Nile", "the Nile river"], "hotpotqa"),
]
ROLLOUTS = 2


def search_trajectory(qid: str, question: str, answers: list[str], source: str, split: str, r: int) -> Trajectory:
    """Rollout r of a question: one search, then an answer (the golden one when r is even)."""
    answer = answers[0] if r % 2 == 0 else "I do not know"
    steps = [
        (question, f"<search>{question}</search>"),
        ('<information>{"result": "Doc 1 (Title: x) some passage"}</information>', f"<answer>{answer}</answer>"),
    ]
    turns = [
        Turn(
            step=i + 1,
            observation=obs,
            admissible=[],
            prompt=f"prompt {i}",
            response=f"<think>hm</think>\n{act}",
            action=act,
            valid=True,
            admissible_action=True,
        )
        for i, (obs, act) in enumerate(steps)
    ]
    won = r % 2 == 0
    return Trajectory(
        episode_id=f"{qid}-r{r:02d}", group_id=qid, env="search", task_id=qid, split=split, category=source,
        task=question, turns=turns, won=won, score=float(won), reward=10.0 * won, length=len(turns), engine="hf",
        model_id="tiny", model_hash="abc", prompt_version="search-v1", seed=0,
        sampling={"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 64, "max_steps": 4, "history": 3},
    )  # fmt: skip


@pytest.fixture
def search_collect(tmp_path) -> tuple[Path, Path, list[Trajectory]]:
    """(runs dir, collect run, trajectories) of a search collect run whose split is a JSONL file of QUESTIONS."""
    split = tmp_path / "questions.jsonl"
    split.write_text(
        "".join(
            json.dumps({"id": q, "question": t, "golden_answers": a, "data_source": s}) + "\n"
            for q, t, a, s in QUESTIONS
        )
    )
    trajs = [search_trajectory(*q, str(split), r) for q in QUESTIONS for r in range(ROLLOUTS)]
    runs = tmp_path / "runs"
    cfg = CollectConfig(env="search", split=str(split), runs_dir=str(runs), tasks=len(QUESTIONS), rollouts=ROLLOUTS)
    with open_run("collect", cfg, argv=["test"]) as run:
        write_jsonl(run.file("trajectories.jsonl"), trajs)
        run.complete({"trajectories.jsonl": len(trajs)}, {"episodes": len(trajs)})
    return runs, run.path, trajs


def leaky_answer(prompt: str) -> dict:
    """An analyzer with hindsight: the skill names the question's golden answer."""
    question = re.search(r"^Task: (.*)$", prompt, re.MULTILINE).group(1).strip()
    golden = next(a[0] for _, q, a, _ in QUESTIONS if q == question)
    return {
        "episode_summary": f"The agent searched and the passages pointed to {golden}.",
        "episode_skill": f"For a question like this one the answer is {golden}; search once, then answer it exactly.",
    }


def generic_answer(prompt: str) -> dict:
    return {
        "episode_summary": "The agent searched once and then answered.",
        "episode_skill": "Search the key entity of the question first, then answer with the exact name a passage "
        "states, without extra words.",
    }


def openai_cfg(runs: Path, collect: Path, url: str) -> AnnotateConfig:
    return AnnotateConfig(
        analyzer="openai", from_run=str(collect), runs_dir=str(runs), base_url=url, model="m", api_key_env="FAKE_KEY",
        concurrency=4, max_retries=1, timeout=5.0, backoff=0.05,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("answer", "expected"),
    [(leaky_answer, {"": 1.0, "nq": 1.0, "hotpotqa": 1.0}), (generic_answer, {"": 0.0, "nq": 0.0, "hotpotqa": 0.0})],
    ids=["golden-answer-skills", "generic-skills"],
)
def test_annotate_reports_the_leak_fraction_of_its_skills(search_collect, monkeypatch, answer, expected):
    runs, collect, trajs = search_collect
    monkeypatch.setenv("FAKE_KEY", KEY)
    with FakeChatServer(api_key=KEY, answer=answer) as server:
        manifest = annotate.run(openai_cfg(runs, collect, server.url))
    m = manifest.metrics
    print(f"\n[{answer.__name__}] skills/leak_frac = {m['skills/leak_frac']} (nq {m['skills/leak_frac/nq']}, "
          f"hotpotqa {m['skills/leak_frac/hotpotqa']}) over {m['annotate/kept']} kept skills")  # fmt: skip
    assert manifest.status == "complete" and m["annotate/kept"] == len(trajs)
    assert {k.removeprefix("skills/leak_frac").lstrip("/"): v for k, v in m.items() if "leak_frac" in k} == expected
    if answer is leaky_answer:
        assert m["skills/leak_frac"] >= 0.9
    # the manifest on disk carries the same figures
    assert read_manifest(runs / "annotate" / manifest.run_id).metrics["skills/leak_frac"] == m["skills/leak_frac"]
    # the leak is in the skill text itself: the audit judged what the records hold
    skills = read_jsonl(runs / "annotate" / manifest.run_id / "skills.jsonl")
    golden = {question: answers for _, question, answers, _ in QUESTIONS}
    leaked = [any(a.lower() in r["episode_skill"].lower() for a in golden[r["task"]]) for r in skills]
    assert sum(leaked) / len(leaked) == expected[""]


def test_the_cli_prints_the_leak_fraction_at_the_end(search_collect):
    runs, collect, _ = search_collect
    with FakeChatServer(api_key=KEY, answer=leaky_answer) as server:
        proc = seed_cli(
            "annotate", "--analyzer", "openai", "--from", str(collect), "--runs-dir", str(runs), "--base-url",
            server.url, "--model", "m", "--api-key-env", "FAKE_KEY", "--concurrency", "4",
            env={**ENV, "FAKE_KEY": KEY}, timeout=120,
        )  # fmt: skip
    rows = {line.split()[1]: line.split()[3] for line in proc.stdout.splitlines() if "skills/leak_frac" in line}
    print(f"\n[cli] {rows}")
    assert rows == {"skills/leak_frac": "1", "skills/leak_frac/hotpotqa": "1", "skills/leak_frac/nq": "1"}


def test_without_the_questions_the_audit_says_so_and_the_run_completes(search_collect, monkeypatch, capsys):
    runs, collect, trajs = search_collect
    Path(trajs[0].split).unlink()  # the data the search rule reads is gone
    monkeypatch.setenv("FAKE_KEY", KEY)
    with FakeChatServer(api_key=KEY, answer=leaky_answer) as server:
        manifest = annotate.run(openai_cfg(runs, collect, server.url))
    assert manifest.status == "complete" and manifest.metrics["annotate/kept"] == len(trajs)
    assert manifest.metrics["skills/leak_frac"] is None  # unknown, not 0
    assert "warning: no skill-leak audit (question file" in capsys.readouterr().err
