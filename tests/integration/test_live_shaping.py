"""Live changes of HTB classes: in place, effective while traffic flows, logged with their time."""

from __future__ import annotations

import json
import statistics
import threading
import time

import pytest

from testbed.net.fidelity import rate_within
from testbed.net.iperf import iperf
from testbed.run.backends import make_network
from testbed.spec.topology_file import load_topology
from testbed.spec.wire import TCP_GOODPUT_FRACTION

from .conftest import goodput_within


def test_link_rate_change_takes_effect_mid_transfer(tmp_path, clean_machine):
    with make_network(load_topology("two_dc"), out_dir=tmp_path) as net:
        old_rate, new_rate = 100_000_000, 30_000_000

        def measure() -> tuple[float, float]:
            """One 11 s transfer with the class's rate changed 4.5 s in: the receiver's per-second
            goodput, steady at the shaped rate apart from a TCP event now and then (bbr, the default
            here, drains to 4 packets for an RTT every 10 s, its ProbeRTT): the median of 3 whole
            seconds before the change and of 4 after it."""
            net.shaping.set_wan_class_rate("east", "west", 0x10, old_rate)

            def change_later():
                time.sleep(4.5)
                changed["t_ns"] = net.shaping.set_wan_class_rate("east", "west", 0x10, new_rate)

            t = threading.Thread(target=change_later)
            t.start()
            result = iperf(net, "east-h0", "west-h0", duration_s=11, omit_s=0).interval_bps
            t.join()
            return statistics.median(result[1:4]), statistics.median(result[6:10])

        def within(pair: tuple[float, float]) -> bool:
            return rate_within(pair[0], old_rate * TCP_GOODPUT_FRACTION) and rate_within(
                pair[1], new_rate * TCP_GOODPUT_FRACTION
            )

        # a failing rate measurement is taken again once, as in the fidelity settings (a second
        # now and then dips by about 10% on this 2-core machine: 89.9 of 95.6 Mbit/s seen once)
        changed: dict[str, int] = {}
        taken = [measure()]
        if not within(taken[-1]):
            taken.append(measure())
        assert within(taken[-1]), taken
        assert net.shaping.wan_classes("east", "west")[0x10]["rate_bps"] == new_rate
        log = [json.loads(line) for line in (tmp_path / "shaping.jsonl").read_text().splitlines()]
        change = [e for e in log if e["event"] == "change"]
        assert change and change[-1]["t_ns"] == changed["t_ns"] and change[-1]["rate_bps"] == new_rate


@pytest.mark.parametrize("backend", ["netns", "mininet"])
def test_per_host_classes_with_filters(backend, tmp_path, clean_machine):
    """Classes added and changed live, on the netns backend's interfaces and on Mininet's."""
    with make_network(load_topology("two_dc"), backend, out_dir=tmp_path) as net:
        net.shaping.add_wan_class("east", "west", 0x11, 10_000_000, pairs=[("east-h1", "west-h1")])
        assert net.shaping.wan_classes("east", "west")[0x11]["rate_bps"] == 10_000_000

        def goodput(src: str, dst: str, rate_bps: float, duration_s: float = 3, omit_s: float = 1) -> list[float]:
            measure = lambda: iperf(net, src, dst, duration_s, omit_s).bits_per_second  # noqa: E731
            return goodput_within(measure, rate_bps * TCP_GOODPUT_FRACTION)

        slow = goodput("east-h1", "west-h1", 10e6)
        # 100 Mbit/s over 5 s after 2 s: over 2 s after 1 s it measured 86-88% twice in a row under
        # Mininet on 2026-12-03 (a second in a few dips by about 10% on this 2-core machine, as in the
        # fidelity settings), where 10 and 40 Mbit/s hold
        fast = goodput("east-h0", "west-h0", 100e6, duration_s=5, omit_s=2)
        assert rate_within(slow[-1], 10e6 * TCP_GOODPUT_FRACTION), slow
        assert rate_within(fast[-1], 100e6 * TCP_GOODPUT_FRACTION), fast
        net.shaping.set_wan_class_rate("east", "west", 0x11, 40_000_000)
        faster = goodput("east-h1", "west-h1", 40e6)
        assert rate_within(faster[-1], 40e6 * TCP_GOODPUT_FRACTION), faster


def test_controller_grants_switch_two_flows(tmp_path, clean_machine):
    """Two pipelines' flows on one link: after each grant the holder gets the link minus the other's
    floor, measured over the one-second interval that starts 1 s after the change."""
    from testbed.atlas.controller import Controller
    from testbed.atlas.grants import CLASS_BASE, Hop, floor_bps
    from testbed.plan.placement import WorkerSpec

    with make_network(load_topology("two_dc"), out_dir=tmp_path) as net:
        workers = [
            WorkerSpec(0, 0, 0, "east-h0", "east"),
            WorkerSpec(1, 0, 1, "east-h1", "east"),
            WorkerSpec(2, 1, 0, "west-h0", "west"),
            WorkerSpec(3, 1, 1, "west-h1", "west"),
        ]
        ctl = Controller(net, workers, 2, tmp_path / "c.sock", tmp_path / "c.jsonl")
        ctl.install()
        hop = Hop("east", "west")
        ctl.grant(hop, 0)
        rate = 100_000_000
        full, floor = rate - floor_bps(rate), floor_bps(rate)
        results = {}

        def flow(src, dst, port):
            srv = net.popen(dst, ["iperf3", "-s", "-1", "-p", str(port)])
            time.sleep(0.5)
            out = net.run(src, ["iperf3", "-c", str(net.host(dst).ip), "-p", str(port), "-t", "9", "-J"], timeout_s=40)
            srv.wait(timeout=5)
            results[src] = [iv["sum"]["bits_per_second"] for iv in json.loads(out.stdout)["intervals"]]

        threads = [
            threading.Thread(target=flow, args=("east-h0", "west-h0", 5301)),
            threading.Thread(target=flow, args=("east-h1", "west-h1", 5302)),
        ]
        for t in threads:
            t.start()
        time.sleep(4.6)  # replica 0 holds the link for the first ~4 s
        ctl.grant(hop, 1)
        for t in threads:
            t.join()
        g = TCP_GOODPUT_FRACTION
        assert rate_within(statistics.mean(results["east-h0"][1:3]), full * g), results
        assert rate_within(statistics.mean(results["east-h1"][6:8]), full * g), results
        assert statistics.mean(results["east-h1"][1:3]) < 2 * floor  # held back while not granted
        classes = net.shaping.wan_classes("east", "west")
        assert classes[CLASS_BASE + 1]["rate_bps"] == full and classes[CLASS_BASE]["rate_bps"] == floor


def test_the_controller_process_grants_from_workers_messages(tmp_path, clean_machine):
    """The real controller process, fed by the workers' control datagrams: a transfer ready on both
    sides gets the link (read back from the kernel), its done hands the link to the one waiting."""
    from testbed.atlas.channel import ControlClient
    from testbed.atlas.controller import Controller
    from testbed.atlas.grants import CLASS_BASE, floor_bps
    from testbed.plan.placement import WorkerSpec

    with make_network(load_topology("two_dc"), out_dir=tmp_path) as net:
        workers = [
            WorkerSpec(0, 0, 0, "east-h0", "east"),
            WorkerSpec(1, 0, 1, "east-h1", "east"),
            WorkerSpec(2, 1, 0, "west-h0", "west"),
            WorkerSpec(3, 1, 1, "west-h1", "west"),
        ]
        ctl = Controller(net, workers, 2, tmp_path / "c.sock", tmp_path / "controller.jsonl")
        ctl.install()
        ctl.start()
        client = ControlClient(str(ctl.sock_path))
        rate = 100_000_000
        full, floor = rate - floor_bps(rate), floor_bps(rate)

        def rates_become(want: dict[int, int]) -> dict[int, dict]:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                classes = net.shaping.wan_classes("east", "west")
                if all(classes[CLASS_BASE + r]["rate_bps"] == v for r, v in want.items()):
                    return classes
                time.sleep(0.02)
            raise AssertionError(f"classes never became {want}: {classes}")

        client.send("ready", 0, 2, 0, 0)
        client.send("recv", 0, 2, 0, 0)
        rates_become({0: full, 1: floor})
        client.send("ready", 1, 3, 0, 0)
        client.send("recv", 1, 3, 0, 0)
        client.send("done", 0, 2, 0, 0)
        rates_become({0: floor, 1: full})
        assert net.shaping.wan_classes("west", "east")[CLASS_BASE]["rate_bps"] == rate  # the other way: open
        ctl.stop()
        assert ctl.proc.returncode == 0 and ctl.poll_failure() is None
    *log, end = [json.loads(line) for line in (tmp_path / "controller.jsonl").read_text().splitlines()]
    assert [(r["event"], r["replica"]) for r in log] == [("grant", 0), ("release", 0), ("grant", 1)]
    assert log[1]["handover"] is True and all(r["link"] == "east->west" for r in log)
    # the loop's counts at its end: no deadline passed, no report lost or repeated
    assert end["event"] == "loop_end" and (end["deadline_releases"], end["expired"], end["repeated"]) == (0, 0, 0)


def test_a_link_rate_change_is_one_batch_per_router(tmp_path, clean_machine):
    """set_link_rate changes the link and default classes of both directions at one logged moment,
    as read back from both routers' kernels."""
    with make_network(load_topology("two_dc"), out_dir=tmp_path) as net:
        net.shaping.set_link_rate("east", "west", 10_000_000)
        for src, dst in (("east", "west"), ("west", "east")):
            classes = net.shaping.wan_classes(src, dst)
            assert {m: c["ceil_bps"] for m, c in classes.items()} == {1: 10_000_000, 0x10: 10_000_000}
        log = [json.loads(line) for line in (tmp_path / "shaping.jsonl").read_text().splitlines()]
        changes = [e for e in log if e["event"] == "change"]
        assert len(changes) == 4 and len({e["t_ns"] for e in changes}) == 1
        assert {e["netns"] for e in changes} == {net.plan.routers["east"].netns, net.plan.routers["west"].netns}
