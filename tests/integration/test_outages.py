"""WAN link outages on command (``testbed link``, ``net/outages.py``) while ``testbed topo up``
holds two_dc: the link listed, brought down (nothing crosses either way, the routes and the shaping
untouched), brought back, each change logged; the topology torn down leaves nothing."""

from __future__ import annotations

import json
import signal
import subprocess

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
        unknown = run_cli("link", "down", "east:north")
        assert unknown.returncode == 1 and "its links are east:west" in unknown.stderr
        log = [json.loads(x) for x in (tmp_path / "shaping.jsonl").read_text().splitlines()]
        changes = [(r["event"], r["link"]) for r in log if r["event"].startswith("link_")]
        assert changes == [("link_down", "east:west"), ("link_up", "east:west")]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    assert machine_state(others) == before
