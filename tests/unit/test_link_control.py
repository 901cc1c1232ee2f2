"""Naming a WAN link and its two ends for ``testbed link`` (``net/link_control.py``); the rules that
take it down run in ``tests/integration/test_link_control.py``."""

from __future__ import annotations

import pytest

from testbed.net.link_control import LinkEnd, LinkError, drop_rules, link_ends, resolve_link
from testbed.spec.topology_file import load_topology


def test_each_link_is_named_by_its_dcs_with_its_two_router_ends():
    spec = load_topology("three_dc")
    ends = link_ends(spec, "tb0001")
    assert set(ends) == {f"{x.a}:{x.b}" for x in spec.links} and len(ends) == 3
    for name, (a, b) in ends.items():
        left, right = name.split(":")
        assert a.netns == f"tb0001-{left}-r" and b.netns == f"tb0001-{right}-r"
        assert a.ifname != b.ifname


def test_a_link_is_found_in_either_order_and_an_unknown_one_is_named():
    spec = load_topology("two_dc")
    assert resolve_link(spec, "east:west") == resolve_link(spec, "west:east") == "east:west"
    for bad in ("east-west", "east:north", "east"):
        with pytest.raises(LinkError, match="its links are east:west"):
            resolve_link(spec, bad)


def test_a_link_down_drops_what_leaves_and_what_arrives_on_its_interface():
    assert drop_rules(LinkEnd("ns", "w-west")) == [["-o", "w-west", "-j", "DROP"], ["-i", "w-west", "-j", "DROP"]]
