"""Atlas controller logic as pure functions: grant order and the links a boundary crosses."""
from __future__ import annotations

from testbed.controller import GrantQueue, Hop, boundary_hops, floor_bps
from testbed.placement import WorkerSpec
from testbed.routing import RoutingTable
from testbed.topology import parse_topology


def test_grants_go_earliest_ready_first_one_at_a_time():
    q = GrantQueue()
    a0, a1, b0 = ("a", 0), ("a", 1), ("b", 0)
    assert q.ready(0, a0) == 0            # idle link: granted at once
    assert q.ready(1, a1) is None         # queued behind replica 0's transfer
    assert q.ready(0, b0) is None
    assert q.done(a0) == 1                # the grant moves to the earliest waiting transfer
    assert q.done(a1) == 0
    assert q.done(b0) is None and q.current is None


def test_a_transfer_done_before_its_grant_leaves_the_queue():
    q = GrantQueue()
    q.ready(0, "x")
    q.ready(1, "y")
    assert q.done("y") is None            # finished on its floor rate: dropped, grant unchanged
    assert q.done("x") is None and q.current is None


def test_boundary_hops_follow_the_routed_path_both_ways():
    topo = parse_topology({"dcs": [{"name": n, "hosts": 1} for n in "abc"],
                           "links": [{"between": ["a", "b"], "rate": "10mbit", "delay": "5ms"},
                                     {"between": ["b", "c"], "rate": "10mbit", "delay": "5ms"}]}, "t")
    workers = [WorkerSpec(0, 0, 0, "a-h0", "a"), WorkerSpec(1, 1, 0, "c-h0", "c")]
    hops = boundary_hops(workers, RoutingTable(topo))
    assert hops[(0, 1)] == [Hop("a", "b"), Hop("b", "c")]
    assert hops[(1, 0)] == [Hop("c", "b"), Hop("b", "a")]


def test_boundaries_inside_a_dc_need_no_grants():
    topo = parse_topology({"dcs": [{"name": "a", "hosts": 2}], "links": []}, "t")
    workers = [WorkerSpec(0, 0, 0, "a-h0", "a"), WorkerSpec(1, 1, 0, "a-h1", "a")]
    assert boundary_hops(workers, RoutingTable(topo)) == {}


def test_floor_is_a_small_share_never_zero():
    assert floor_bps(100_000_000) == 5_000_000
    assert floor_bps(1000) == 8000


def test_the_floor_share_is_an_experiment_knob():
    from testbed.errors import SpecError
    from testbed.experiment import parse_experiment

    assert floor_bps(100_000_000, 0.0) == 8000              # "starved": the least HTB rate
    exp = parse_experiment({"topology": "three_dc", "atlas_floor_share": 0.1}, "x.yaml")
    assert exp.atlas_floor_share == 0.1
    import pytest

    with pytest.raises(SpecError, match="atlas_floor_share"):
        parse_experiment({"topology": "three_dc", "atlas_floor_share": 0.5}, "x.yaml")   # 2 replicas: < 0.5
