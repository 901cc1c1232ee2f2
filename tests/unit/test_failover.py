"""Route failover as data: which links may fail over, and the routes once a link is gone."""

from __future__ import annotations

import json

import pytest

from testbed.errors import SpecError
from testbed.net.failover import next_hops
from testbed.spec.routing import RoutingTable, routes_without
from testbed.spec.topology import TopologySpec
from testbed.spec.topology_file import load_topology, parse_topology


def _triangle(**central_west):
    return parse_topology(
        {
            "dcs": [{"name": n, "hosts": 1} for n in ("east", "central", "west")],
            "links": [
                {"between": ["east", "central"], "rate": "100mbit", "delay": "10ms"},
                {"between": ["central", "west"], "rate": "100mbit", "delay": "25ms", **central_west},
                {"between": ["east", "west"], "rate": "50mbit", "delay": "30ms"},
            ],
        },
        "t.yaml",
    )


def test_a_failed_link_s_routes_go_the_other_way_round():
    spec = load_topology("three_dc")
    built = next_hops(spec, RoutingTable(spec))
    failed = next_hops(spec, routes_without(spec, {"central:west"}))
    moved = {k: v for k, v in failed.items() if built[k] != v}
    assert moved == {("central", "west"): "east", ("west", "central"): "east"}
    assert routes_without(spec, {"central:west"}).rtt_us("central", "west") == 2 * (10_000 + 30_000)


def test_failover_is_read_checked_and_recorded():
    spec = _triangle(failover=True, failover_after="150ms")
    link = spec.links[1]
    assert (link.failover, link.failover_after_us) == (True, 150_000)
    assert spec.links[0].failover is False and spec.links[0].failover_after_us == 300_000
    assert TopologySpec.from_dict(json.loads(json.dumps(spec.to_dict()))).links == spec.links
    assert parse_topology(spec.to_file_dict(), "again.yaml").links == spec.links


def test_a_link_without_another_path_cannot_fail_over():
    data = {
        "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}, {"name": "c", "hosts": 1}],
        "links": [
            {"between": ["a", "b"], "rate": "10mbit", "delay": "5ms"},
            {"between": ["b", "c"], "rate": "10mbit", "delay": "5ms", "failover": True},
        ],
    }
    with pytest.raises(SpecError) as e:
        parse_topology(data, "chain.yaml")
    assert e.value.field == "links[1].failover" and "b and c are not connected" in str(e.value)
    with pytest.raises(SpecError, match="links\\[1\\].failover_after"):
        _triangle(failover=True, failover_after="2min")
