"""Following a JSON-lines file another process appends to (``trace/jsonl.JsonlFollower``)."""

from __future__ import annotations

from testbed.trace.jsonl import JsonlFollower


def test_a_follower_reads_each_complete_line_once(tmp_path):
    path = tmp_path / "log.jsonl"
    follower = JsonlFollower(path)
    assert follower.new_rows() == []  # not there yet
    path.write_text('{"a": 1}\n[2]\nnot json\n{"b": 2}\n{"c": ')
    assert follower.new_rows() == [{"a": 1}, {"b": 2}]  # a list and a torn line are not rows
    assert follower.new_rows() == []
    with open(path, "a") as f:
        f.write('3}\n{"d": 4}\n')
    assert follower.new_rows() == [{"c": 3}, {"d": 4}]  # the torn line, once it is whole


def test_a_follower_of_some_events_parses_only_their_lines(tmp_path):
    from testbed.trace.jsonl import open_jsonl, write_row

    path = tmp_path / "log.jsonl"
    with open_jsonl(path) as log:
        write_row(log, {"t_ns": 1, "event": "change", "classid": "1:20"})
        write_row(log, {"t_ns": 2, "event": "link_down", "link": "a:b"})
        write_row(log, {"t_ns": 3, "event": "link_downs", "link": "a:b"})  # not the same event
        write_row(log, {"t_ns": 4, "event": "link_up", "link": "a:b"})
    assert [r["t_ns"] for r in JsonlFollower(path, ("link_down", "link_up")).new_rows()] == [2, 4]
    assert len(JsonlFollower(path).new_rows()) == 4
