"""`seed inspect` on collect and eval runs: a table of episodes, one in full, --episode, --failed (seedcli.inspection)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from seedcli.errors import UserError
from seedcli.inspection import inspect_run, locate, show_episodes
from seedcli.records import Trajectory, Turn, write_jsonl
from tests.helpers_cli import seed_cli


def turn(step: int, action: str, valid: bool = True, observation: str = "You are in a room.") -> Turn:
    return Turn(
        step=step,
        observation=observation,
        admissible=["go to desk 1", "look"],
        prompt="p",
        response=f"<think>step {step}</think><action>{action}</action>",
        action=action,
        valid=valid,
        admissible_action=action in ("go to desk 1", "look"),
    )


def trajectory(i: int, won: bool, category: str, turns: list[Turn]) -> Trajectory:
    return Trajectory(
        episode_id=f"e{i:04d}",
        group_id=f"e{i:04d}",
        env="alfworld",
        task_id=f"valid_seen/task-{i}/game.tw-pddl",
        split="valid_seen",
        category=category,
        task=f"put a mug in the desk ({i}).",
        turns=turns,
        won=won,
        score=1.0 if won else 0.0,
        reward=10.0 if won else 0.0,
        length=len(turns),
        engine="hf",
        model_id="runs/rl/x/model",
        model_hash="abc",
        sampling={},
        prompt_version="v1",
        seed=0,
    )


def make_run(root: Path, stage: str) -> Path:
    run = root / stage / "20260101T000000Z-abcd"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"stage": stage}))
    long_obs = "You arrive at desk 1. " + "On the desk 1, you see a pen. " * 40
    episodes = [
        trajectory(1, True, "pick", [turn(1, "go to desk 1"), turn(2, "look")]),  # the file is in completion order
        trajectory(0, False, "clean", [turn(1, "fly away", valid=False), turn(2, "jump", observation=long_obs)]),
        trajectory(2, False, "heat", [turn(1, "look")]),
    ]
    name = "trajectories.jsonl" if stage == "collect" else "episodes.jsonl"
    write_jsonl(run / name, episodes)
    return run


def shown(fn, *args, **kw) -> tuple[object, str]:
    buf = io.StringIO()
    result = fn(*args, console=Console(file=buf, width=150), **kw)
    return result, buf.getvalue()


@pytest.mark.parametrize("stage", ["collect", "eval"])
def test_a_table_of_episodes_then_the_first_in_full(tmp_path: Path, stage: str):
    run = make_run(tmp_path, stage)
    rec, text = shown(inspect_run, run)
    assert rec["episode_id"] == "e0000"  # sorted by id, not in the order the episodes ended
    assert text.index("e0000") < text.index("e0001") < text.index("e0002")
    assert "3 episodes, 1 won, mean score 0.333" in text
    # e0000 in full: task, each turn's action, validity with rl's penalty, abridged observation, outcome
    assert "put a mug in the desk (0)." in text
    assert "turn 1: action 'fly away'  INVALID (rl penalty −0.1)" in text
    assert "not an admissible action" in text
    assert "… (+" in text and "chars)" in text  # the long observation is abridged
    assert "outcome: not won; score 0.00" in text and "1 invalid turn(s), −0.1 each in rl" in text


def test_failed_lists_only_episodes_not_won(tmp_path: Path):
    run = make_run(tmp_path, "eval")
    rec, text = shown(show_episodes, run, failed=True)
    table = text.split("3 episodes")[0]
    assert "e0000" in table and "e0002" in table and "e0001" not in table
    assert rec["episode_id"] == "e0000"


def test_one_episode_by_id_and_an_unknown_one(tmp_path: Path):
    run = make_run(tmp_path, "collect")
    rec, text = shown(inspect_run, run, episode="e0001")
    assert rec["won"] and "WON" in text and "score 1.00  reward 10" in text and "episodes of" not in text
    with pytest.raises(
        UserError, match=r"no episode 'e9' in .*trajectories.jsonl; its episodes are e0001, e0000, e0002"
    ):
        inspect_run(run, episode="e9")


def test_plays_counts_each_action_sequence_won_and_lost(tmp_path: Path):
    run = make_run(tmp_path, "eval")
    extra = [
        trajectory(3, True, "pick", [turn(1, "go to desk 1"), turn(2, "look")]),
        trajectory(4, False, "pick", [turn(1, "look")]),
        trajectory(5, False, "pick", [turn(1, "look")]),
    ]
    rows = [json.loads(x) for x in (run / "episodes.jsonl").read_text().splitlines()] + [e.model_dump() for e in extra]
    write_jsonl(run / "episodes.jsonl", rows)
    rec, text = shown(inspect_run, run, plays=True)
    assert rec is None
    lines = [ln.split("│")[1:-1] for ln in text.splitlines() if ln.startswith("│")]
    assert [[c.strip() for c in ln] for ln in lines] == [
        ["3", "0", "3", "look"],  # the commonest first
        ["2", "2", "0", "go to desk 1 | look"],  # actions with spaces are joined by " | "
        ["1", "0", "1", "fly away | jump"],
    ]
    said = " ".join(text.split())  # the console wraps the long summary line
    assert "episodes.jsonl: 6 episodes, 2 won, mean score 0.333; 3 distinct action sequences among 6 listed" in said
    _, text = shown(inspect_run, run, plays=True, failed=True)
    assert "commonest plays of the failed episodes" in text and "go to desk 1 | look" not in text


def test_image_observations_are_shown_as_paths(tmp_path: Path):
    run = make_run(tmp_path, "eval")
    (run / "images").mkdir()
    (run / "images" / "ab12.png").write_bytes(b"\x89PNG")
    rec = trajectory(3, False, "pick", [turn(1, "look")]).model_dump()
    rec["turns"][0]["images"] = ["images/ab12.png", "images/gone.png"]  # a visual environment's record
    write_jsonl(run / "episodes.jsonl", [rec])
    _, text = shown(inspect_run, run, episode="e0003")
    assert f"image: {run / 'images' / 'ab12.png'}" in text
    assert f"image: {run / 'images' / 'gone.png'} (missing)" in text


def test_options_of_the_wrong_kind_of_run_are_one_line(tmp_path: Path):
    run = make_run(tmp_path, "eval")
    with pytest.raises(UserError, match="not an rl run; --step chooses an rl run's update"):
        inspect_run(run, step=3)
    rl = tmp_path / "rl" / "r"
    rl.mkdir(parents=True)
    (rl / "manifest.json").write_text(json.dumps({"stage": "rl"}))
    with pytest.raises(UserError, match="an rl run; --episode, --failed and --plays read the episodes of collect and"):
        inspect_run(rl, failed=True)
    with pytest.raises(UserError, match="an rl run; --episode, --failed and --plays"):
        inspect_run(rl, plays=True)
    with pytest.raises(UserError, match="--plays lists the commonest action sequences of all episodes; drop --episode"):
        inspect_run(run, plays=True, episode="e0001")
    assert locate(rl) == ("rl", rl)
    sft = tmp_path / "sft" / "s"
    sft.mkdir(parents=True)
    (sft / "manifest.json").write_text(json.dumps({"stage": "sft"}))
    with pytest.raises(UserError, match="a sft run with no trajectories.jsonl or episodes.jsonl"):
        inspect_run(sft)


def test_seed_inspect_cli_on_an_eval_run(tmp_path: Path):
    run = make_run(tmp_path, "eval")
    proc = seed_cli("inspect", str(run), "--failed")
    assert "failed episodes of" in proc.stdout and "e0002" in proc.stdout and "turn 1: action 'fly away'" in proc.stdout
    proc = seed_cli("inspect", str(run), "--step", "2", check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
