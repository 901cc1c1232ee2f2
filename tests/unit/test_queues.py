"""A WAN queue below a path's bandwidth-delay product is found and warned of at load time."""

from __future__ import annotations

import warnings

import pytest

from testbed.errors import TestbedWarning
from testbed.spec.queues import queue_shortfalls
from testbed.spec.topology_file import load_topology, parse_topology
from testbed.spec.wire import FRAME_BYTES, bdp_packets


def line(links, intra=None):
    dcs = [{"name": n, "hosts": 1, **(intra or {})} for n in ("a", "b", "c")]
    return parse_topology({"dcs": dcs, "links": links}, "t.yaml")


def test_bdp_in_frames():
    # 1 Gbit/s over 400 ms: 5e7 bytes, 33025.1 frames of 1514 bytes, rounded up
    assert bdp_packets(10**9, 400_000) == 33026
    assert bdp_packets(100 * 10**6, 20_000) == -(-250_000 // FRAME_BYTES) == 166


def test_the_longest_path_through_the_bottleneck_is_named():
    topo = line(
        [
            {"between": ["a", "b"], "rate": "1gbit", "delay": "50ms"},
            {"between": ["b", "c"], "rate": "10gbit", "delay": "50ms", "queue": 100000},
        ]
    )
    (short,) = queue_shortfalls(topo)
    assert short.index == 0 and {short.src, short.dst} == {"a", "c"}  # a-c crosses both links
    assert short.rtt_us == 200_000 and short.bdp_packets == bdp_packets(10**9, 200_000)
    text = short.message("t.yaml")
    assert "links[0] (a-b): queue 1000 packets" in text and "'queue: 16513'" in text


def test_deep_enough_queues_and_slower_access_links_are_quiet():
    deep = [{"between": ["a", "b"], "rate": "1gbit", "delay": "50ms", "queue": 20000}]
    deep.append({"between": ["b", "c"], "rate": "1gbit", "delay": "1ms", "queue": 20000})
    assert queue_shortfalls(line(deep)) == []
    slow_access = [{"between": ["a", "b"], "rate": "1gbit", "delay": "50ms"}]
    slow_access.append({"between": ["b", "c"], "rate": "1gbit", "delay": "50ms"})
    assert queue_shortfalls(line(slow_access, {"intra_rate": "10mbit"})) == []


def test_loading_a_file_warns(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text(
        "dcs: [{name: a, hosts: 1}, {name: b, hosts: 1}]\nlinks: [{between: [a, b], rate: 1gbit, delay: 200ms}]\n"
    )
    with pytest.warns(TestbedWarning, match=r"deep.yaml: links\[0\] \(a-b\): queue 1000 packets .* 'queue: 33026'"):
        load_topology(path)


@pytest.mark.parametrize("name", ["two_dc", "three_dc", "four_dc", "four_dc_mesh"])
def test_the_shipped_topologies_load_without_warnings(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_topology(name)
