"""Building a topology: the kernel state read back matches the plan, and teardown removes it all."""

from __future__ import annotations

import os
import subprocess

from testbed.net.hostproc import netns_argv
from testbed.net.netlink_tc import read_qdiscs
from testbed.run.backends import make_network
from testbed.spec.topology_file import load_topology


def _ns(netns: str, *argv: str) -> str:
    return subprocess.run(netns_argv(netns, argv), capture_output=True, text=True, check=True).stdout


def test_two_dc_kernel_state_matches_plan(tmp_path, clean_machine):
    spec = load_topology("two_dc")
    with make_network(spec, out_dir=tmp_path) as net:
        assert sorted(net.plan.namespaces) == sorted(n for n in os.listdir("/run/netns") if n.startswith(net.prefix))
        east_r, west_r = net.plan.routers["east"], net.plan.routers["west"]
        assert f"inet {east_r.ip}/24" in _ns(east_r.netns, "ip", "-o", "addr", "show", "br0")
        # hosts: address, default route through their DC's router
        h = net.host("east-h1")
        assert f"inet {h.ip}/24" in _ns(h.netns, "ip", "-o", "addr", "show", "eth0")
        assert f"default via {h.gateway}" in _ns(h.netns, "ip", "route")
        # routers: the other DC's subnet through the WAN peer
        end = net.plan.wan_ends[("east", "west")]
        assert f"{west_r.subnet} via {end.peer_ip} dev w-west" in _ns(east_r.netns, "ip", "route")
        # ... and knows the peer's address without ARP across the delayed link
        far = net.plan.wan_ends[("west", "east")]
        peer_mac = _ns(west_r.netns, "ip", "-o", "link", "show", far.ifname).split("link/ether ")[1].split()[0]
        assert f"{end.peer_ip} lladdr {peer_mac} PERMANENT" in _ns(east_r.netns, "ip", "neigh", "show", "dev", "w-west")
        # shaping: HTB with the link rate on each end's egress
        counters = net.wan_counters()  # what the link sampler reads while training
        for src, dst in (("east", "west"), ("west", "east")):
            classes = net.shaping.wan_classes(src, dst)
            assert classes[0x1]["rate_bps"] == classes[0x10]["rate_bps"] == spec.links[0].rate_bps
            # the sampler's plain-socket read against pyroute2's, taken after it: the same classes,
            # rates and ceilings, and no counter ahead of the later read
            assert counters[(src, dst)].keys() == classes.keys()
            for minor, c in counters[(src, dst)].items():
                assert (c["rate_bps"], c["ceil_bps"]) == (classes[minor]["rate_bps"], classes[minor]["ceil_bps"])
                for key in ("tx_bytes", "tx_packets", "drops", "overlimits"):
                    assert c[key] <= classes[minor][key], (minor, key)
        leaf = "netem" if net.mechanism == "netem" else "pfifo"
        assert read_qdiscs(net.handles.ipr(east_r.netns), "w-west") == ["htb", leaf]
        if net.mechanism == "nfqueue":
            rules = _ns(west_r.netns, "iptables-save", "-t", "raw")
            assert "-A PREROUTING -i w-east -j NFQUEUE --queue-num 0" in rules
            assert "bypass" not in rules
            for el in net.delay.elements:  # each delay element runs inside its own namespace
                assert os.stat(f"/proc/{el.proc.pid}/ns/net").st_ino == os.stat(f"/run/netns/{el.netns}").st_ino
        # every host reaches every other host
        for a in net.hosts:
            for b in net.hosts.values():
                if a != b.name:
                    assert net.run(a, ["ping", "-c", "1", "-W", "2", str(b.ip)]).returncode == 0, (a, b.name)
    assert not [n for n in os.listdir("/run/netns") if n.startswith(net.prefix)]


def test_two_runs_coexist(tmp_path, clean_machine):
    spec = load_topology("two_dc")
    with make_network(spec, out_dir=tmp_path / "a") as first:
        with make_network(spec, out_dir=tmp_path / "b") as second:
            assert first.prefix != second.prefix
            assert second.run("east-h0", ["ping", "-c", "1", "-W", "2", str(second.host("west-h0").ip)]).returncode == 0
        # tearing the second down left the first intact
        assert first.run("east-h0", ["ping", "-c", "1", "-W", "2", str(first.host("west-h0").ip)]).returncode == 0
        assert all(os.path.exists(f"/run/netns/{n}") for n in first.plan.namespaces)


def test_four_dc_by_eight_hosts_builds(tmp_path, clean_machine):
    from testbed.spec.topology_file import parse_topology

    dcs = [{"name": f"dc{i}", "hosts": 8} for i in range(4)]
    links = [
        {"between": [f"dc{i}", f"dc{j}"], "rate": "100mbit", "delay": f"{5 * (i + j + 1)}ms"}
        for i in range(4)
        for j in range(i + 1, 4)
    ]
    spec = parse_topology({"dcs": dcs, "links": links}, "4x8")
    with make_network(spec, out_dir=tmp_path) as net:
        assert len(net.hosts) == 32
        last = net.host("dc3-h7")
        assert net.run("dc0-h0", ["ping", "-c", "1", "-W", "2", str(last.ip)]).returncode == 0
