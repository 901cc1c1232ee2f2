#!/usr/bin/env python3
"""Benchmark: one TCP connection against n striped connections on a long, capped link.

On a real long link one connection carries at most window / RTT, a small share of the link, which
is why Atlas stripes WAN transfers (DESIGN.md section 2a). For each modelled per-connection share
and one-way delay, this caps the hosts' socket buffers to reproduce the share on a two-DC
link, picks n from the bandwidth-delay product (planner.connections_for) and prints the measured
goodput of 1 and of n parallel iperf3 streams, and the window one connection kept in flight
(goodput x RTT) per byte of the cap: the kernel's advertised window over its receive buffer, which
``plan/connections.window_per_buffer_byte`` takes as 0.5 before Linux 6.6 and as its measured
median from 6.6 on (``--one``: one stream only, over several rates). A path whose window would
hold fewer than ``fit.MIN_WINDOW_SEGMENTS`` segments is skipped (the testbed refuses it). Figures
printed, nothing asserted; the table is recorded in ``docs/results/connection_window.json``
(``results/published.py``; ``--no-record`` leaves it alone); ``--caps`` sets the caps themselves
and records ``connection_window_caps.json``; ``--offloads-off`` turns the hosts' segmentation and
receive offloads off, as no run does (docs/simulator.md, "Not modelled"), and records nothing.

Run as root: .venv/bin/python scripts/bench_connections.py [--rates 100mbit] [--delays 10ms,40ms]
[--shares 0.1,0.25,0.5 | --caps 6000,9000] [--seconds 4] [--one] [--no-record] [--offloads-off]
"""

from __future__ import annotations

import argparse
import math
import platform
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.net.iperf import iperf
from testbed.plan.connections import buffer_for_share, connections_for, window_for_share, window_per_buffer_byte
from testbed.results.published import Column, record_result
from testbed.run.backends import make_network
from testbed.run.fit import MIN_WINDOW_SEGMENTS
from testbed.run.interrupts import tears_down_on_signals
from testbed.spec.addressing import HOST_IFNAME
from testbed.spec.topology_file import parse_topology
from testbed.spec.units import parse_rate_bps
from testbed.spec.wire import TCP_GOODPUT_FRACTION, TCP_MSS_WITH_TIMESTAMPS

REPO = Path(__file__).resolve().parents[1]
COLUMNS = [
    Column("rate", ("{rate}",)),
    Column("one-way delay", ("{delay}",)),
    Column("share stated", ("{share:g}",)),
    Column("socket-buffer cap, bytes", ("{buffer}", "skipped: {skipped}")),
    Column("window / cap", ("{ratio:.3f}", "")),
    Column("1 connection Mbit/s", ("{one_mbit:.1f}", "")),
    Column("share filled", ("{one_share:.2f}", "")),
    Column("n", ("{n}", "")),
    Column("n connections Mbit/s", ("{many_mbit:.1f}", "")),
    Column("share filled", ("{many_share:.2f}", "")),
]


#: the hosts' offloads ``--offloads-off`` turns off: segmentation (TCP's and the generic one) on
#: send, generic receive offload on receive, so that every buffer a socket queues or receives holds
#: one segment
OFFLOADS = ("tso", "gso", "gro")


def offloads_off(net, hosts: list[str]) -> None:
    """Turn ``OFFLOADS`` off on the hosts' interface (ethtool -K, inside each host's namespace)."""
    for h in hosts:
        net.run(h, ["ethtool", "-K", HOST_IFNAME, *(x for o in OFFLOADS for x in (o, "off"))])


def require_ethtool(ap: argparse.ArgumentParser) -> None:
    """``--offloads-off`` needs ethtool: a usage error naming the package where it is missing."""
    if shutil.which("ethtool") is None:
        ap.error("--offloads-off needs ethtool: apt-get install ethtool")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="100mbit")
    ap.add_argument("--delays", default="10ms,40ms")
    ap.add_argument("--shares", default="0.1,0.25,0.5")
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--one", action="store_true", help="one stream only")
    ap.add_argument(
        "--caps",
        help="socket-buffer caps in bytes (e.g. 6000,9000,14000) instead of --shares: the window kept per cap "
        "byte against the cap, one stream each (implies --one)",
    )
    ap.add_argument("--no-record", action="store_true", help="leave docs/results/connection_window.json alone")
    ap.add_argument(
        "--offloads-off", action="store_true", help=f"the hosts' {', '.join(OFFLOADS)} off (implies --no-record)"
    )
    args = ap.parse_args()
    if args.offloads_off:
        require_ethtool(ap)
        args.no_record = True  # the recorded table is the one a run's hosts have
    args.one = args.one or args.caps is not None
    rows: list[dict] = []
    print(
        f"{'rate':>8} {'one-way':>8} {'share':>6} {'buffer':>9} {'n':>3} {'1 conn Mbit/s':>14} {'(share)':>8} "
        f"{'window/buffer':>13} {'n conn Mbit/s':>14} {'(share)':>8}"
    )
    ratios = []
    for rate_text, delay in ((r, d) for r in args.rates.split(",") for d in args.delays.split(",")):
        rate = parse_rate_bps(rate_text)
        topo = parse_topology(
            {
                "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
                "links": [{"between": ["a", "b"], "rate": rate_text, "delay": delay}],
            },
            "<bench>",
        )
        rtt = 2 * topo.links[0].delay_us / 1e6
        bdp = rate / 8 * rtt
        if args.caps:  # each cap's share: what the measured median ratio would keep of the BDP
            caps = [int(x) for x in args.caps.split(",")]
            points = [(round(c * window_per_buffer_byte() / bdp, 4), c) for c in caps]
        else:
            points = [(s, buffer_for_share(rate, rtt, s)) for s in (float(x) for x in args.shares.split(","))]
        for share, buf in points:
            row = {"rate": rate_text, "delay": delay, "share": share}
            if not args.caps and window_for_share(rate, rtt, share) < MIN_WINDOW_SEGMENTS * TCP_MSS_WITH_TIMESTAMPS:
                rows.append({**row, "skipped": f"a window under {MIN_WINDOW_SEGMENTS} segments"})
                print(f"{rate_text:>8} {delay:>8} {share:>6.2f}  skipped: {rows[-1]['skipped']}")
                continue
            n = connections_for(rate, rtt, share * rate / 8 * rtt)
            with tempfile.TemporaryDirectory() as tmp:
                with make_network(topo, out_dir=Path(tmp), tcp_buffer_bytes=buf) as net:
                    if args.offloads_off:
                        offloads_off(net, ["a-h0", "b-h0"])
                    one = iperf(net, "a-h0", "b-h0", args.seconds, 1).bits_per_second
                    many = (
                        math.nan
                        if args.one
                        else iperf(net, "a-h0", "b-h0", args.seconds, 1, extra=["-P", str(n)]).bits_per_second
                    )
            full = rate * TCP_GOODPUT_FRACTION
            ratios.append(one / 8 * rtt / buf)
            rows.append(
                {
                    **row,
                    "buffer": buf,
                    "ratio": ratios[-1],
                    "one_mbit": one / 1e6,
                    "one_share": one / full,
                    **({} if args.one else {"n": n, "many_mbit": many / 1e6, "many_share": many / full}),
                }
            )
            print(
                f"{rate_text:>8} {delay:>8} {share:>6.2f} {buf:>9d} {n:>3d} {one / 1e6:>14.1f} {one / full:>8.2f} "
                f"{ratios[-1]:>13.3f} {many / 1e6:>14.1f} {many / full:>8.2f}",
                flush=True,
            )
    print(
        f"window per buffer byte: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f} "
        f"(kernel {platform.release()}; plan/connections.window_per_buffer_byte takes {window_per_buffer_byte():.3f})"
    )
    if not args.no_record:
        command = ("scripts/bench_connections.py " + " ".join(sys.argv[1:])).strip()
        name = "connection_window_caps" if args.caps else "connection_window"
        path = record_result(REPO, name, COLUMNS, rows, "scripts/bench_connections.py", command)
        print(f"recorded in {path}")


if __name__ == "__main__":
    with tears_down_on_signals():  # SIGTERM, SIGHUP and Ctrl-C tear the network down
        main()
