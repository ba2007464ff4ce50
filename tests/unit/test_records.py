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
