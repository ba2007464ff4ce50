import pytest

from seedcli.errors import UserError
from seedcli.records import JsonlWriter, read_jsonl, repair_tail


def test_writer_appends_and_a_crash_tail_is_dropped(tmp_path):
    path = tmp_path / "r.jsonl"
    with JsonlWriter(path) as w:
        w.write({"i": 1})
        w.write({"i": 2})
    with open(path, "ab") as fh:
        fh.write(b'{"i": 3, "tru')  # a killed writer leaves half a line
    assert repair_tail(path) == len(b'{"i": 3, "tru')
    with JsonlWriter(path) as w:
        w.write({"i": 4})
    assert [r["i"] for r in read_jsonl(path)] == [1, 2, 4]


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"i": 1}\nnot json\n')
    with pytest.raises(UserError, match=r"r.jsonl:2: not a valid JSON record"):
        read_jsonl(path)


def _schema1_trajectory(won: bool) -> dict:
    """A trajectory line as seedcli wrote it before environment plug-ins (record schema 1, ALFWorld only)."""
    return {
        "episode_id": "g0000-r00", "group_id": "g0000", "game_file": "json_2.1.1/train/pick-x/t1/game.tw-pddl",
        "split": "train", "task_type": "pick", "task": "put a mug in fridge.", "turns": [], "won": won,
        "reward": 10.0 if won else 0.0, "length": 0, "engine": "hf", "model_id": "m", "model_hash": "h",
        "sampling": {}, "prompt_version": "alfworld-agent-v1", "seed": 0, "policy": "model",
    }  # fmt: skip


def test_schema1_records_are_migrated_on_read(tmp_path):
    import orjson

    from seedcli.records import RECORD_SCHEMA_VERSION, SkillRecord, Trajectory

    path = tmp_path / "trajectories.jsonl"
    path.write_bytes(b"".join(orjson.dumps(_schema1_trajectory(w)) + b"\n" for w in (True, False)))
    won, lost = read_jsonl(path, Trajectory)
    assert (won.env, won.task_id, won.category) == ("alfworld", "json_2.1.1/train/pick-x/t1/game.tw-pddl", "pick")
    assert (won.score, lost.score) == (1.0, 0.0)  # ALFWorld: score = won
    assert won.schema_version == RECORD_SCHEMA_VERSION == 2
    assert won.task_type == "pick" and won.game_file == won.task_id  # the old names still read
    # written back, it is a schema-2 record without the old fields
    data = won.model_dump(mode="json")
    assert "game_file" not in data and "task_type" not in data and data["env"] == "alfworld"
    skill = SkillRecord.model_validate(
        {
            "episode_id": "e",
            "key": "k",
            "task_type": "pick",
            "task": "t",
            "won": True,
            "analyzer": "rules",
            "model": "rules-v1",
            "prompt_version": "analysis-v1",
            "prompt": "p",
            "raw": "{}",
        }  # fmt: skip
    )
    assert (skill.env, skill.category) == ("alfworld", "pick")


def test_a_newer_record_schema_is_refused_in_one_line(tmp_path):
    import orjson

    path = tmp_path / "trajectories.jsonl"
    path.write_bytes(orjson.dumps({**_schema1_trajectory(True), "schema_version": 3}) + b"\n")
    from seedcli.records import Trajectory

    with pytest.raises(UserError, match=r"trajectories.jsonl:1: .*record schema 3 is newer than this seedcli's \(2\)"):
        read_jsonl(path, Trajectory)


def test_same_play_compares_reply_tokens_and_log_probs():
    from seedcli.records import Trajectory, Turn

    def episode(*turns) -> Trajectory:  # only the replies matter here
        return Trajectory.model_construct(
            turns=[Turn.model_construct(response_ids=ids, logprobs=lp) for ids, lp in turns]
        )

    a = episode(([1, 2], [-0.5, -1.0]), ([3], [-0.1]))
    assert a.same_play(episode(([1, 2], [-0.50001, -1.0]), ([3], [-0.1])))  # float noise
    assert not a.same_play(episode(([1, 2], [-0.5, -1.0]), ([4], [-0.1])))  # another token
    assert not a.same_play(episode(([1, 2], [-0.5, -1.1]), ([3], [-0.1])))  # another log-prob
    assert not a.same_play(episode(([1, 2], [-0.5, -1.0])))  # a turn fewer
    assert not a.same_play(None)
