"""Atlas controller logic: grant order, the links a boundary crosses, the grant state machine over
control messages and the controller process's message loop (a recording switch stands in for the
kernel; tests/integration/test_live_shaping.py drives the real process)."""

from __future__ import annotations

import time

import pytest

from testbed.atlas.channel import MAX_MESSAGE_BYTES, STOP, ControlClient, encode_message, parse_message
from testbed.atlas.controller_process import serve_messages
from testbed.atlas.grants import GrantLoop, GrantQueue, Hop, boundary_paths, floor_bps
from testbed.plan.placement import WorkerSpec
from testbed.spec.routing import RoutingTable
from testbed.spec.topology_file import parse_topology


def test_grants_go_earliest_ready_first_one_at_a_time():
    q = GrantQueue()
    a0, a1, b0 = ("a", 0), ("a", 1), ("b", 0)
    assert q.ready(0, a0) == 0  # idle link: granted at once
    assert q.ready(1, a1) is None  # queued behind replica 0's transfer
    assert q.ready(0, b0) is None
    assert q.done(a0) == 1  # the grant moves to the earliest waiting transfer
    assert q.done(a1) == 0
    assert q.done(b0) is None and q.current is None


def test_a_transfer_done_before_its_grant_leaves_the_queue():
    q = GrantQueue()
    q.ready(0, "x")
    q.ready(1, "y")
    assert q.done("y") is None  # finished on its floor rate: dropped, grant unchanged
    assert q.done("x") is None and q.current is None


def test_boundary_paths_follow_the_routed_path_both_ways():
    topo = parse_topology(
        {
            "dcs": [{"name": n, "hosts": 1} for n in "abc"],
            "links": [
                {"between": ["a", "b"], "rate": "10mbit", "delay": "5ms"},
                {"between": ["b", "c"], "rate": "10mbit", "delay": "5ms"},
            ],
        },
        "t",
    )
    workers = [WorkerSpec(0, 0, 0, "a-h0", "a"), WorkerSpec(1, 1, 0, "c-h0", "c")]
    hops = boundary_paths(workers, RoutingTable(topo), [(0, 1)])
    assert hops[(0, 1)] == [Hop("a", "b"), Hop("b", "c")]
    assert hops[(1, 0)] == [Hop("c", "b"), Hop("b", "a")]


def test_boundaries_inside_a_dc_need_no_grants():
    topo = parse_topology({"dcs": [{"name": "a", "hosts": 2}], "links": []}, "t")
    workers = [WorkerSpec(0, 0, 0, "a-h0", "a"), WorkerSpec(1, 1, 0, "a-h1", "a")]
    assert boundary_paths(workers, RoutingTable(topo), [(0, 1)]) == {}


def test_floor_is_a_small_share_never_zero():
    assert floor_bps(100_000_000) == 5_000_000
    assert floor_bps(1000) == 8000


def test_the_floor_share_is_an_experiment_knob():
    from testbed.errors import SpecError
    from testbed.spec.experiment_file import parse_experiment

    assert floor_bps(100_000_000, 0.0) == 8000  # "starved": the least HTB rate
    exp = parse_experiment({"topology": "three_dc", "atlas_floor_share": 0.1}, "x.yaml")
    assert exp.atlas_floor_share == 0.1
    import pytest

    with pytest.raises(SpecError, match="atlas_floor_share"):  # 2 replicas: < 0.5
        parse_experiment({"topology": "three_dc", "policy": "atlas", "atlas_floor_share": 0.5}, "x.yaml")
    # without grants no class keeps a floor: the share is not checked against the replicas
    assert parse_experiment({"topology": "three_dc", "atlas_floor_share": 0.5}, "x.yaml").atlas_floor_share == 0.5


# ---- the grant state machine and the controller's message loop ------------------------------------


class RecordingSwitch:
    """Stands in for the kernel side (switch.GrantSwitch): records what the loop applies."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def apply(self, hop, replica, t_ready_ns=None, event="grant"):
        self.events.append(("grant", hop, replica, t_ready_ns))
        return t_ready_ns or 0

    def keep(self, hop, replica, t_ready_ns):
        self.events.append(("kept", hop, replica, t_ready_ns))

    def release(self, hop, replica, t_ns, handover, reason="done", **measured):
        self.events.append(("release", hop, replica, t_ns, handover) + (() if reason == "done" else (reason,)))


def _two_pipelines():
    """Stage 0 in DC a, stage 1 in DC b, two replicas: ranks 0, 1 (stage 0) and 2, 3 (stage 1)."""
    topo = parse_topology(
        {
            "dcs": [{"name": "a", "hosts": 2}, {"name": "b", "hosts": 2}],
            "links": [{"between": ["a", "b"], "rate": "10mbit", "delay": "5ms"}],
        },
        "t",
    )
    workers = [
        WorkerSpec(0, 0, 0, "a-h0", "a"),
        WorkerSpec(1, 0, 1, "a-h1", "a"),
        WorkerSpec(2, 1, 0, "b-h0", "b"),
        WorkerSpec(3, 1, 1, "b-h1", "b"),
    ]
    switch = RecordingSwitch()
    loop = GrantLoop(
        switch, {w.rank: w.replica for w in workers}, boundary_paths(workers, RoutingTable(topo), [(0, 1)])
    )
    return loop, switch


def msg(ev, src, dst, it=0, mb=0):
    return {"ev": ev, "src": src, "dst": dst, "it": it, "mb": mb}


def test_a_transfer_is_granted_once_both_sides_reported_and_handed_over_when_done():
    loop, switch = _two_pipelines()
    ab = Hop("a", "b")
    loop.handle(msg("ready", 0, 2), 10)  # the sender alone: gloo cannot move data yet
    assert switch.events == []
    loop.handle(msg("recv", 0, 2), 20)  # the receiver too: replica 0 gets the link at once
    assert switch.events == [("grant", ab, 0, 20)]
    loop.handle(msg("recv", 1, 3), 30)  # replica 1's transfer is ready later: it waits
    loop.handle(msg("ready", 1, 3), 31)
    assert len(switch.events) == 1 and loop.granted[ab] == 0
    loop.handle(msg("done", 0, 2), 40)  # replica 0's data arrived: handover to replica 1
    assert switch.events[1:] == [("release", ab, 0, 40, True), ("grant", ab, 1, 40)]
    loop.handle(msg("done", 1, 3), 50)  # nothing waits: released, the grant stays put
    assert switch.events[3:] == [("release", ab, 1, 50, False)]
    assert loop.granted[ab] == 1 and loop.queues[ab].current is None


def test_directions_are_granted_independently_and_the_same_holder_is_not_reapplied():
    loop, switch = _two_pipelines()
    for ev in ("ready", "recv"):
        loop.handle(msg(ev, 2, 0, mb=1), 5)  # a backward transfer: b -> a
    assert switch.events == [("grant", Hop("b", "a"), 0, 5)]
    loop.handle(msg("done", 2, 0, mb=1), 6)
    for ev in ("ready", "recv"):  # the next one of the same pipeline: already holds it
        loop.handle(msg(ev, 2, 0, mb=2), 7)
    assert [e[0] for e in switch.events] == ["grant", "release", "kept"]  # logged, not sent again


def test_unknown_messages_are_refused():
    loop, _ = _two_pipelines()
    with pytest.raises(ValueError, match="unknown control message"):
        loop.handle(msg("hello", 0, 2), 1)
    with pytest.raises(ValueError, match="not a control message"):
        parse_message(b"[1, 2]")
    with pytest.raises(ValueError):
        parse_message(b"not json")


def test_the_message_loop_feeds_the_grants_until_stop():
    """The controller process's loop over real datagrams (as ControlClient sends them)."""
    loop, switch = _two_pipelines()
    datagrams = [
        encode_message("ready", 0, 2),
        encode_message("recv", 0, 2),
        encode_message("done", 0, 2),
        encode_message(STOP),
        encode_message("ready", 1, 3),
    ]
    clock = iter(range(100, 300, 2))
    handled = serve_messages(loop, lambda n, timeout: datagrams.pop(0), clock=lambda: next(clock))
    assert handled == 3 and datagrams == [encode_message("ready", 1, 3)]  # stopped at "stop"
    assert switch.events == [("grant", Hop("a", "b"), 0, 102), ("release", Hop("a", "b"), 0, 104, False)]
    with pytest.raises(ValueError):
        serve_messages(loop, lambda n, timeout: b"garbage")


def test_the_worker_side_sends_what_the_controller_reads(tmp_path):
    """ControlClient's datagrams arrive as the loop's messages; with no controller, nothing happens."""
    import socket

    path = tmp_path / "c.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(path))
    ControlClient(str(path)).send("ready", 4, 5, 6, 7)
    got = parse_message(server.recv(MAX_MESSAGE_BYTES))
    t = got.pop("t")  # when it was sent: the controller times the transfer from it
    assert got == msg("ready", 4, 5, 6, 7) and 0 < t <= time.monotonic_ns()
    server.close()
    ControlClient(str(path)).send("ready", 4, 5, 6, 7)  # the controller is gone: dropped silently
    ControlClient(None).send("ready", 4, 5, 6, 7)  # no controller in this run


def test_the_message_loop_acts_on_its_timers_between_messages():
    """With no message coming, the loop wakes when a deadline is due and releases the grant."""
    from testbed.atlas.grants import HopTiming

    loop, switch = _two_pipelines()
    timing = {h: HopTiming(1, 0, 150, 1, 10_000_000) for h in loop.held}
    loop.timing = timing
    clock = iter(range(0, 10_000, 100))
    feed = [encode_message("ready", 0, 2), encode_message("recv", 0, 2), None, None, None, encode_message(STOP)]
    waits = []

    def recv(n, timeout):
        waits.append(timeout)
        return feed.pop(0)

    serve_messages(loop, recv, clock=lambda: next(clock))
    assert ("release", Hop("a", "b"), 0) == switch.events[1][:3] and switch.events[1][-1] == "deadline"
    assert waits[0] is None and waits[2] is not None  # blocked until the first message, then timed
