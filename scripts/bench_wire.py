#!/usr/bin/env python3
"""Benchmark of the emulated wire's accuracy and of the delay element's cost (figures printed next
to their goals, nothing asserted).

For every cell of {1, 10, 100, 1000} Mbit/s x {1, 10, 50, 200} ms one way, on a two-DC topology of
one host each whose link queue holds the path's bandwidth-delay product (and whose socket buffers
do: the testbed sizes them at 4 x BDP, ``net/netns.py``):

- idle RTT: ``ping -U`` samples against twice the one-way delay (goal: within 0.3 ms). ping prints a
  reply's time to 1 ms from 100 ms up (0.1 ms from 10 ms), too coarse for the goal, so the figure
  judged is the mean from its summary line (microseconds); the median of the printed replies is
  shown beside it;
- TCP goodput after slow start (iperf3, the first seconds omitted: at least 2 s and 25 RTTs)
  against the shaped rate x 1448/1514 (goal: within 2% where the queue and the socket buffers
  hold the BDP; a cell where they cannot, or where this machine's measured capacity is below
  the rate, is reported, not judged);
- the packets the WAN queue dropped during the TCP measurement;
- after the table, the RTT spread with 4 ms of jitter each way (``measure_jitter``);
- with the NFQUEUE delay element (this machine's kernel has no sch_netem): how late it released
  packets (its own counters: mean, p99 bucket edge, max) and its CPU share while the TCP test ran
  (both elements' utime + stime over the wall time, in % of one core).

The cells are recorded for the results page in ``docs/results/wire_<mechanism>.json``
(``results/published.py``; then ``scripts/reference_pages.py`` renders the page; ``--no-record``
leaves them alone).

Run as root: .venv/bin/python scripts/bench_wire.py [--rates 1,10,100,1000] [--delays 1,10,50,200]
[--duration 5] [--delay-mechanism auto|netem|nfqueue] [--no-record]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.errors import CheckError
from testbed.net.capacity_probe import machine_capacity_bps
from testbed.net.delay_element import read_element_stats
from testbed.net.features import default_congestion
from testbed.net.fidelity import jitter_rtt_sd_ms, parse_ping_ms, path_queue_drops
from testbed.net.iperf import iperf
from testbed.results.published import Column, commit, record_result
from testbed.run.backends import make_network
from testbed.run.interrupts import tears_down_on_signals
from testbed.spec.topology_file import parse_topology
from testbed.spec.wire import TCP_GOODPUT_FRACTION, bdp_packets

RTT_GOAL_MS = 0.3
GOODPUT_GOAL = 0.02
REPO = Path(__file__).resolve().parents[1]
#: the results page's table: a row per cell (keys of ``measure_cell``'s figures, with the cell's
#: rate and delay and whether its goodput was judged)
COLUMNS = [
    Column("rate Mbit/s", ("{rate:g}",)),
    Column("one-way delay ms", ("{delay:g}",)),
    Column("idle RTT ms (mean)", ("{rtt_ms:.3f}",)),
    Column("over 2 x delay", ("{rtt_err_ms:+.3f} ms",)),
    Column("TCP goodput Mbit/s", ("{goodput_mbit:.2f}",)),
    Column("against rate x 1448/1514", ("{goodput_err:+.1%}",)),
    Column("judged", ("{judged}",)),
    Column("queue drops", ("{drops:.0f}",)),
    Column("element CPU % of a core", ("{cpu_pct:.1f}", "-")),
    Column(
        "release late us: mean, p99 bucket edge, max", ("{late_mean_us:.1f}, {late_p99_us:.0f}, {late_max_us:.0f}", "-")
    ),
]
TICKS = os.sysconf("SC_CLK_TCK")
WIDTHS = (6, 6, 8, 9, 7, 9, 7, 7, 6, 8, 9, 6, 7)


def cpu_s(pid: int) -> float:
    """utime + stime of a process so far (s), from /proc/<pid>/stat (proc(5) fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def idle_rtt_ms(net, src: str, dst: str, samples: int) -> tuple[float, float]:
    """(median of the printed replies, mean from ping's summary line) of ``ping -U`` from host
    ``src`` to host ``dst``, in ms."""
    argv = ["ping", "-U", "-n", "-c", str(samples), "-i", "0.05", "-W", "3", str(net.host(dst).ip)]
    out = net.run(src, argv, timeout_s=samples * 4 + 10).stdout
    summary = re.search(r"= ([0-9.]+)/([0-9.]+)/([0-9.]+)/([0-9.]+) ms", out)
    replies = parse_ping_ms(out)
    if summary is None or len(replies) < samples // 2:
        raise CheckError(f"ping {src}->{dst} got {len(replies)} of {samples} replies: {out[-300:]}")
    return statistics.median(replies), float(summary.group(2))


def cell_topology(rate_mbit: float, delay_ms: float, congestion: str | None = None, jitter_ms: float = 0.0):
    rate_bps = int(rate_mbit * 1e6)
    queue = max(1000, bdp_packets(rate_bps, int(2 * delay_ms * 1000)) + 100)
    link = {"between": ["a", "b"], "rate": f"{rate_mbit:g}mbit", "delay": f"{delay_ms:g}ms", "queue": queue}
    if jitter_ms:
        link["jitter"] = f"{jitter_ms:g}ms"
    data = {"name": "wire", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}], "links": [link]}
    if congestion:
        data["tcp_congestion"] = congestion
    return parse_topology(data, "<bench>")


def measure_cell(rate_mbit: float, delay_ms: float, args, out: Path) -> dict:
    spec = cell_topology(rate_mbit, delay_ms, args.tcp_congestion)
    rtt_expected_ms = 2 * delay_ms
    omit_s = max(2.0, 25 * rtt_expected_ms / 1000)
    with make_network(spec, out_dir=out, delay_mechanism=args.delay_mechanism) as net:
        rtt_median_ms, rtt_ms = idle_rtt_ms(net, "a-h0", "b-h0", args.rtt_samples)
        pids = [el.proc.pid for el in net.delay.elements if el.proc] if net.delay else []
        drops0 = path_queue_drops(net, ["a", "b"])
        cpu0, t0 = sum(cpu_s(p) for p in pids), time.monotonic()
        tcp = iperf(net, "a-h0", "b-h0", args.duration, omit_s)
        cpu = (sum(cpu_s(p) for p in pids) - cpu0) / (time.monotonic() - t0) if pids else None
        drops = path_queue_drops(net, ["a", "b"]) - drops0
        mechanism, logs = net.mechanism, net.out_dir / "logs"
    stats = [s for p in logs.glob("nfq_delay-*.log") for s in read_element_stats(p) if s["packets"]]
    expected = rate_mbit * 1e6 * TCP_GOODPUT_FRACTION
    return {
        "rtt_ms": rtt_ms,
        "rtt_median_ms": rtt_median_ms,
        "rtt_err_ms": rtt_ms - rtt_expected_ms,
        "goodput_mbit": tcp.bits_per_second / 1e6,
        "goodput_err": tcp.bits_per_second / expected - 1,
        "drops": drops,
        "cpu_pct": 100 * cpu if cpu is not None else None,
        "late_mean_us": statistics.mean(s["late_mean_us"] for s in stats) if stats else None,
        "late_p99_us": max(s["late_p99_us"] for s in stats) if stats else None,
        "late_max_us": max(s["late_max_us"] for s in stats) if stats else None,
        "mechanism": mechanism,
    }


JITTER_MS, JITTER_DELAY_MS = 4.0, 20.0


def measure_jitter(args, out: Path) -> dict:
    """RTT spread of 400 pings (10 ms apart) over a 10 Mbit/s link with ``JITTER_MS`` of jitter each
    way: netem and the delay element both draw it uniformly, so the round trip's standard deviation
    is 2 j / sqrt(6) (the element keeps packets in order, which at 10 ms spacing never binds)."""
    spec = cell_topology(10, JITTER_DELAY_MS, args.tcp_congestion, JITTER_MS)
    with make_network(spec, out_dir=out, delay_mechanism=args.delay_mechanism) as net:
        ping = ["ping", "-U", "-n", "-c", "400", "-i", "0.01", str(net.host("b-h0").ip)]
        times = parse_ping_ms(net.run("a-h0", ping, timeout_s=60).stdout)
    return {
        "mean_ms": statistics.fmean(times),
        "sd_ms": statistics.stdev(times),
        "expected_sd_ms": jitter_rtt_sd_ms(JITTER_MS),
        "min_ms": min(times),
        "max_ms": max(times),
        "samples": len(times),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="1,10,100,1000", help="Mbit/s, comma-separated")
    ap.add_argument("--delays", default="1,10,50,200", help="one-way ms, comma-separated")
    ap.add_argument("--duration", type=float, default=5.0, help="measured iperf3 seconds per cell")
    ap.add_argument("--rtt-samples", type=int, default=20)
    ap.add_argument("--delay-mechanism", default="auto", choices=("auto", "netem", "nfqueue"))
    ap.add_argument(
        "--tcp-congestion", help="the hosts' TCP congestion control (default: the machine's; see testbed doctor)"
    )
    ap.add_argument("--no-record", action="store_true", help="leave docs/results/wire_*.json as they are")
    args = ap.parse_args()
    at_commit = commit(REPO)  # the runs' commit, before a recorded table changes the tree
    records: list[dict] = []
    rates = [float(r) for r in args.rates.split(",")]
    delays = [float(d) for d in args.delays.split(",")]
    print(
        f"goals: idle RTT within {RTT_GOAL_MS} ms of 2 x delay; goodput within {GOODPUT_GOAL:.0%} of rate x "
        f"{TCP_GOODPUT_FRACTION:.4f} where the queue and socket buffers hold the BDP (queue here: max(1000, "
        f"BDP + 100) packets; buffers: 4 x BDP); TCP congestion control: "
        f"{args.tcp_congestion or default_congestion() + ' (the machine default)'}"
    )
    header = (
        "rate",
        "delay",
        "RTT p50",
        "RTT mean",
        "err",
        "goodput",
        "err",
        "judged",
        "drops",
        "elem CPU",
        "late",
        "p99",
        "max",
    )
    units = ("Mbit/s", "ms", "printed", "ms", "ms", "Mbit/s", "", "", "", "%core", "mean us", "us", "us")
    for row in (header, units):
        print(" ".join(f"{c:>{w}}" for c, w in zip(row, WIDTHS)))
    rtt_ok = goodput_ok = judged = cells = 0
    with tempfile.TemporaryDirectory(prefix="bench-wire-") as tmp:
        for rate in rates:
            for delay in delays:
                r = measure_cell(rate, delay, args, Path(tmp) / f"{rate:g}-{delay:g}")
                cells += 1
                # judged where the machine carries the rate (the capacity probe's figure)
                fair = rate * 1e6 <= machine_capacity_bps(r["mechanism"])[0]
                rtt_ok += abs(r["rtt_err_ms"]) <= RTT_GOAL_MS
                judged += fair
                goodput_ok += fair and abs(r["goodput_err"]) <= GOODPUT_GOAL
                cpu = f"{r['cpu_pct']:8.1f}" if r["cpu_pct"] is not None else f"{'-':>8}"
                late = (
                    f"{r['late_mean_us']:9.1f} {r['late_p99_us']:6.0f} {r['late_max_us']:7.0f}"
                    if r["late_mean_us"] is not None
                    else f"{'-':>9} {'-':>6} {'-':>7}"
                )
                records.append({"rate": rate, "delay": delay, "judged": "yes" if fair else "no", **r})
                print(
                    f"{rate:6g} {delay:6g} {r['rtt_median_ms']:8.2f} {r['rtt_ms']:9.3f} {r['rtt_err_ms']:+7.3f} "
                    f"{r['goodput_mbit']:9.2f} "
                    f"{r['goodput_err']:+7.1%} {'yes' if fair else 'no':>7} {r['drops']:6d} {cpu} {late}",
                    flush=True,
                )
        jitter = measure_jitter(args, Path(tmp) / "jitter")
    print(f"delay mechanism: {r['mechanism']}")
    print(f"idle RTT within {RTT_GOAL_MS} ms: {rtt_ok}/{cells} cells (goal: all)")
    print(f"goodput within {GOODPUT_GOAL:.0%}: {goodput_ok}/{judged} judged cells (goal: all)")
    print(
        f"jitter {JITTER_MS:g} ms each way on a {JITTER_DELAY_MS:g} ms, 10 Mbit/s link: RTT mean "
        f"{jitter['mean_ms']:.2f} ms, standard deviation {jitter['sd_ms']:.2f} ms (uniform on +-{JITTER_MS:g} ms "
        f"each way: {jitter['expected_sd_ms']:.2f} ms), min {jitter['min_ms']:.2f}, max {jitter['max_ms']:.2f} ms "
        f"over {jitter['samples']} pings"
    )
    if not args.no_record:
        command = ("scripts/bench_wire.py " + " ".join(sys.argv[1:])).strip()
        path = record_result(
            REPO, f"wire_{r['mechanism']}", COLUMNS, records, "scripts/bench_wire.py", command, at_commit=at_commit
        )
        print(f"recorded for the results page in {path}: run scripts/reference_pages.py to show it")


if __name__ == "__main__":
    with tears_down_on_signals():  # SIGTERM, SIGHUP and Ctrl-C tear the network down
        main()
