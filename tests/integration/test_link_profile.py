"""A link's profile replayed live while ``testbed topo up`` holds the topology
(``net/profile_player.py``): each step applied at its time (within 10 ms) and logged, the rate read
back from the kernel's classes, the outage and the delay seen by packets crossing the link (ping
every 20 ms), and nothing left behind."""

from __future__ import annotations

import json
import signal
import subprocess
import time

from testbed.net.link_control import LinkEnd, link_rate_bps
from testbed.net.profile_check import ping_replies
from tests.integration.conftest import machine_state, registered_prefixes, run_cli, start_topo_up

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
    seen = ping_replies(replies, steps[0]["due_ns"])
    assert seen, replies
    assert all(18 <= rtt < 30 for t, rtt in seen if t < 1.9), seen  # 2 x 10 ms
    assert not [t for t, _ in seen if 2.0 <= t < 2.99], seen  # down: nothing crosses
    late = [rtt for t, rtt in seen if t >= 3.1]
    assert late and all(58 <= rtt < 75 for rtt in late), seen  # 2 x 30 ms


FAILOVER = """name: failing_over
dcs:
  - {name: east, hosts: 1}
  - {name: central, hosts: 1}
  - {name: west, hosts: 1}
links:
  - {between: [east, central], rate: 100mbit, delay: 10ms}
  - between: [central, west]
    rate: 100mbit
    delay: 25ms
    failover: true
    failover_after: 200ms
    profile: {generator: on_off, up: 1s, down: 1.5s}
  - {between: [east, west], rate: 50mbit, delay: 30ms}
"""


def test_a_failover_link_moves_its_routes_to_the_other_path_and_back(tmp_path):
    """central:west goes down 1 s after the build and back 1.5 s later (on_off); its routes move
    through east 200 ms after each change (the RTT from central to west goes from 2 x 25 ms to
    2 x (10 + 30) ms and back), each move logged."""
    others = registered_prefixes()
    before = machine_state(others)
    (tmp_path / "failing_over.yaml").write_text(FAILOVER)
    out = tmp_path / "run"
    proc = start_topo_up(out, topology=str(tmp_path / "failing_over.yaml"))
    try:
        topo = json.loads((out / "topology.json").read_text())
        central, west = topo["hosts"]["central-h0"], topo["hosts"]["west-h0"]
        replies = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                central["netns"],
                "ping",
                "-D",
                "-n",
                "-i",
                "0.02",
                "-W",
                "1",
                "-w",
                "4",
                west["ip"],
            ],
            capture_output=True,
            text=True,
        ).stdout
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    assert machine_state(others) == before
    log = [json.loads(x) for x in (out / "shaping.jsonl").read_text().splitlines()]
    t0 = next(r for r in log if r["event"] == "profile_step")["due_ns"]
    down = next(r for r in log if r["event"] == "link_down")
    up = next(r for r in log if r["event"] == "link_up")
    moves = [r for r in log if r["event"] == "reroute"][:2]  # (it goes down again at 3.5 s)
    assert [m["down"] for m in moves] == [["central:west"], []]
    assert {(m["router"], m["to"], m["via"]) for m in moves[0]["moved"]} == {
        ("central", "west", "east"),
        ("west", "central", "east"),
    }
    assert 200e6 <= moves[0]["t_ns"] - down["t_ns"] < 230e6, moves[0]["t_ns"] - down["t_ns"]
    assert 200e6 <= moves[1]["t_ns"] - (up["t_ns"] + up["duration_ns"]) < 230e6
    seen = ping_replies(replies, t0)
    assert all(48 <= rtt < 60 for t, rtt in seen if t < 0.95), seen
    rerouted = [rtt for t, rtt in seen if 1.3 <= t < 2.4]
    assert rerouted and all(78 <= rtt < 95 for rtt in rerouted), seen  # through east
    assert all(48 <= rtt < 60 for t, rtt in seen if 2.85 <= t < 3.3), seen  # back


ALTERNATING = """name: alternating
dcs:
  - {name: east, hosts: 1}
  - {name: west, hosts: 1}
links:
  - {between: [east, west], rate: 100mbit, delay: 20ms, profile: {file: alt.csv, loop: true, period: 2s}}
"""


def test_topo_check_profile_holds_the_100_ms_goodput_bound_across_changes(tmp_path):
    """The link alternates between 100 Mbit/s with 20 ms and 20 Mbit/s with 35 ms every second:
    no 100 ms interval delivers more than the profile let through (moved back by the one-way delay)
    plus 5%, each drop shows in the counters within 10 ms of when it was due (give or take its samples'
    read times), and each phase's
    least RTT is twice its delay (``net/profile_check.py``)."""
    (tmp_path / "alternating.yaml").write_text(ALTERNATING)
    (tmp_path / "alt.csv").write_text("time,rate,delay\n0s,100mbit,20ms\n1s,20mbit,35ms\n")
    proc = run_cli(
        "topo",
        "check",
        str(tmp_path / "alternating.yaml"),
        "--profile",
        "--duration",
        "4",
        "--json",
        "--out",
        str(tmp_path / "run"),
    )
    report = json.loads(proc.stdout)
    # on failure, what was judged, not the samples, which filled the message (a fresh clone's showed
    # only them); every sample stays in the run's profile_check.json
    judged = [{k: v for k, v in x.items() if k not in ("samples", "pings")} for x in report.get("links", [])]
    assert proc.returncode == 0 and report["ok"], json.dumps(judged, indent=1) + proc.stderr[-2000:]
    [link] = report["links"]
    assert link["intervals"] >= 35 and link["worst_excess"] <= 0.05
    # within 10 ms, give or take what the samples' read times allow (a CI run's +11.9 ms had no
    # uncertainty beside it: its reads were not timed into the lag then)
    lags = link["lags"]
    assert len(lags) >= 2 and all(abs(x["lag_s"]) - x["lag_uncertainty_s"] < 0.010 for x in lags), lags
    assert all(x["lag_uncertainty_s"] < 0.005 for x in lags), lags  # reads of 0.2-0.6 ms, retried above 1 ms
    assert all(x["applied_s"] is not None for x in lags), lags  # the shaper's own record beside each
    assert {round(p["expected_ms"]) for p in link["rtts"]} == {40, 70} and all(p["ok"] for p in link["rtts"])
