"""`seed annotate` end to end: a hand-built collect run, a real local chat-completions server with injected faults,
the stage in-process and the CLI as a subprocess (auth failure, kill and resume), and the rules analyzer on real
ALFWorld games."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from seedcli.analyzers import analysis_messages
from seedcli.analyzers.http import AuthError, ChatClient, RequestFailed
from seedcli.analyzers.parse import parse_skill
from seedcli.analyzers.policy import analyze_with_engine
from seedcli.analyzers.rules import rules_skill
from seedcli.artifacts import manifest_sha256, open_run, read_manifest
from seedcli.config import AnnotateConfig, CollectConfig
from seedcli.envs.alfworld.projection import format_response
from seedcli.envs.alfworld.rules import parse_goal
from seedcli.errors import UserError
from seedcli.records import Trajectory, Turn, read_jsonl, write_jsonl
from seedcli.stages import annotate
from tests.fake_chat_server import FakeChatServer, messages_hash, sha256

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-test-SECRET-0123456789"
N = 12

TASKS = [
    "put a clean cloth in bathtubbasin.",
    "put a hot potato in fridge.",
    "put some spraybottle on toilet.",
    "look at alarmclock under the desklamp.",
]


def synthetic_trajectory(i: int) -> Trajectory:
    """Episode i; its first observation carries a marker `tag-epNN` that the fake server's fault script matches."""
    task = TASKS[i % len(TASKS)]
    obj, recep = parse_goal(task).obj, parse_goal(task).recep
    won = i % 2 == 0
    observations = [
        f"You are in the middle of a room (tag-ep{i:02d}). Looking quickly around you, you see a cabinet 1, a {recep} 1.",
        f"You arrive at cabinet 1. On the cabinet 1, you see a {obj} 1.",
        f"You pick up the {obj} 1 from the cabinet 1.",
    ]
    actions = ["go to cabinet 1", f"take {obj} 1 from cabinet 1", f"go to {recep} 1"]
    turns = [
        Turn(
            step=s + 1,
            observation=obs,
            admissible=["look"],
            prompt=f"prompt {s}",
            response=format_response("hm", a),
            action=a,
            valid=True,
            admissible_action=True,
        )
        for s, (obs, a) in enumerate(zip(observations, actions, strict=True))
    ]
    return Trajectory(
        episode_id=f"g{i // 2:04d}-r{i % 2:02d}",
        group_id=f"g{i // 2:04d}",
        game_file=f"train/x/{i}/game.tw-pddl",
        split="train",
        task_type="pick_and_place_simple",
        task=task,
        turns=turns,
        won=won,
        reward=10.0 * won,
        length=len(turns),
        engine="hf",
        model_id="tiny",
        model_hash="abc",
        prompt_version="alfworld-agent-v1",
        seed=0,
        sampling={"temperature": 0.4, "top_p": 1.0, "max_new_tokens": 512, "max_steps": 3, "history": 5},
    )


def make_collect_run(runs_dir: Path, trajectories: list[Trajectory]) -> Path:
    cfg = CollectConfig(runs_dir=str(runs_dir), tasks=len(trajectories) // 2, rollouts=2)
    with open_run("collect", cfg, argv=["test"]) as run:
        write_jsonl(run.file("trajectories.jsonl"), trajectories)
        run.complete({"trajectories.jsonl": len(trajectories)}, {"episodes": len(trajectories)})
    return run.path


@pytest.fixture
def collect_run(tmp_path) -> tuple[Path, Path, list[Trajectory]]:
    runs = tmp_path / "runs"
    trajs = [synthetic_trajectory(i) for i in range(N)]
    return runs, make_collect_run(runs, trajs), trajs


def records_of(run_dir: Path) -> tuple[dict, dict]:
    skills = {r["episode_id"]: r for r in read_jsonl(run_dir / "skills.jsonl")}
    rejected = {r["episode_id"]: r for r in read_jsonl(run_dir / "rejected.jsonl")}
    return skills, rejected


def assert_one_record_per_trajectory(run_dir: Path, trajs: list[Trajectory]) -> tuple[dict, dict]:
    skills, rejected = records_of(run_dir)
    lines = sum(1 for f in ("skills.jsonl", "rejected.jsonl") for line in open(run_dir / f, "rb") if line.strip())
    assert lines == len(trajs)  # no duplicate lines
    assert set(skills) | set(rejected) == {t.episode_id for t in trajs}
    assert not set(skills) & set(rejected)
    return skills, rejected


def no_secret_in(path: Path, secret: str = KEY) -> None:
    for f in path.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f"API key leaked into {f}"


def openai_cfg(runs: Path, collect: Path, url: str, **kw) -> AnnotateConfig:
    base = dict(
        analyzer="openai",
        from_run=str(collect),
        runs_dir=str(runs),
        base_url=url,
        model="m",
        api_key_env="FAKE_KEY",
        concurrency=4,
        max_retries=3,
        timeout=1.0,
        backoff=0.05,
    )
    return AnnotateConfig(**{**base, **kw})


# ------------------------------------------------------------------------------------------------ rules, offline


def test_rules_run_chains_to_its_collect_run(collect_run):
    runs, collect, trajs = collect_run
    manifest = annotate.run(AnnotateConfig(analyzer="rules", runs_dir=str(runs)))  # newest complete collect run
    run_dir = runs / "annotate" / manifest.run_id
    assert manifest.status == "complete"
    assert [(i.stage, i.run_id, i.manifest_sha256) for i in manifest.inputs] == [
        ("collect", collect.name, manifest_sha256(collect))
    ]
    skills, _ = assert_one_record_per_trajectory(run_dir, trajs)
    assert len(skills) == N and manifest.metrics["annotate/kept"] == N
    for t in trajs:
        rec = skills[t.episode_id]
        goal = parse_goal(t.task)
        assert goal.obj in rec["episode_skill"] and goal.recep in rec["episode_skill"]
        assert rec["analyzer"] == "rules" and rec["model"] == "rules-v1"
    assert {o.path for o in manifest.outputs} == {"skills.jsonl", "rejected.jsonl", "responses.jsonl"}
    assert manifest.metrics["annotate/success/trajectories"] == N // 2
    assert manifest.metrics["cost/usd_estimate"] == 0.0
    assert (runs / "annotate" / "latest").resolve() == run_dir.resolve()
    # a complete run cannot be resumed; a rerun reuses every answer of the first run
    with pytest.raises(UserError, match="already complete"):
        annotate.run(AnnotateConfig(analyzer="rules", runs_dir=str(runs), resume=str(run_dir)))
    again = annotate.run(AnnotateConfig(analyzer="rules", runs_dir=str(runs)))
    assert again.metrics["annotate/reused_responses"] == N and again.metrics["annotate/requests_this_session"] == 0
    assert (runs / "annotate" / again.run_id / "skills.jsonl").read_bytes() == (run_dir / "skills.jsonl").read_bytes()


# ------------------------------------------------------------------------------------------------ HTTP client


def test_client_retries_transient_failures_and_honours_retry_after(monkeypatch):
    monkeypatch.setenv("FAKE_KEY", KEY)
    faults = {
        "p429": ["429:1"],
        "p500": ["500", "500"],
        "pslow": ["slow:2"],
        "pbody": ["bad_body"],
        "pdead": ["500"] * 9,
    }
    with FakeChatServer(faults, api_key=KEY) as server:
        client = ChatClient("openai", server.url, "m", "FAKE_KEY", timeout=0.5, max_retries=2, backoff=0.01)
        assert KEY not in repr(client)
        t0 = time.monotonic()
        r = client.chat(analysis_messages("p429"))
        assert r.retries == 1 and time.monotonic() - t0 >= 1.0  # waited for Retry-After, not the tiny back-off
        assert client.chat(analysis_messages("p500")).retries == 2
        assert client.chat(analysis_messages("pslow")).retries == 1
        assert client.chat(analysis_messages("pbody")).retries == 1
        r = client.chat(analysis_messages("pok"))
        assert parse_skill(r.text).kept and r.prompt_tokens > 0 and r.completion_tokens > 0
        with pytest.raises(RequestFailed) as failed:
            client.chat(analysis_messages("pdead"))
        assert failed.value.retries == 2 and "HTTP 500" in str(failed.value)
        assert server.prompt_counts[sha256("pdead")] == 3  # first try + max_retries
        assert all(entry["auth"] for entry in server.log)
        gap = [e["t"] for e in server.log if e["marker"] == "p429"]
        assert gap[1] - gap[0] >= 1.0
        # wrong key: AuthError at once (no retries), one line, the key nowhere in it even though the server echoes it
        monkeypatch.setenv("FAKE_KEY", "sk-wrong-" + KEY)
        bad = ChatClient("openai", server.url, "m", "FAKE_KEY", timeout=2, max_retries=5, backoff=0.01)
        before = len(server.log)
        with pytest.raises(AuthError) as err:
            bad.chat(analysis_messages("pok"))
        assert len(server.log) == before + 1
        assert str(err.value) == f"authentication failed for {server.url} (HTTP 401): check $FAKE_KEY"
        # an unknown route is a wrong base URL: a user error, not a retry loop
        with pytest.raises(UserError, match="404"):
            ChatClient("openai", server.url[:-3], "m", "FAKE_KEY", max_retries=5).chat(analysis_messages("x"))


def test_presets_and_missing_key(monkeypatch):
    monkeypatch.delenv("ZAI_API_KEY", raising=False)
    with pytest.raises(UserError, match=r"\$ZAI_API_KEY is not set"):
        ChatClient("glm")
    monkeypatch.setenv("ZAI_API_KEY", KEY)
    glm = ChatClient("glm")
    assert (glm.base_url, glm.model, glm.api_key_env) == ("https://api.z.ai/api/paas/v4", "glm-5.2", "ZAI_API_KEY")
    assert glm.url == "https://api.z.ai/api/paas/v4/chat/completions"
    with pytest.raises(UserError, match="needs --base-url"):
        ChatClient("openai", model="m")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert ChatClient("openai", "http://127.0.0.1:1/v1", "m").api_key_env == "OPENAI_API_KEY"  # local: no key needed


# ------------------------------------------------------------------------------------------------ stage, in-process

FAULTS = {
    "tag-ep00": ["429:1"],  # retried after Retry-After
    "tag-ep01": ["500", "500"],  # two retries
    "tag-ep02": ["slow:3"],  # past the 1 s timeout: one retry
    "tag-ep03": ["bad_body"],  # HTTP 200 but not JSON: one retry
    "tag-ep04": ["fenced"],
    "tag-ep05": ["trailing_comma"],
    "tag-ep06": ["missing_field"],  # schema reminder, then kept
    "tag-ep07": ["missing_field", "missing_field"],  # rejected after the reminder
    "tag-ep08": ["malformed", "prose"],  # schema reminder, prose answer parsed by the fallback
    "tag-ep09": ["short_skill", "placeholder"],
    "tag-ep10": ["500"] * 4,  # retries exhausted: request_failed, never cached
    "tag-ep11": ["missing_field"] + ["500"] * 4,  # the reminder fails: request_failed, first answer kept as raw
}
EXPECTED_REQUESTS = {0: 2, 1: 3, 2: 2, 3: 2, 4: 1, 5: 1, 6: 2, 7: 2, 8: 2, 9: 2, 10: 4, 11: 5}
EXPECTED_REASONS = {7: "missing_skill", 9: "placeholder_skill", 10: "request_failed", 11: "request_failed"}


def test_faults_end_with_every_trajectory_accounted_for(collect_run, monkeypatch):
    runs, collect, trajs = collect_run
    monkeypatch.setenv("FAKE_KEY", KEY)
    with FakeChatServer(FAULTS, api_key=KEY) as server:
        manifest = annotate.run(openai_cfg(runs, collect, server.url))
        run_dir = runs / "annotate" / manifest.run_id
        skills, rejected = assert_one_record_per_trajectory(run_dir, trajs)
        by_marker = {i: sum(e["marker"] == f"tag-ep{i:02d}" for e in server.log) for i in range(N)}
        assert by_marker == EXPECTED_REQUESTS
        for i, t in enumerate(trajs):
            if i in EXPECTED_REASONS:
                assert rejected[t.episode_id]["reason"] == EXPECTED_REASONS[i]
            else:
                assert t.episode_id in skills, rejected.get(t.episode_id)
        assert skills[trajs[6].episode_id]["usage"]["attempts"] == 2
        assert skills[trajs[6].episode_id]["usage"]["first_reason"] == "missing_skill"
        assert skills[trajs[0].episode_id]["usage"]["retries"] == 1
        assert rejected[trajs[7].episode_id]["raw"] == json.dumps(
            {"episode_summary": rejected[trajs[7].episode_id]["episode_summary"]}
        )
        reminder = [e for e in server.log if e["marker"] == "tag-ep06"][1]
        assert reminder["turns"] == 3  # prompt, failed answer, schema reminder
        m = manifest.metrics
        assert (m["annotate/kept"], m["annotate/rejected"]) == (N - 4, 4)
        assert m["annotate/rejected/request_failed"] == 2 and m["annotate/rejected/placeholder_skill"] == 1
        assert m["annotate/retries"] == 1 + 2 + 1 + 1 + 3 + 3
        ep11 = rejected[trajs[11].episode_id]
        assert list(json.loads(ep11["raw"])) == ["episode_summary"]  # the missing-field answer that did arrive
        assert "HTTP 500" in ep11["usage"]["error"] and ep11["usage"]["attempts"] == 2
        assert m["annotate/schema_retries"] == 4
        assert m["annotate/success/trajectories"] + m["annotate/failure/trajectories"] == N
        assert m["usage/prompt_tokens"] > 0 and m["timing_s/latency_p95"] >= m["timing_s/latency_p50"] > 0
        prices = AnnotateConfig()
        cost = (
            m["usage/prompt_tokens"] / 1e6 * prices.price_prompt_per_mtok
            + m["usage/completion_tokens"] / 1e6 * prices.price_completion_per_mtok
        )
        assert m["cost/usd_estimate"] == pytest.approx(cost, abs=1e-4)
        assert manifest.config["api_key_env"] == "FAKE_KEY" and m["api_key_env"] == "FAKE_KEY"
        no_secret_in(runs)

        # a rerun of the same collect run asks only for what is not cached: the request that failed
        before = server.snapshot()
        again = annotate.run(openai_cfg(runs, collect, server.url))
        new = server.snapshot() - before
        assert {e["marker"] for e in server.log[sum(before.values()) :]} == {"tag-ep10", "tag-ep11"}
        assert sum(new.values()) == 2  # ep10's first attempt, ep11's reminder: their scripts are used up, they answer
        assert again.metrics["annotate/kept"] == N - 2
        assert again.metrics["annotate/reused_responses"] == 11 + 4  # answered first attempts + answered reminders
        assert_one_record_per_trajectory(runs / "annotate" / again.run_id, trajs)


def test_unreachable_endpoint_stops_the_stage_instead_of_failing_every_record(collect_run, monkeypatch):
    runs, collect, trajs = collect_run
    monkeypatch.setenv("FAKE_KEY", KEY)
    with FakeChatServer() as server:
        dead = server.url  # nothing listens there once the server stops
    cfg = openai_cfg(runs, collect, dead, concurrency=2, max_retries=1, backoff=0.01)
    with pytest.raises(UserError, match=r"3 requests in a row failed at http://127\.0\.0\.1:\d+/v1 .*--resume"):
        annotate.run(cfg)
    (run_dir,) = [p for p in (runs / "annotate").iterdir() if p.is_dir() and not p.is_symlink()]
    m = read_manifest(run_dir)
    assert m.status == "failed" and "in a row" in m.error
    assert len(list(read_jsonl(run_dir / "rejected.jsonl"))) < len(trajs)  # it did not grind through every record


def test_answers_from_another_endpoint_with_the_same_model_name_are_not_reused(collect_run, monkeypatch):
    """Two OpenAI-compatible servers that both call their model `m` are two analyzers: the second run asks its own
    server for every answer, and its skills and manifest come from that server only."""
    runs, collect, trajs = collect_run
    monkeypatch.setenv("FAKE_KEY", KEY)

    def other_answer(prompt: str) -> dict:
        return {"episode_summary": "Server two read it.", "episode_skill": "server two says: look before you act"}

    with FakeChatServer(api_key=KEY) as one, FakeChatServer(api_key=KEY, answer=other_answer) as two:
        first = annotate.run(openai_cfg(runs, collect, one.url))
        second = annotate.run(openai_cfg(runs, collect, two.url + "/"))  # the same endpoint as two.url
        again = annotate.run(openai_cfg(runs, collect, two.url))
        sent_to_two = sum(two.snapshot().values())
    assert first.metrics["annotate/kept"] == N and first.metrics["base_url"] == one.url
    assert second.metrics["annotate/reused_responses"] == 0 and second.metrics["annotate/requests_this_session"] == N
    assert sent_to_two == N  # the second run's answers: all from its own server, once
    skills, _ = records_of(runs / "annotate" / second.run_id)
    assert {r["episode_skill"] for r in skills.values()} == {"server two says: look before you act"}
    assert second.metrics["base_url"] == two.url
    entries = [json.loads(line) for line in (runs / "annotate" / second.run_id / "responses.jsonl").open()]
    assert {e["base_url"] for e in entries} == {two.url}
    # a rerun against the same server reuses its answers (and only them)
    assert again.metrics["annotate/reused_responses"] == N and again.metrics["annotate/requests_this_session"] == 0
    assert {r["episode_skill"] for r in records_of(runs / "annotate" / again.run_id)[0].values()} == {
        "server two says: look before you act"
    }


def test_policy_analyzer_through_an_engine(collect_run, monkeypatch, tmp_path):
    """The policy path on a stand-in engine: one generate call per batch, a reminder batch for what did not parse."""
    runs, collect, trajs = collect_run

    class Completion:
        def __init__(self, text):
            self.text, self.token_ids, self.logprobs, self.finish_reason = text, [1, 2, 3], [0.0] * 3, "stop"

    class FakeEngine:
        calls: list[int] = []

        def render(self, messages):
            return [len(m["content"]) % 97 for m in messages]

        def generate(self, prompts, temperature, top_p, max_new_tokens, seed):
            assert temperature == 0.0
            FakeEngine.calls.append(len(prompts))
            out = []
            for ids in prompts:
                if len(ids) == 1 and ids[0] % 2:  # first attempts of some prompts: no JSON
                    out.append(Completion("I think the agent did fine."))
                else:
                    out.append(
                        Completion(
                            json.dumps(
                                {
                                    "episode_summary": "It went.",
                                    "episode_skill": "Go to the cabinet and take the object.",
                                }
                            )
                        )
                    )
            return out

        def close(self):
            pass

    parsed = analyze_with_engine(FakeEngine(), trajs, max_new_tokens=64)
    assert all(p.kept for p in parsed) and len(FakeEngine.calls) == 2
    assert FakeEngine.calls[1] == sum(p.attempts == 2 for p in parsed) > 0

    import seedcli.analyzers.policy

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    monkeypatch.setattr(seedcli.analyzers.policy, "load_engine", lambda kind, path, **kw: FakeEngine())
    FakeEngine.calls = []
    manifest = annotate.run(AnnotateConfig(analyzer="policy", model=str(model_dir), runs_dir=str(runs), concurrency=8))
    skills, _ = assert_one_record_per_trajectory(runs / "annotate" / manifest.run_id, trajs)
    assert len(skills) == N and FakeEngine.calls[:2] == [8, FakeEngine.calls[1]] and max(FakeEngine.calls) <= 8
    assert manifest.metrics["annotate/schema_retries"] > 0 and manifest.metrics["cost/usd_estimate"] == 0.0


# ------------------------------------------------------------------------------------------------ CLI subprocess

pytestmark_cli = pytest.mark.skipif(not (REPO / "seedcli" / "cli" / "__init__.py").exists(), reason="the CLI is not there yet")


def cli(args: list[str], env_key: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "FAKE_KEY": env_key, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "seedcli", "annotate", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def cli_args(runs: Path, collect: Path, url: str, *extra: str) -> list[str]:
    return [
        "--analyzer",
        "openai",
        "--from",
        str(collect),
        "--base-url",
        url,
        "--model",
        "m",
        "--api-key-env",
        "FAKE_KEY",
        "--runs-dir",
        str(runs),
        "--timeout",
        "5",
        *extra,
        "backoff=0.05",
    ]


@pytestmark_cli
def test_cli_401_stops_at_once_with_exit_2(collect_run):
    runs, collect, _ = collect_run
    with FakeChatServer(api_key="sk-the-right-one") as server:
        proc = cli(cli_args(runs, collect, server.url, "--concurrency", "2"), env_key=KEY)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("[annotate]")]  # progress
    assert lines == [f"error: authentication failed for {server.url} (HTTP 401): check $FAKE_KEY"]
    assert KEY not in out + err
    assert len(server.log) <= 2  # no more than were in flight: not one per trajectory
    # no answer arrived, nothing was written: the run never started, so no failed run directory is left behind
    assert not [p for p in (runs / "annotate").iterdir() if p.is_dir() and not p.is_symlink()]
    no_secret_in(runs)


@pytestmark_cli
def test_cli_kill_then_resume_sends_no_duplicate_request(collect_run):
    runs, collect, trajs = collect_run
    with FakeChatServer({"tag-ep05": ["missing_field"]}, api_key=KEY, delay=0.4) as server:
        proc = cli(cli_args(runs, collect, server.url, "--concurrency", "2"), env_key=KEY)
        deadline = time.time() + 120
        cache = None
        while time.time() < deadline:
            found = list((runs / "annotate").glob("*/responses.jsonl")) if (runs / "annotate").exists() else []
            if found and sum(1 for _ in open(found[0], "rb")) >= 4:
                cache = found[0]
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        assert cache is not None, "no responses stored in time"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        time.sleep(0.5)  # requests in flight at the kill reach the server now
        stored = [orjson.loads(line) for line in open(cache, "rb") if line.endswith(b"\n")]
        assert 4 <= len(stored) < N
        at_kill = server.snapshot()

        proc = cli(cli_args(runs, collect, server.url, "--concurrency", "2", "--resume", "auto"), env_key=KEY)
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        run_dir = cache.parent
        m = read_manifest(run_dir)
        assert m.status == "complete" and m.resumed == 1
        skills, rejected = assert_one_record_per_trajectory(run_dir, trajs)
        assert len(skills) == N  # ep05 was kept after its schema reminder

        # the requests whose answers were stored before the kill: never sent again
        prompts = {r["key"]: r["prompt"] for r in [*skills.values(), *rejected.values()]}
        first = {e["key"]: e["text"] for e in stored if e["attempt"] == 0}

        def request_of(entry):
            prompt = prompts[entry["key"]]
            return messages_hash(analysis_messages(prompt, first[entry["key"]] if entry["attempt"] else None))

        stored_requests = {request_of(e) for e in stored}
        final = server.snapshot()
        for h in stored_requests:
            assert final[h] == 1
        # only requests in flight at the kill (at most `concurrency`) were sent twice
        assert all(c <= 2 for c in final.values())
        assert sum(c - 1 for c in final.values()) <= 2
        # after the kill: every distinct request whose answer was not stored, once
        assert sum(final.values()) - sum(at_kill.values()) == len(final) - len(stored)
        no_secret_in(runs)


@pytestmark_cli
def test_cli_rules_run_completes(collect_run):
    runs, collect, trajs = collect_run
    proc = cli(["--analyzer", "rules", "--runs-dir", str(runs), "--json"], env_key="")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["status"] == "complete" and summary["metrics"]["annotate/kept"] == N


# ------------------------------------------------------------------------------------------------ real ALFWorld


def _play(env, policy, max_steps: int):
    """(task, turns, won) for one episode on a real ALFWorld game."""
    state = env.reset()
    intro = state.feedback
    task = intro.split("Your task is to: ")[1].strip()
    obs = intro.split("\n\n")[1].split("Your task is to:")[0].strip() if "\n\n" in intro else intro
    turns, won = [], False
    for step in range(max_steps):
        action = policy(state, step)
        turns.append(
            Turn(
                step=step + 1,
                observation=obs,
                admissible=list(state.admissible_commands),
                prompt="",
                response=format_response("", action),
                action=action,
                valid=True,
            )
        )
        state, _, done = env.step(action)
        obs = state.feedback.strip()
        won = bool(state["won"])
        if done:
            break
    return task, turns, won


@pytest.mark.skipif(
    not glob.glob(os.path.join(os.environ.get("ALFWORLD_DATA", "/nonexistent"), "json_2.1.1", "train")),
    reason="no ALFWorld data",
)
def test_rules_on_real_alfworld_games_names_objects_and_receptacles():
    textworld = pytest.importorskip("textworld")
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredExpertType, AlfredInfos

    root = os.environ["ALFWORLD_DATA"]
    games = [
        sorted(glob.glob(f"{root}/json_2.1.1/train/{kind}-*/*/game.tw-pddl"))[0]
        for kind in ("pick_clean_then_place_in_recep", "look_at_obj_in_light")
    ]
    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile", "expert_plan"])
    for game in games:
        env = textworld.start(
            game, infos, wrappers=[AlfredDemangler(), AlfredInfos, AlfredExpert(AlfredExpertType.HANDCODED)]
        )
        expert = lambda s, i: s["extra.expert_plan"][0]  # noqa: E731
        looping = lambda s, i: ["look", "inventory"][i % 2]  # noqa: E731
        for policy, max_steps in ((expert, 50), (looping, 6)):
            task, turns, won = _play(env, policy, max_steps)
            traj = Trajectory(
                episode_id="e",
                group_id="g",
                game_file=game,
                split="train",
                task_type="t",
                task=task,
                turns=turns,
                won=won,
                reward=10.0 * won,
                length=len(turns),
                engine="expert",
                model_id="expert",
                model_hash="-",
                sampling={"max_steps": max_steps},
                prompt_version="v",
                seed=0,
                policy="expert",
            )
            assert won == (policy is expert)
            goal = parse_goal(task)
            assert goal.kind != "unknown" and goal.obj and goal.recep
            summary, skill = rules_skill(traj)
            assert goal.obj in skill and goal.recep in skill, skill
            if won:
                assert f"take the {goal.obj} from the" in skill
                assert not any(ch.isdigit() for ch in skill)  # object numbers abstracted
            else:
                assert "repeating" in skill
        env.close()


def test_policy_analyzer_on_a_real_tiny_model(tmp_path):
    """`--analyzer policy` through the real hf engine: a random tiny model writes no JSON, so every trajectory is
    rejected after its schema reminder — and still ends in exactly one record."""
    from seedcli.engines.tiny import build_tiny_model
    from seedcli.envs import tokenizer_texts

    model_dir = build_tiny_model(tmp_path / "model", preset="tiny", seed=0, corpus=tokenizer_texts())
    runs = tmp_path / "runs"
    trajs = [synthetic_trajectory(i) for i in range(3)]
    make_collect_run(runs, trajs)
    cfg = AnnotateConfig(analyzer="policy", model=str(model_dir), runs_dir=str(runs), max_tokens=8, device="cpu")
    manifest = annotate.run(cfg)
    _, rejected = assert_one_record_per_trajectory(runs / "annotate" / manifest.run_id, trajs)
    assert all(r["usage"]["attempts"] == 2 and r["usage"]["completion_tokens"] > 0 for r in rejected.values())
    assert manifest.metrics["annotate/requests"] == 2 * len(trajs)
    # the cache key holds the weights' hash: a resumed or repeated run asks the model nothing
    again = annotate.run(cfg)
    assert again.metrics["annotate/requests_this_session"] == 0 and again.metrics["annotate/reused_responses"] == 6
