#!/usr/bin/env python3
"""Benchmark of the gradient all-reduce inside one emulated DC (unshaped access links, as the
emulator's are) under the socket-buffer cap a run sets for its WAN share: R processes in R hosts of
one DC run gloo's all-reduce of a gradient (torch.distributed, as the workers do; one thread each),
rings of R side by side as a run's stages run theirs at once, for each cap. Prints the median time
of an all-reduce, and what it comes to per window each member sends (its 2 (R - 1) / R of the
gradient over the window the cap keeps, ``connections.window_for_buffer``) and per MB, beside
``allreduce.INTRA_DC_ROUND_S`` and ``allreduce.INTRA_DC_S_PER_BYTE``, the figures the simulator
takes from this script. Nothing asserted.

The cap is the hosts' (tcp_rmem/tcp_wmem), so a connection inside a DC keeps the same window as one
across the WAN, and with a round trip of about 0.1 ms instead of tens, a small window sets the
all-reduce's pace: the simulator's "all-reduce inside a DC" (docs/simulator.md).

Run as root: .venv/bin/python scripts/bench_allreduce.py [--caps 12000,24000,48000,96000,none]
[--replicas 2,4] [--rings 2] [--mbytes 2] [--repeats 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.plan.allreduce import INTRA_DC_ROUND_S, INTRA_DC_S_PER_BYTE
from testbed.plan.connections import window_for_buffer
from testbed.run.backends import make_network
from testbed.run.interrupts import tears_down_on_signals
from testbed.spec.topology_file import parse_topology

PORT = 29600
#: what each process runs: R ranks of one ring (its own store port), gloo's all-reduce of N float32
#: values, the first 3 as warm-up; rank 0 prints each timed one's seconds
WORKER = """
import sys, time, datetime, torch, torch.distributed as dist
torch.set_num_threads(1)
addr, port, rank, world, n, repeats = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:])
dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=120))
x = torch.ones(n)
times = []
for i in range(3 + repeats):
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(x)
    times.append(time.perf_counter() - t0)
if rank == 0:
    print("times", " ".join(f"{t:.6f}" for t in times[3:]))
dist.destroy_process_group()
"""


def ring_times(net, hosts: list[str], port: int, values: int, repeats: int) -> list:
    """Start one ring's processes in ``hosts``; returns the processes (rank 0 first)."""
    ip0 = str(net.host(hosts[0]).ip)
    py = net.python(hosts[0])
    return [
        net.popen(
            h,
            [py, "-c", WORKER, ip0, str(port), str(r), str(len(hosts)), str(values), str(repeats)],
            env=net.process_env({"OMP_NUM_THREADS": "1"}),
            stdout=subprocess.PIPE,
            text=True,
        )
        for r, h in enumerate(hosts)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--caps", default="12000,24000,48000,96000,none", help="socket-buffer caps (bytes; none: no cap)")
    ap.add_argument("--replicas", default="2,4", help="ring sizes R")
    ap.add_argument("--rings", type=int, default=2, help="rings side by side (a run's stages; default 2)")
    ap.add_argument("--mbytes", type=float, default=2.0, help="the gradient, MB (default 2)")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    values = int(args.mbytes * 1e6 / 4)
    print(
        f"all-reduce of {args.mbytes:g} MB, {args.rings} rings side by side, median of {args.repeats}; the simulator "
        f"takes {INTRA_DC_ROUND_S * 1e6:.0f} us a window round and {INTRA_DC_S_PER_BYTE * 1e9:.2f} ms per MB"
    )
    print(f"{'cap':>8} {'window':>8} {'R':>3} {'ms':>8} {'windows':>8} {'us/window':>10} {'ms/MB':>8}")
    for cap_text in args.caps.split(","):
        cap = None if cap_text == "none" else int(cap_text)
        for R in (int(x) for x in args.replicas.split(",")):
            hosts = R * args.rings
            topo = parse_topology(
                {
                    "dcs": [{"name": "a", "hosts": hosts}, {"name": "b", "hosts": 1}],
                    "links": [{"between": ["a", "b"], "rate": "100mbit", "delay": "10ms"}],
                },
                "<bench>",
            )
            with (
                tempfile.TemporaryDirectory() as tmp,
                make_network(topo, out_dir=Path(tmp), tcp_buffer_bytes=cap) as net,
            ):
                rings = [
                    ring_times(net, [f"a-h{k * R + r}" for r in range(R)], PORT + k, values, args.repeats)
                    for k in range(args.rings)
                ]
                medians = []
                for procs in rings:
                    out, _ = procs[0].communicate(timeout=300)
                    for p in procs[1:]:
                        p.wait(timeout=60)
                    line = next(x for x in out.splitlines() if x.startswith("times "))
                    medians.append(statistics.median(float(x) for x in line.split()[1:]))
            t = max(medians)
            sent = 2 * (R - 1) / R * args.mbytes * 1e6  # what each member sends to the next
            window = window_for_buffer(cap) if cap is not None else None
            windows = sent / window if window else float("nan")
            print(
                f"{cap_text:>8} {window or '-':>8} {R:>3} {t * 1e3:>8.1f} {windows:>8.0f} "
                f"{t / windows * 1e6 if window else float('nan'):>10.0f} {t / (sent / 1e6) * 1e3:>8.2f}"
            )


if __name__ == "__main__":
    with tears_down_on_signals():
        main()
