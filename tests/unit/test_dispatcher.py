"""BubbleTea's dispatcher over real Unix datagram sockets: when it waits, what it hands out, and
what it logs."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from testbed.bubbletea.dispatcher import POLL_S, Dispatcher, wait_s
from testbed.bubbletea.request_table import Request
from testbed.spec.bubbletea import BubbleTeaSpec
from testbed.spec.model import ModelConfig
from testbed.trace.jsonl import read_jsonl

SPEC = BubbleTeaSpec(model=ModelConfig())  # what the runner passes: the served model resolved


def test_wait_until_the_next_arrival_at_most_poll():
    assert wait_s(0, 20_000_000, pending=False) == pytest.approx(0.02)
    assert wait_s(0, 10**12, pending=False) == POLL_S
    assert wait_s(30_000_000, 20_000_000, pending=False) == 0.0  # due: no wait


def test_wait_poll_while_requests_wait_for_room_or_none_is_to_come():
    assert wait_s(0, 1_000_000, pending=True) == POLL_S  # only a profile can make room
    assert wait_s(0, None, pending=False) == POLL_S


def _profile(rank: int, largest_s: float) -> bytes:
    msg = {"rank": rank, "bubble_s": largest_s, "largest_s": largest_s, "iteration_s": 1.0, "backlog_s": 0.0}
    return json.dumps({**msg, "ready": True}).encode()


def _recv_all(sock: socket.socket, n: int, timeout_s: float = 5.0) -> list[dict]:
    sock.settimeout(timeout_s)
    return [json.loads(sock.recv(4096)) for _ in range(n)]


def test_requests_go_to_the_worker_with_room_after_every_worker_is_ready(tmp_path: Path):
    inboxes = {}
    for rank in (0, 1):
        inboxes[rank] = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        inboxes[rank].bind(str(tmp_path / f"in{rank}"))
    reqs = [Request(0, 0.0, 64, 4), Request(1, 0.03, 64, 4)]
    d = Dispatcher(SPEC, reqs, [0, 1], 1e-12, tmp_path / "d.sock", str(tmp_path / "in{rank}"), tmp_path)
    d.start()
    talk = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        talk.sendto(_profile(0, 0.5), str(tmp_path / "d.sock"))
        time.sleep(3 * POLL_S)
        assert d.t0_ns is None  # rank 1 has not said it predicts a bubble: no stream yet
        talk.sendto(_profile(1, 0.0), str(tmp_path / "d.sock"))  # ready, but no bubble holds a chunk
        got = _recv_all(inboxes[0], 2)
        assert [m["rid"] for m in got] == [0, 1]
        assert [m["prompt"] for m in got] == [64, 64]
    finally:
        d.stop()
        talk.close()
        for s in inboxes.values():
            s.close()
    log = read_jsonl(tmp_path / "requests" / "dispatch.jsonl")
    assert log[0]["event"] == "stream_start"
    assigned = [r for r in log if r["event"] == "assign"]
    assert [r["worker"] for r in assigned] == [0, 0]
    assert assigned[1]["arrival_ns"] - assigned[0]["arrival_ns"] == 30_000_000
    assert all(r["assigned_ns"] >= r["arrival_ns"] for r in assigned)
    assert not d.is_alive() and d.failed is None


def test_a_request_waits_until_a_profile_makes_room(tmp_path: Path):
    inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    inbox.bind(str(tmp_path / "in0"))
    reqs = [Request(7, 0.0, 64, 4)]
    d = Dispatcher(SPEC, reqs, [0], 1e-12, tmp_path / "d.sock", str(tmp_path / "in{rank}"), tmp_path)
    d.start()
    talk = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        talk.sendto(_profile(0, 0.0), str(tmp_path / "d.sock"))  # ready, no room
        inbox.settimeout(3 * POLL_S)
        with pytest.raises(TimeoutError):
            inbox.recv(4096)
        talk.sendto(_profile(0, 0.5), str(tmp_path / "d.sock"))
        assert _recv_all(inbox, 1)[0]["rid"] == 7
    finally:
        d.stop()
        talk.close()
        inbox.close()
