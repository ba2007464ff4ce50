"""`seed annotate --analyzer hindsight` end to end on a small collect run of real EZPoints episodes (the expert's, and
the expert's with one mistake of the test's: an '=' too early, the wrong operator), in process and through the CLI:
one skill per episode, distinct, versioned per environment in the cache key, the leak audit over them, a rerun served
from the cache, and an episode the replay does not reproduce rejected with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seedcli.artifacts import open_run
from seedcli.config import AnnotateConfig, CollectConfig
from seedcli.envs import get_env
from seedcli.envs.ezpoints.expert import card_pair
from seedcli.records import Trajectory, read_jsonl, write_jsonl
from seedcli.skill_leaks import find_leaks
from seedcli.stages import annotate
from tests.helpers_cli import seed_cli
from tests.helpers_play import ExpertWithSlips, play

TASKS = 4


@pytest.fixture(scope="module")
def collect_run(tmp_path_factory) -> tuple[Path, Path, list[Trajectory]]:
    """(runs dir, collect run, trajectories): each of 4 test games won by the expert, lost by an early '=', lost by
    the wrong operator; and one lost episode recorded as won (the replay must refuse it)."""
    env = get_env("ezpoints")
    tasks = env.list_tasks("test")[:TASKS]
    rounds = [{}, {3: "="}, {2: lambda result: "*" if card_pair(result.task)[2] == "+" else "+"}]
    trajs = []
    for r, slips in enumerate(rounds):
        for t in play(env, tasks, ExpertWithSlips(env, slips)):
            trajs.append(t.model_copy(update={"episode_id": f"{t.group_id}-r{r:02d}"}))
    trajs.append(trajs[-1].model_copy(update={"episode_id": "forged", "won": True}))
    runs = tmp_path_factory.mktemp("hindsight") / "runs"
    cfg = CollectConfig(env="ezpoints", split="test", runs_dir=str(runs), tasks=TASKS, rollouts=len(rounds))
    with open_run("collect", cfg, argv=["test"]) as run:
        write_jsonl(run.file("trajectories.jsonl"), trajs)
        run.complete({"trajectories.jsonl": len(trajs)}, {"episodes": len(trajs)})
    return runs, run.path, trajs


def test_annotate_writes_one_distinct_skill_per_episode_and_audits_their_leaks(collect_run):
    runs, collect, trajs = collect_run
    manifest = annotate.run(AnnotateConfig(analyzer="hindsight", from_run=str(collect), runs_dir=str(runs)))
    m = manifest.metrics
    run_dir = runs / "annotate" / manifest.run_id
    kept = read_jsonl(run_dir / "skills.jsonl")
    (rejected,) = read_jsonl(run_dir / "rejected.jsonl")
    print(f"\n{m['annotate/kept']} kept, {len({r['episode_skill'] for r in kept})} distinct; leak_frac "
          f"{m['skills/leak_frac']}, leak_chars_frac {m['skills/leak_chars_frac']}")  # fmt: skip
    assert manifest.status == "complete" and m["annotate/kept"] == len(trajs) - 1 == len(kept)
    assert rejected["episode_id"] == "forged" and rejected["raw"].startswith("no hindsight skill: the replayed game")
    assert {(r["analyzer"], r["model"]) for r in kept} == {("hindsight", "ezpoints-hindsight-v1")}
    assert len({r["episode_skill"] for r in kept}) == len(kept)  # no two episodes share a skill
    by_id = {t.episode_id: t for t in trajs}
    for r in kept:  # each skill is the one the environment writes for its episode
        assert r["episode_skill"] == get_env("ezpoints").hindsight_skill(by_id[r["episode_id"]])[1]

    # the audit: the environment's leak rule over the kept skills, the share of skills and of their characters
    skills = [r["episode_skill"] for r in kept]
    spans = find_leaks(get_env("ezpoints"), [by_id[r["episode_id"]] for r in kept], skills)
    assert m["skills/leak_frac"] == round(sum(bool(s) for s in spans) / len(kept), 4) > 0
    chars = sum(e - s for sp in spans for s, e in sp) / sum(map(len, skills))
    assert m["skills/leak_chars_frac"] == round(chars, 4) and 0 < chars < 0.5

    # a rerun asks the analyzer nothing: every answer comes from the first run's responses
    again = annotate.run(AnnotateConfig(analyzer="hindsight", from_run=str(collect), runs_dir=str(runs)))
    assert again.metrics["annotate/requests_this_session"] == 0 and again.metrics["annotate/kept"] == len(kept)


def test_the_cli_runs_hindsight_and_prints_the_audit(collect_run):
    runs, collect, trajs = collect_run
    proc = seed_cli("annotate", "--analyzer", "hindsight", "--from", str(collect), "--runs-dir", str(runs), "--json")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["metrics"]["annotate/kept"] == len(trajs) - 1
    assert 0 < result["metrics"]["skills/leak_chars_frac"] < 1


def test_two_tasks_whose_episodes_read_alike_get_their_own_replays(collect_run):
    """annotate asks one question per distinct analysis prompt; the hindsight skill comes from replaying the episode
    in its own task's game, which the prompt need not tell apart (a WebShop instruction two goals share), so two
    tasks' episodes that read alike are two questions for it (and stay one for an analyzer that reads the prompt)."""
    _, _, trajs = collect_run
    twin = trajs[0].model_copy(update={"episode_id": "twin", "task_id": trajs[1].task_id})
    for analyzer, expected in (("hindsight", 2), ("rules", 1)):
        jobs = annotate._jobs(AnnotateConfig(analyzer=analyzer), "m", [trajs[0], twin])
        assert len(jobs) == expected, analyzer


def test_probe_hindsight_skills_reject_an_episode_the_replay_does_not_reproduce(collect_run, tmp_path):
    """`seed probe --skills hindsight`: an episode the replay does not reproduce gets no own skill and says why (as
    annotate and rl do), rather than ending the probe after its model has loaded."""
    from types import SimpleNamespace as NS

    from seedcli.stages import probe

    _, _, trajs = collect_run
    episodes = [trajs[0], trajs[-1]]  # a won episode and the forged one
    out = tmp_path / "skills.jsonl"
    skills = probe._own_skills(NS(skills="hindsight"), get_env("ezpoints"), None, episodes, out)
    assert skills[0] == get_env("ezpoints").hindsight_skill(trajs[0])[1] and skills[1] is None
    rows = read_jsonl(out)
    assert rows[0]["reason"] is None and rows[1]["reason"].startswith("hindsight_replay_mismatch: the replayed game")
