"""A link's profile replayed live while ``testbed topo up`` holds the topology
(``net/profile_player.py``): each step applied at its time (within 10 ms) and logged, the rate read
back from the kernel's classes, the outage and the delay seen by packets crossing the link (ping
every 20 ms), and nothing left behind."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time

from testbed.net.link_control import LinkEnd, link_rate_bps
from tests.integration.conftest import machine_state, registered_prefixes, start_topo_up

TOPOLOGY = """name: profiled
dcs:
  - {name: east, hosts: 1}
  - {name: west, hosts: 1}
links:
  - {between: [east, west], rate: 50mbit, delay: 10ms, profile: steps.csv}
"""
# times from the end of the build (the profile's 0)
STEPS = "time,rate,delay\n1s,20mbit,\n2s,down,\n3s,up,30ms\n"


def test_a_profile_is_applied_on_time_and_seen_by_packets(tmp_path):
    others = registered_prefixes()
    before = machine_state(others)
    (tmp_path / "profiled.yaml").write_text(TOPOLOGY)
    (tmp_path / "steps.csv").write_text(STEPS)
    out = tmp_path / "run"
    proc = start_topo_up(out, topology=str(tmp_path / "profiled.yaml"))
    try:
        topo = json.loads((out / "topology.json").read_text())
        east, west = topo["hosts"]["east-h0"], topo["hosts"]["west-h0"]
        router = f"{topo['prefix']}-east-r"
        ping = subprocess.Popen(
            ["ip", "netns", "exec", east["netns"], "ping", "-D", "-n", "-i", "0.02", "-W", "1", "-w", "4", west["ip"]],
            stdout=subprocess.PIPE,
            text=True,
        )
        rates = []
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            rates.append(link_rate_bps(LinkEnd(router, "w-west")))
            time.sleep(0.1)
        replies, _ = ping.communicate(timeout=10)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    assert machine_state(others) == before
    log = [json.loads(x) for x in (out / "shaping.jsonl").read_text().splitlines()]
    steps = [r for r in log if r["event"] == "profile_step"]
    assert [s["profile_t_us"] for s in steps] == [0, 1_000_000, 2_000_000, 3_000_000]
    for s in steps:  # started on time, and done within 10 ms of it
        assert 0 <= s["t_ns"] - s["due_ns"] < 10_000_000, s
        assert s["t_ns"] + s["duration_ns"] - s["due_ns"] < 10_000_000, s
    assert [r["event"] for r in log if r["event"].startswith("link_")] == ["link_down", "link_up"]
    assert 50_000_000 in rates and 20_000_000 in rates, rates  # read back from the kernel
    # what the packets saw, on the profile's clock (ping -D: CLOCK_REALTIME; the log: monotonic)
    t0 = steps[0]["due_ns"]
    offset = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.monotonic_ns()
    seen = []
    for line in replies.splitlines():
        m = re.match(r"\[(\d+\.\d+)\].*time=([\d.]+) ms", line)
        if m:
            sent = float(m.group(1)) * 1e9 - float(m.group(2)) * 1e6 - offset  # monotonic send time
            seen.append(((sent - t0) / 1e9, float(m.group(2))))
    assert seen, replies
    assert all(18 <= rtt < 30 for t, rtt in seen if t < 1.9), seen  # 2 x 10 ms
    assert not [t for t, _ in seen if 2.0 <= t < 2.99], seen  # down: nothing crosses
    late = [rtt for t, rtt in seen if t >= 3.1]
    assert late and all(58 <= rtt < 75 for rtt in late), seen  # 2 x 30 ms
