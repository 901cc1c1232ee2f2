"""Routing: least total one-way delay, ties by fewer hops then DC name; host-to-host figures."""

import itertools

import pytest

from testbed.spec.routing import RoutingTable
from testbed.spec.topology_file import load_topology, parse_topology


def spec(dcs, links, **dc_extra):
    """``links`` as (a, b, rate, delay[, loss]) tuples; ``dc_extra`` maps a DC to extra fields."""
    return parse_topology(
        {
            "dcs": [{"name": n, "hosts": 2, **dc_extra.get(n, {})} for n in dcs],
            "links": [dict(zip(("between", "rate", "delay", "loss"), ([a, b], *rest))) for a, b, *rest in links],
        }
    )


def brute_force_best(s, src, dst):
    """(delay, hops) of the best simple path, by enumerating every ordering of intermediate DCs."""
    others = [dc.name for dc in s.dcs if dc.name not in (src, dst)]
    best = None
    for k in range(len(others) + 1):
        for middle in itertools.permutations(others, k):
            path = (src, *middle, dst)
            hops = [s.link_between(x, y) for x, y in zip(path, path[1:])]
            if all(hops):
                cand = (sum(link.delay_us for link in hops), len(hops))
                best = cand if best is None else min(best, cand)
    return best


@pytest.mark.parametrize("name", ["two_dc", "three_dc", "four_dc_mesh"])
def test_shipped_routes_are_least_delay(name):
    s = load_topology(name)
    rt = RoutingTable(s)
    for a, b in itertools.permutations([dc.name for dc in s.dcs], 2):
        r = rt.route(a, b)
        assert (r.dcs[0], r.dcs[-1]) == (a, b)
        assert (r.wan_delay_us, len(r.links)) == brute_force_best(s, a, b)


def test_detour_taken_when_faster():
    # direct a-c 50 ms; through b 10 + 10 ms
    s = spec("abc", [("a", "c", "100mbit", "50ms"), ("a", "b", "100mbit", "10ms"), ("b", "c", "20mbit", "10ms")])
    r = RoutingTable(s).route("a", "c")
    assert r.dcs == ("a", "b", "c")
    assert r.wan_delay_us == (10 + 10) * 1000
    assert r.bottleneck_bps == 20 * 10**6


def test_equal_delay_prefers_fewer_hops():
    # direct 20 ms equals 10 + 10 ms through b: the direct link (1 hop) wins
    s = spec("abc", [("a", "b", "1mbit", "10ms"), ("b", "c", "1mbit", "10ms"), ("a", "c", "1mbit", "20ms")])
    assert RoutingTable(s).route("a", "c").dcs == ("a", "c")


def test_equal_delay_and_hops_prefers_dc_name():
    # two 2-hop paths of 20 ms from a to d; the links through 'c' are listed first, 'b' still wins
    s = spec(
        "abcd",
        [
            ("a", "c", "1mbit", "10ms"),
            ("c", "d", "1mbit", "10ms"),
            ("a", "b", "1mbit", "10ms"),
            ("b", "d", "1mbit", "10ms"),
        ],
    )
    rt = RoutingTable(s)
    assert rt.route("a", "d").dcs == ("a", "b", "d")
    assert rt.route("d", "a").dcs == ("d", "b", "a")


def walk(rt, src, dst):
    """The DCs visited following each router's next hop, stopping (not hanging) on a loop."""
    dcs = [src]
    while dcs[-1] != dst and len(dcs) <= len(rt.spec.dcs):
        dcs.append(rt.next_hop(dcs[-1], dst)[0])
    return tuple(dcs)


def test_zero_delay_links_do_not_loop():
    # a triangle of zero-delay links plus a tail: following next hops must reach the destination
    s = spec(
        "abcd",
        [
            ("a", "b", "1mbit", "0ms"),
            ("b", "c", "1mbit", "0ms"),
            ("c", "a", "1mbit", "0ms"),
            ("c", "d", "1mbit", "0ms"),
        ],
    )
    rt = RoutingTable(s)
    for a, b in itertools.permutations("abcd", 2):
        dcs = walk(rt, a, b)
        assert dcs[-1] == b and len(set(dcs)) == len(dcs), dcs  # arrived, no DC visited twice
        assert len(dcs) - 1 == brute_force_best(s, a, b)[1]  # on a fewest-hop path
        assert rt.route(a, b).dcs == dcs


def test_one_way_delay_includes_access_links():
    s = spec(
        "abc",
        [("a", "b", "100mbit", "10ms"), ("b", "c", "100mbit", "25ms")],
        a={"intra_delay": "100us"},
        c={"intra_delay": "300us"},
    )
    rt = RoutingTable(s)
    assert rt.one_way_delay_us("a", "c") == 100 + (10 + 25) * 1000 + 300
    assert rt.one_way_delay_us("c", "a") == rt.one_way_delay_us("a", "c")
    assert rt.one_way_delay_us("a", "a") == 2 * 100  # two access links within one DC
    assert rt.one_way_delay_us("b", "b") == 0


def test_bottleneck_counts_access_links():
    s = spec(
        "abc",
        [("a", "b", "100mbit", "10ms"), ("b", "c", "50mbit", "10ms")],
        a={"intra_rate": "10mbit"},
        c={"intra_rate": "1gbit"},
    )
    rt = RoutingTable(s)
    assert rt.bottleneck_bps("a", "c") == 10 * 10**6  # a's access link
    assert rt.bottleneck_bps("c", "b") == 50 * 10**6  # the WAN link b-c
    assert rt.bottleneck_bps("b", "b") is None  # unshaped within b
    assert rt.bottleneck_bps("c", "c") == 10**9


def test_delivery_probability_multiplies_link_losses():
    s = spec("abc", [("a", "b", "1mbit", "10ms", "1%"), ("b", "c", "1mbit", "10ms", "2%")])
    r = RoutingTable(s).route("a", "c")
    assert r.delivery_probability == pytest.approx((1 - 0.01) * (1 - 0.02))
    assert RoutingTable(s).route("a", "a").delivery_probability == 1.0


def test_next_hop_refuses_the_destination():
    rt = RoutingTable(load_topology("two_dc"))
    with pytest.raises(ValueError):
        rt.next_hop("east", "east")
