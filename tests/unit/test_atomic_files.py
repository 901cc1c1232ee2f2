"""Whole JSON files replaced atomically (``trace/jsonl.write_json_atomic``) and the data-parallel
groups' one connection per pair (``train/striping.one_connection_per_pair``): pure file and
environment logic."""

from __future__ import annotations

import json
import os

import pytest

from testbed.trace.jsonl import write_json_atomic
from testbed.train.striping import one_connection_per_pair


def test_a_json_file_is_replaced_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "plan.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"a": [2, 3]})
    assert json.loads(path.read_text()) == {"a": [2, 3]}
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


@pytest.mark.parametrize(
    "before, inside", [("eth0,eth0,eth0,eth0", "eth0"), ("eth1,eth0", "eth1"), ("eth0", "eth0"), (None, None)]
)
def test_groups_made_inside_see_one_interface_and_the_striped_list_comes_back(monkeypatch, before, inside):
    if before is None:
        monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    else:
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", before)
    with pytest.raises(RuntimeError, match="boom"), one_connection_per_pair():
        assert os.environ.get("GLOO_SOCKET_IFNAME") == inside
        raise RuntimeError("boom")  # restored even when creating a group fails
    assert os.environ.get("GLOO_SOCKET_IFNAME") == before
