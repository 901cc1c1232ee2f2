"""The address and name plan: deterministic, router .1, hosts from .2, WAN /30s, prefixed names."""

import ipaddress
import re

from testbed.spec.addressing import AddressPlan, new_run_prefix
from testbed.spec.topology_file import load_topology, parse_topology

PREFIX = "tb0a1f"


def test_dc_subnets_router_and_hosts():
    spec = load_topology("three_dc")
    plan = AddressPlan(spec, PREFIX)
    pool = spec.dc_pool
    size = 2 ** (32 - spec.dc_prefix_len)
    for i, dc in enumerate(spec.dcs):
        subnet = ipaddress.IPv4Network((int(pool.network_address) + i * size, spec.dc_prefix_len))
        router = plan.routers[dc.name]
        assert router.subnet == subnet
        assert router.ip == subnet.network_address + 1
        hosts = plan.hosts_of(dc.name)
        assert [h.name for h in hosts] == [f"{dc.name}-h{k}" for k in range(dc.hosts)]
        assert [h.ip for h in hosts] == [subnet.network_address + 2 + k for k in range(dc.hosts)]
        assert all(h.gateway == router.ip and h.subnet == subnet for h in hosts)


def test_two_dc_addresses_spelled_out():
    plan = AddressPlan(load_topology("two_dc"), PREFIX)
    assert str(plan.routers["east"].ip) == "10.100.0.1"
    assert str(plan.hosts["east-h0"].ip) == "10.100.0.2"
    assert str(plan.hosts["east-h1"].ip) == "10.100.0.3"
    assert str(plan.hosts["west-h0"].ip) == "10.100.1.2"
    assert plan.first_host("west").name == "west-h0"


def test_plan_is_deterministic():
    spec = load_topology("four_dc_mesh")
    a, b = AddressPlan(spec, PREFIX), AddressPlan(spec, PREFIX)
    assert a.hosts == b.hosts and a.routers == b.routers and a.wan_ends == b.wan_ends


def test_wan_ends_share_a_30():
    spec = load_topology("three_dc")
    plan = AddressPlan(spec, PREFIX)
    for j, link in enumerate(spec.links):
        net = ipaddress.IPv4Network((int(spec.wan_pool.network_address) + 4 * j, 30))
        a_end, b_end = plan.wan_ends[(link.a, link.b)], plan.wan_ends[(link.b, link.a)]
        assert a_end.ip == ipaddress.IPv4Interface(f"{net.network_address + 1}/30")
        assert b_end.ip == ipaddress.IPv4Interface(f"{net.network_address + 2}/30")
        assert a_end.peer_ip == b_end.ip.ip and b_end.peer_ip == a_end.ip.ip
        assert (a_end.ifname, b_end.ifname) == (f"w-{link.b}", f"w-{link.a}")
        assert a_end.link is link and b_end.link is link


def test_namespaces_carry_the_prefix_and_are_unique():
    spec = load_topology("four_dc_mesh")
    plan = AddressPlan(spec, PREFIX)
    names = plan.namespaces
    assert len(names) == len(spec.dcs) + spec.host_count
    assert len(set(names)) == len(names)
    assert all(n.startswith(PREFIX + "-") for n in names)
    assert names[: len(spec.dcs)] == [f"{PREFIX}-{dc.name}-r" for dc in spec.dcs]  # routers first
    assert plan.hosts["eu-h1"].netns == f"{PREFIX}-eu-h1"


def test_custom_addressing():
    spec = parse_topology(
        {
            "dcs": [{"name": "a", "hosts": 2}, {"name": "b", "hosts": 2}],
            "links": [{"between": ["a", "b"], "rate": "1mbit", "delay": "1ms"}],
            "addressing": {"dc_pool": "192.168.0.0/24", "dc_prefix_len": 26, "wan_pool": "172.16.0.0/29"},
        }
    )
    plan = AddressPlan(spec, PREFIX)
    assert str(plan.routers["b"].subnet) == "192.168.0.64/26"  # second /26: 64 addresses on
    assert str(plan.hosts["b-h1"].ip) == "192.168.0.67"  # .64 + 2 + 1
    assert str(plan.wan_ends[("a", "b")].ip) == "172.16.0.1/30"


def test_full_dc_ends_below_broadcast():
    spec = parse_topology({"dcs": [{"name": "a", "hosts": 253}]})
    hosts = AddressPlan(spec, PREFIX).hosts_of("a")
    last = hosts[-1].ip
    assert last == hosts[-1].subnet.broadcast_address - 1
    assert len({h.ip for h in hosts}) == 253


def test_new_run_prefix_format():
    prefixes = {new_run_prefix() for _ in range(20)}
    assert all(re.fullmatch(r"tb[0-9a-f]{4}", p) for p in prefixes)
    assert len(prefixes) > 1  # random: 20 draws from 65536 are not all equal
