"""The netem path, on a stock kernel that has sch_netem as a module (inside the VM test box).

Rates: the box may run under software emulation (TCG), where the emulated CPU, not the shaping,
limits what a link carries. The first test measures what the box carries through netem
(``testbed doctor``'s capacity probe); every shipped topology is then run with its links at
``link_rate_bps``: the shipped rate, lowered where needed to a tenth of that capacity (TCP,
ping, the iperf3 server and the kernel's own packet work share the emulated CPU).

Tolerances: the fidelity check's own (rate within 5%, RTT within max(1 ms, 5%)), with the box's
own round trip added to the RTT's: under TCG a packet's trip through four namespaces costs about
a millisecond of emulated CPU that a real machine does not spend, and netem's timers fire late on
the emulated clock (about 2 ms a round trip on a 10 ms link, seen on 2026-12-03). ``path_floor_ms``
measures both, on a path with a ``FLOOR_DELAY_MS`` delay: its round trip less the one configured. The rates,
the floor and why go to ``/job/rates.txt`` and to the test output.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from testbed.net.capacity_probe import machine_capacity_bps
from testbed.net.fidelity import (
    RTT_TOLERANCE_FRACTION,
    RTT_TOLERANCE_MS,
    check_direction,
    jitter_rtt_sd_ms,
    loss_within,
    measure_rtt_ms,
    parse_ping_ms,
    rtt_within,
)
from testbed.net.netlink_tc import TC_H_ROOT, read_netem, read_qdiscs
from testbed.net.shaping import DEFAULT_CLASS_MINOR, ROOT_HANDLE
from testbed.run.backends import make_network
from testbed.spec.topology import TopologySpec
from testbed.spec.topology_file import parse_topology
from testbed.spec.wire import bdp_packets
from tests.integration.conftest import REPO, run_cli

JOB = Path("/job")
#: a second of warm-up is past slow start on these links (about 0.3 s to fill 50 Mbit/s x 60 ms)
MEASURE = {"duration_s": 5, "omit_s": 1, "rtt_samples": 20}


def _nice_floor(bps: float) -> int:
    """The largest 1, 2 or 5 x 10^k bit/s not above ``bps``."""
    k = 10 ** (len(str(int(bps))) - 1)
    return max(m * k for m in (1, 2, 5) if m * k <= bps)


@pytest.fixture(scope="session")
def link_rate_bps() -> int:
    capacity, _ = machine_capacity_bps("netem")
    rate = min(100_000_000, _nice_floor(capacity / 10))
    why = (
        f"the box carries {capacity / 1e6:.0f} Mbit/s through netem (testbed's capacity probe); "
        f"links run at min(shipped rate, {rate / 1e6:g} Mbit/s), at most a tenth of it, so that the "
        "emulated CPU keeps up with TCP, ping and iperf3 at once"
    )
    print(why)
    if JOB.is_dir():
        (JOB / "rates.txt").write_text(json.dumps({"capacity_bps": capacity, "link_rate_bps": rate, "why": why}))
    return rate


#: the one-way delay of the link the box's own round trip is measured on (ms): the shortest of the
#: topologies measured here (three_dc's east-central), since netem's lateness on the emulated clock
#: grows with the delay (1.1-1.3 ms a round trip on a 1 ms link, 2.2-3.0 ms on 10 ms links, on
#: 2026-12-03), and longer links get the 5% tolerance besides. A floor measured through netem
#: would also hide a constant error in the delay the testbed sets; the qdisc tree test reads every
#: netem qdisc's configured delay back against the plan, so such an error fails there
FLOOR_DELAY_MS = 10.0


@pytest.fixture(scope="session")
def path_floor_ms(link_rate_bps, tmp_path_factory) -> tuple[float, float]:
    """(median, max) of what 40 ``ping -U`` round trips in the box take across a WAN link beyond
    its configured round trip (a ``FLOOR_DELAY_MS`` delay each way, through netem), never below 0."""
    spec = parse_topology(
        {
            "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
            "links": [{"between": ["a", "b"], "rate": f"{link_rate_bps}bit", "delay": f"{FLOOR_DELAY_MS:g}ms"}],
        },
        "floor",
    )
    with make_network(spec, out_dir=tmp_path_factory.mktemp("floor"), delay_mechanism="netem") as net:
        out = net.run("a-h0", ["ping", "-U", "-n", "-i", "0.05", "-c", "40", str(net.host("b-h0").ip)]).stdout
    times = [max(0.0, t - 2 * FLOOR_DELAY_MS) for t in parse_ping_ms(out)]
    floor = (statistics.median(times), max(times))
    print(
        f"the box's own round trip across a WAN link beyond its {2 * FLOOR_DELAY_MS:g} ms: "
        f"median {floor[0]:.2f} ms, max {floor[1]:.2f} ms"
    )
    if JOB.is_dir():
        rates = json.loads((JOB / "rates.txt").read_text()) if (JOB / "rates.txt").exists() else {}
        rates.update(floor_median_ms=floor[0], floor_max_ms=floor[1])
        (JOB / "rates.txt").write_text(json.dumps(rates))
    return floor


def shipped(name: str, rate_bps: int, **link_extra: str) -> TopologySpec:
    """A shipped topology with its link rates capped at ``rate_bps`` (and ``link_extra`` added)."""
    data = yaml.safe_load((REPO / "topologies" / f"{name}.yaml").read_text())
    for link in data["links"]:
        shipped_bps = (
            parse_topology(
                {
                    "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
                    "links": [{**link, "between": ["a", "b"]}],
                }
            )
            .links[0]
            .rate_bps
        )
        link["rate"] = f"{min(shipped_bps, rate_bps)}bit"
        link.update(link_extra)
    return parse_topology(data, f"{name} (rates capped at {rate_bps} bit/s)")


def test_auto_picks_netem_on_a_stock_kernel():
    # the stock kernel has netem as a loadable module, which the testbed's probe loads by using it
    modinfo = subprocess.run(["modinfo", "-n", "sch_netem"], capture_output=True, text=True)
    assert modinfo.returncode == 0 and modinfo.stdout.strip().endswith((".ko", ".ko.xz", ".ko.zst")), modinfo
    proc = run_cli("doctor")
    assert proc.returncode == 0, proc.stderr
    assert "sch_netem: present" in proc.stdout, proc.stdout
    assert "delay mechanism: netem" in proc.stdout, proc.stdout


@pytest.mark.parametrize("mechanism", ["netem", "auto"])
@pytest.mark.parametrize("name", ["two_dc", "three_dc"])
def test_the_qdisc_tree_read_back_is_the_plan(name, mechanism, link_rate_bps, tmp_path, clean_machine):
    spec = shipped(name, link_rate_bps, jitter="1ms", loss="0.5%")
    with make_network(spec, out_dir=tmp_path, delay_mechanism=mechanism) as net:
        assert net.mechanism == "netem"
        for (src, dst), end in net.plan.wan_ends.items():
            ipr = net.handles.ipr(net.plan.routers[src].netns)
            link = end.link
            assert read_qdiscs(ipr, end.ifname) == ["htb", "netem"]
            classes = net.shaping.wan_classes(src, dst)
            assert classes[0x1]["rate_bps"] == classes[DEFAULT_CLASS_MINOR]["rate_bps"] == link.rate_bps
            leaves = read_netem(ipr, end.ifname)
            assert set(leaves) == {ROOT_HANDLE | DEFAULT_CLASS_MINOR}, leaves
            leaf = leaves[ROOT_HANDLE | DEFAULT_CLASS_MINOR]
            # the kernel holds delay and jitter in scheduler ticks (64 per microsecond here): exact
            assert (leaf.delay_us, leaf.jitter_us) == (link.delay_us, link.jitter_us), (src, dst, leaf)
            assert leaf.loss_pct == pytest.approx(link.loss_pct, abs=1e-6)
            # the leaf holds the queue plus every packet in flight over the delay and jitter
            held = bdp_packets(link.rate_bps, link.delay_us + link.jitter_us)
            assert leaf.limit_packets == link.queue_packets + held
        assert TC_H_ROOT not in read_netem(net.handles.ipr(net.host(next(iter(net.hosts))).netns), "eth0")


def test_live_class_changes_with_netem_keep_the_delay(link_rate_bps, path_floor_ms, tmp_path, clean_machine):
    spec = shipped("two_dc", link_rate_bps)
    rtt_expected = 2 * spec.links[0].delay_us / 1000
    with make_network(spec, out_dir=tmp_path, delay_mechanism="netem") as net:
        rate = spec.links[0].rate_bps
        # the first packet over the link is not held back by ARP across the WAN (the routers know
        # their WAN peers): that would add a whole round trip. Its own ARP inside each DC and the
        # emulated CPU may add some ms (49.4 ms against 40 once under TCG), so half a round trip
        # of slack
        first = parse_ping_ms(net.run("east-h0", ["ping", "-U", "-n", "-c", "1", str(net.host("west-h0").ip)]).stdout)
        low = rtt_expected - max(RTT_TOLERANCE_MS, RTT_TOLERANCE_FRACTION * rtt_expected)
        assert first and low <= first[0] < 1.5 * rtt_expected + path_floor_ms[1], first
        net.shaping.add_wan_class("east", "west", 0x21, rate // 2, pairs=[("east-h1", "west-h1")])
        ipr = net.handles.ipr(net.plan.routers["east"].netns)
        end = net.plan.wan_ends[("east", "west")]
        # the new class got the default class's netem leaf: its packets are delayed like the rest
        leaves = read_netem(ipr, end.ifname)
        assert leaves[ROOT_HANDLE | 0x21] == leaves[ROOT_HANDLE | DEFAULT_CLASS_MINOR]
        sent = net.shaping.wan_classes("east", "west")[0x21]["tx_packets"]
        rtt, _ = measure_rtt_ms(net, "east-h1", "west-h1", 10)
        assert net.shaping.wan_classes("east", "west")[0x21]["tx_packets"] >= sent + 10  # through the new class
        assert rtt_within(rtt, rtt_expected, path_floor_ms[0]), rtt
        t = net.shaping.set_wan_class_rate("east", "west", 0x21, rate // 4)
        assert t > 0 and net.shaping.wan_classes("east", "west")[0x21]["rate_bps"] == rate // 4
        net.shaping.set_link_rate("east", "west", rate // 2)
        for src, dst in (("east", "west"), ("west", "east")):
            classes = net.shaping.wan_classes(src, dst)
            assert classes[0x1]["rate_bps"] == classes[DEFAULT_CLASS_MINOR]["rate_bps"] == rate // 2
        # in place: the leaves are the same qdiscs as before, with the same delay
        assert read_netem(ipr, end.ifname) == leaves
        changes = [json.loads(x) for x in (tmp_path / "shaping.jsonl").read_text().splitlines()]
        assert sum(c["event"] == "change" for c in changes) == 5


# three_dc only: each measurement takes minutes under TCG (two_dc's case cost 40 s of the suite);
# the jitter and loss test below measures two_dc through netem. One direction of one of its links:
# east->west, the longest round trip (30 ms one way; its rate capped as ``link_rate_bps`` says),
# whose round trips cross west's netem too. Each further link cost 17 s of the suite under TCG
# (central:west was measured too until 33fad16), its reverse direction 9 s (until 2026-12-07):
# the reverse direction's netem qdisc is the same code, read back against the plan by the qdisc
# tree test
MEASURED = {"three_dc": ("east", "west")}


@pytest.mark.parametrize("name", ["three_dc"])
def test_topo_check_passes_with_netem(name, link_rate_bps, path_floor_ms, tmp_path, clean_machine):
    spec = shipped(name, link_rate_bps)

    with make_network(spec, out_dir=tmp_path, delay_mechanism="auto") as net:
        assert net.mechanism == "netem"
        # the RTT judged with the box's own round trip added to the tolerance. The emulated CPU
        # (TCG) stalls now and then: a direction measured once at half its rate (2 of 4 runs on the
        # development VM, a single direction each time, the rest exact; once at 86% while other
        # work shared the machine's two cores; both of two_dc's at 72-85% twice in a row on
        # 2026-12-03) is measured again, up to three measurements, every one printed; a direction
        # that is wrong usually fails every time
        taken = []
        while not (taken and taken[-1].ok) and len(taken) < 3:
            taken.append(check_direction(net, *MEASURED[name], rtt_floor_ms=path_floor_ms[0], **MEASURE))
        print(json.dumps([r.to_dict() for r in taken], indent=1))
    assert taken[-1].ok, json.dumps(taken[-1].to_dict(), indent=1)


def _ping_train(net, count: int = 400) -> tuple[list[float], str]:
    """``count`` ``ping -U`` round trips from east-h0 to west-h0, 10 ms apart: (times in ms, output)."""
    out = net.run("east-h0", ["ping", "-U", "-n", "-i", "0.01", "-c", str(count), str(net.host("west-h0").ip)])
    return parse_ping_ms(out.stdout), out.stdout


def test_jitter_and_loss_measured_against_the_configuration(link_rate_bps, path_floor_ms, tmp_path, clean_machine):
    spec = shipped("two_dc", link_rate_bps, jitter="4ms", loss="2%")
    rtt_expected = 2 * spec.links[0].delay_us / 1000
    # the same path without jitter or loss, measured the same way just before: the box's own
    # lateness at this moment. Under TCG it drifts: a jittered mean once came 5.4 ms over 2d while
    # the floor, taken minutes earlier on a 10 ms link, was 2.5 ms (2026-12-03)
    with make_network(shipped("two_dc", link_rate_bps), out_dir=tmp_path / "plain", delay_mechanism="netem") as net:
        plain, _ = _ping_train(net)
    # the loss judged on the ping train, by the fidelity check's own rule (``loss_within``): the
    # check's UDP and TCP measurement of it (``check_direction``, as the host tier's
    # test_loss_jitter_and_access_links runs it through the delay element) took 15-45 s under TCG
    with make_network(spec, out_dir=tmp_path, delay_mechanism="netem") as net:
        times, stdout = _ping_train(net)
    # netem's jitter without a distribution table is uniform on [d - j, d + j] in each direction:
    # the RTT is the sum of two, mean 2d, standard deviation 2j / sqrt(6). The mean is judged
    # against the plain path's (what the box adds to 2d then), not against 2d plus a floor
    mean, sd = statistics.fmean(times), statistics.stdev(times)
    plain_mean = statistics.fmean(plain)
    print(f"RTT mean {mean:.2f} ms with 4 ms jitter, {plain_mean:.2f} ms without; configured {rtt_expected:g} ms")
    expected_sd = jitter_rtt_sd_ms(4.0)
    _, floor_max = path_floor_ms
    assert abs(mean - plain_mean) <= 2.0, (mean, plain_mean)
    assert 0.75 * expected_sd <= sd <= 1.25 * expected_sd, (sd, expected_sd)
    # bounded, unlike a normal law of the same sd; the emulated CPU stalls now and then (one round
    # trip of 400 took 55.9 ms on a 40 +- 8 ms path once), so 1% of the samples may stray
    # beyond the jitter, up to what the plain path took then (its 99th percentile) or the floor's max
    late = max(rtt_expected + floor_max, statistics.quantiles(plain, n=100)[98])
    low, high = rtt_expected - 2 * 4.0, late + 2 * 4.0 + 1.0
    outside = [t for t in times if not low <= t <= high]
    assert len(outside) <= 0.01 * len(times), (outside, low, high)
    # 2% each way: a ping round trip is lost with probability 1 - 0.98^2 = 3.96%
    loss = 1 - len(times) / 400
    assert 0.0 < loss and loss_within(100 * loss, 100 * (1 - 0.98**2), 400), (loss, stdout)


def test_a_profile_changes_netems_delay_in_place_without_reordering(
    link_rate_bps, path_floor_ms, tmp_path, clean_machine
):
    """two_dc whose delay steps from 20 to 30 ms 1 s after the build and down to 15 ms at 2.5 s,
    the decrease ramped by 1 ms every millisecond (``profile_player.py``): every netem leaf reads the
    profile's delay back, each phase's round trips are twice its delay, and no reply arrives out of
    order across the decrease (netem would reorder one made at once)."""
    data = yaml.safe_load((REPO / "topologies" / "two_dc.yaml").read_text())
    data["links"][0].update(rate=f"{min(link_rate_bps, 100_000_000)}bit", profile="steps.csv")
    (tmp_path / "steps.csv").write_text("time,delay\n1s,30ms\n2.5s,15ms\n")
    (tmp_path / "stepped.yaml").write_text(yaml.safe_dump(data))
    spec = parse_topology(data, str(tmp_path / "stepped.yaml"))
    with make_network(spec, out_dir=tmp_path / "run", delay_mechanism="netem") as net:
        out = net.run(
            "east-h0", ["ping", "-U", "-D", "-n", "-i", "0.01", "-w", "4", str(net.host("west-h0").ip)]
        ).stdout
        leaves = [
            leaf.delay_us
            for src in ("east", "west")
            for leaf in read_netem(
                net.handles.ipr(net.plan.routers[src].netns), f"w-{'west' if src == 'east' else 'east'}"
            ).values()
        ]
    assert leaves == [15_000, 15_000], leaves
    log = [json.loads(x) for x in (tmp_path / "run" / "shaping.jsonl").read_text().splitlines()]
    steps = [r for r in log if r["event"] == "profile_step"]
    assert [(s["profile_t_us"], s["delay_us"]) for s in steps] == [
        (0, 20_000),
        (1_000_000, 30_000),
        (2_500_000, 15_000),
    ]
    t0 = steps[0]["due_ns"] / 1e9
    offset = (time.clock_gettime_ns(time.CLOCK_REALTIME) - time.monotonic_ns()) / 1e9
    replies = []
    for line in out.splitlines():
        m = re.match(r"\[(\d+\.\d+)\].*icmp_seq=(\d+).*time=([\d.]+) ms", line)
        if m:
            sent = float(m.group(1)) - float(m.group(3)) / 1e3 - offset - t0
            replies.append((int(m.group(2)), sent, float(m.group(3))))
    seqs = [s for s, _, _ in replies]
    assert seqs == sorted(seqs), "replies out of order"
    floor_median, _ = path_floor_ms
    # the decrease's ramp takes 15 changes a ms apart, each a few ms under TCG: the last phase is
    # judged from 0.15 s after the ramp ended as logged (a 2 x 30 ms round trip in flight, and slack)
    ramp_end = (steps[2]["t_ns"] + steps[2]["duration_ns"]) / 1e9 - t0
    print(f"the ramp from 30 to 15 ms ended {ramp_end - 2.5:.3f} s after it was due")
    for (a, b), expected in (((0.3, 0.95), 40.0), ((1.2, 2.45), 60.0), ((max(2.65, ramp_end + 0.15), 3.8), 30.0)):
        phase = [rtt for _, t, rtt in replies if a <= t < b]
        assert phase and rtt_within(statistics.median(phase), expected, floor_median), (a, statistics.median(phase))
