#!/usr/bin/env python3
"""Benchmark: one TCP connection against n striped connections on a long, capped link.

On a real long link one connection carries at most window / RTT, a small share of the link, which
is why Atlas stripes WAN transfers (DESIGN.md section 2a). For each modelled per-connection share
and one-way delay, this caps the hosts' socket buffers to reproduce the share on a two-DC
link, picks n from the bandwidth-delay product (planner.connections_for) and prints the measured
goodput of 1 and of n parallel iperf3 streams. Figures printed, nothing asserted.

Run as root: .venv/bin/python scripts/bench_connections.py [--rate 100mbit] [--seconds 4]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from testbed.net.iperf import iperf
from testbed.plan.connections import buffer_for_share, connections_for
from testbed.run.backends import make_network
from testbed.run.interrupts import tears_down_on_signals
from testbed.spec.topology_file import parse_topology
from testbed.spec.units import parse_rate_bps
from testbed.spec.wire import TCP_GOODPUT_FRACTION


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--delays", default="10ms,40ms")
    ap.add_argument("--shares", default="0.1,0.25,0.5")
    ap.add_argument("--seconds", type=float, default=4)
    args = ap.parse_args()
    rate = parse_rate_bps(args.rate)
    print(
        f"{'one-way':>8} {'share':>6} {'buffer':>9} {'n':>3} {'1 conn Mbit/s':>14} {'(share)':>8} "
        f"{'n conn Mbit/s':>14} {'(share)':>8}"
    )
    for delay in args.delays.split(","):
        topo = parse_topology(
            {
                "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
                "links": [{"between": ["a", "b"], "rate": args.rate, "delay": delay}],
            },
            "<bench>",
        )
        rtt = 2 * topo.links[0].delay_us / 1e6
        for share in (float(x) for x in args.shares.split(",")):
            buf = buffer_for_share(rate, rtt, share)
            n = connections_for(rate, rtt, buf / 2)
            with tempfile.TemporaryDirectory() as tmp:
                with make_network(topo, out_dir=Path(tmp), tcp_buffer_bytes=buf) as net:
                    one = iperf(net, "a-h0", "b-h0", args.seconds, 1).bits_per_second
                    many = iperf(net, "a-h0", "b-h0", args.seconds, 1, extra=["-P", str(n)]).bits_per_second
            full = rate * TCP_GOODPUT_FRACTION
            print(
                f"{delay:>8} {share:>6.2f} {buf:>9d} {n:>3d} {one / 1e6:>14.1f} {one / full:>8.2f} "
                f"{many / 1e6:>14.1f} {many / full:>8.2f}"
            )


if __name__ == "__main__":
    with tears_down_on_signals():  # SIGTERM, SIGHUP and Ctrl-C tear the network down
        main()
