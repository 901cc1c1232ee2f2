"""WAN link changes on command (``testbed link``, ``net/link_control.py``) while ``testbed topo up``
holds two_dc: the link listed, brought down (nothing crosses either way, the routes and the shaping
untouched), brought back (also through iptables-restore started ahead, as a profile's replay
does), given another rate (read back from the kernel's classes at both ends)
and its own again, each change logged; the topology torn down leaves nothing. That a class
change in place holds traffic to the new rate is measured in ``test_live_shaping.py``."""

from __future__ import annotations

import json
import signal
import subprocess

from pyroute2 import IPRoute

from testbed.net.link_control import close_restores, is_down, link_ends, prepare_restores, set_link
from testbed.net.netlink_tc import read_classes
from testbed.spec.topology_file import load_topology
from tests.integration.conftest import machine_state, registered_prefixes, run_cli, start_topo_up


def _ping(netns: str, ip: str) -> bool:
    return (
        subprocess.run(["ip", "netns", "exec", netns, "ping", "-c", "1", "-W", "1", ip], capture_output=True).returncode
        == 0
    )


def test_a_link_goes_down_and_comes_back_on_command(tmp_path):
    others = registered_prefixes()
    before = machine_state(others)
    assert "no topology is up" in run_cli("link", "list").stderr
    proc = start_topo_up(tmp_path)
    try:
        topo = json.loads((tmp_path / "topology.json").read_text())
        east, west = topo["hosts"]["east-h0"], topo["hosts"]["west-h0"]
        routes = subprocess.run(["ip", "-n", east["netns"], "route"], capture_output=True, text=True).stdout
        listed = run_cli("link", "list")
        assert listed.returncode == 0 and listed.stdout.startswith("east:west up 100 Mbit/s 20 ms"), listed.stdout
        assert _ping(east["netns"], west["ip"])
        down = run_cli("link", "down", "west:east")  # either order names the link
        assert down.returncode == 0 and down.stdout.strip() == "east:west down", down.stderr
        assert not _ping(east["netns"], west["ip"]) and not _ping(west["netns"], east["ip"])
        assert run_cli("link", "list").stdout.startswith("east:west down")
        assert run_cli("link", "down", "east:west").stdout.strip() == "east:west was already down"
        assert subprocess.run(["ip", "-n", east["netns"], "route"], capture_output=True, text=True).stdout == routes
        up = run_cli("link", "up", "east:west")
        assert up.returncode == 0 and up.stdout.strip() == "east:west up"
        assert _ping(east["netns"], west["ip"]) and _ping(west["netns"], east["ip"])
        # iptables-restore started ahead, as a profile's replay starts it (net/profile_player.py):
        # the change takes it, and applies its rules; one not taken applies nothing when closed
        ends = link_ends(load_topology("two_dc"), topo["prefix"])["east:west"]
        prepared, spare = prepare_restores(ends), prepare_restores(ends)
        assert set_link(ends, "east:west", True, None, known_up=True, prepared=prepared) and not prepared
        assert is_down(ends) and not _ping(east["netns"], west["ip"])
        close_restores(spare)
        assert not spare and is_down(ends)
        assert set_link(ends, "east:west", False, None, known_up=False)
        assert not is_down(ends) and _ping(east["netns"], west["ip"])
        rate = run_cli("link", "rate", "west:east", "30mbit")
        assert rate.returncode == 0 and rate.stdout.strip() == "east:west 30 Mbit/s both ways", rate.stderr
        for end in ("east", "west"):
            router = f"{topo['prefix']}-{end}-r"
            iface = "w-west" if end == "east" else "w-east"
            with IPRoute(netns=router) as ipr:
                classes = read_classes(ipr, ipr.link_lookup(ifname=iface)[0])
            assert classes[0x1]["rate_bps"] == classes[0x10]["rate_bps"] == 30_000_000
        assert "east:west up 30 Mbit/s (topology: 100 Mbit/s)" in run_cli("link", "list").stdout
        assert run_cli("link", "rate", "east:west", "100mbit").returncode == 0
        assert run_cli("link", "rate", "east:west", "1kbit").returncode == 1
        unknown = run_cli("link", "down", "east:north")
        assert unknown.returncode == 1 and "its links are east:west" in unknown.stderr
        log = [json.loads(x) for x in (tmp_path / "shaping.jsonl").read_text().splitlines()]
        changes = [(r["event"], r["link"], r.get("rate_bps")) for r in log if r["event"].startswith("link_")]
        assert changes == [
            ("link_down", "east:west", None),
            ("link_up", "east:west", None),
            ("link_rate", "east:west", 30_000_000),  # what a run's controllers follow (run/link_replan.py)
            ("link_rate", "east:west", 100_000_000),
        ]
        rates = [(r["netns"], r["classid"], r["rate_bps"]) for r in log if r["event"] == "change"]
        assert len(rates) == 8 and {r for _, _, r in rates} == {30_000_000, 100_000_000}
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    assert machine_state(others) == before
