"""Mininet topo generation from a spec (pure data: no root, no kernel), the topologies/ module for
``mn --custom``, the one-Mininet-run lock and the backend options."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from testbed.cli.common import backend as backend_kwargs
from testbed.errors import SpecError
from testbed.net import registry
from testbed.net.mininet_backend import BackendBusyError, MininetLock
from testbed.net.mininet_topo import DCRouter, build_topo, router_node, tclink_params
from testbed.spec.addressing import AddressPlan
from testbed.spec.topology_file import TOPOLOGY_DIR, load_topology, parse_topology

REPO = Path(__file__).resolve().parents[2]


def _links(topo) -> dict[tuple[str, str], dict]:
    return {(a, b): info for a, b, info in topo.links(withInfo=True)}


def test_three_dc_nodes_addresses_and_interfaces():
    spec = load_topology("three_dc")
    topo, plan = build_topo(spec), AddressPlan(spec, "tbXXXX")
    assert sorted(topo.nodes()) == sorted([router_node(dc.name) for dc in spec.dcs] + list(plan.hosts))
    assert topo.switches() == []  # no switch: neither Open vSwitch nor a controller is needed
    for h in plan.hosts.values():
        info = topo.nodeInfo(h.name)
        assert info["ip"] == f"{h.ip}/{h.subnet.prefixlen}" and info["defaultRoute"] == f"via {h.gateway}"
        link = _links(topo)[(h.name, router_node(h.dc))]
        assert (link["intfName1"], link["intfName2"]) == ("eth0", f"h{h.index}")
    for dc in spec.dcs:
        info = topo.nodeInfo(router_node(dc.name))
        r = plan.routers[dc.name]
        assert info["cls"] is DCRouter and info["ip"] is None
        assert info["bridge_ip"] == f"{r.ip}/24" and info["ports"] == ("h0", "h1", "h2")
        assert len(info["routes"]) == len(spec.dcs) - 1


def test_wan_links_carry_the_plans_addresses_and_the_files_shaping():
    spec = load_topology("two_dc")
    plan, links = AddressPlan(spec, "tbXXXX"), _links(build_topo(spec))
    link = spec.links[0]
    info = links[(router_node(link.a), router_node(link.b))]
    ea, eb = plan.wan_ends[(link.a, link.b)], plan.wan_ends[(link.b, link.a)]
    assert (info["intfName1"], info["intfName2"]) == (ea.ifname, eb.ifname) == ("w-west", "w-east")
    assert info["params1"] == {"ip": str(ea.ip)} and info["params2"] == {"ip": str(eb.ip)}
    assert info["bw"] == link.rate_bps / 1e6 and info["delay"] == "20ms"
    assert info["max_queue_size"] == link.queue_packets


def test_routes_follow_least_delay_paths():
    spec = parse_topology(
        {
            "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}, {"name": "c", "hosts": 1}],
            "links": [
                {"between": ["a", "b"], "rate": "1gbit", "delay": "5ms"},
                {"between": ["b", "c"], "rate": "1gbit", "delay": "5ms"},
                {"between": ["a", "c"], "rate": "1gbit", "delay": "30ms"},
            ],
        },
        "line",
    )
    topo, plan = build_topo(spec), AddressPlan(spec, "tbXXXX")
    routes = dict(topo.nodeInfo("a-r")["routes"])
    # a reaches c through b (10 ms) rather than over the direct 30 ms link
    assert routes[str(plan.routers["c"].subnet)] == str(plan.wan_ends[("a", "b")].peer_ip)
    assert routes[str(plan.routers["b"].subnet)] == str(plan.wan_ends[("a", "b")].peer_ip)


def test_tclink_params_units_and_limits():
    assert tclink_params(50_000_000, 12_500, 1_000, 0.5, 100) == {
        "bw": 50.0,
        "delay": "12.5ms",
        "jitter": "1ms",
        "loss": 0.5,
        "max_queue_size": 100,
    }
    assert tclink_params(10_000_000_000, 0) == {}  # TCLink refuses more than 1 Gbit/s
    assert tclink_params(None, 500) == {"delay": "500us"}


def test_mn_custom_module_offers_every_shipped_topology():
    """mn --custom exec()s the file without __file__ (mininet/net.py's MininetRunner.custom)."""
    path = REPO / "topologies" / "mininet_topos.py"
    scope: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), scope, scope)
    shipped = {p.stem for p in TOPOLOGY_DIR.glob("*.yaml")}
    assert shipped <= set(scope["topos"]) and {"two_dc", "three_dc"} <= shipped
    topo = scope["topos"]["three_dc"]()
    assert len(topo.hosts()) == load_topology("three_dc").host_count + 3
    assert sorted(scope["topos"]["file"](str(TOPOLOGY_DIR / "two_dc.yaml")).nodes()) == sorted(
        build_topo(load_topology("two_dc")).nodes()
    )


def test_second_mininet_run_gets_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "RUN_DIR", tmp_path)
    first = MininetLock("tbaaaa")
    first.acquire()
    with pytest.raises(BackendBusyError, match=r"run tbaaaa, pid \d+.*one at a time"):
        MininetLock("tbbbbb").acquire()
    first.release()
    again = MininetLock("tbcccc")
    again.acquire()  # released: the next run may start
    again.release()


@pytest.mark.parametrize(
    "backend,inventory,match",
    [
        ("remote", None, "--inventory"),
        ("netns", Path("inv.yaml"), "only used by --backend remote"),
        ("mininet", Path("inv.yaml"), "only used by --backend remote"),
    ],
)
def test_backend_options_are_checked(backend, inventory, match):
    with pytest.raises(SpecError, match=match):
        backend_kwargs(argparse.Namespace(backend=backend, inventory=inventory))
    assert backend_kwargs(argparse.Namespace(backend="mininet", inventory=None)) == {
        "backend": "mininet",
        "inventory": None,
    }
