#!/usr/bin/env python3
"""Benchmark of the emulated network (figures printed, nothing asserted).

- build and teardown time of a 4-DC x 8-host full mesh (targets: build < 3 s, teardown < 2 s on a
  2-core VM);
- latency of one live HTB rate change on a WAN class through netlink (target: p99 < 1 ms), next
  to the tc command-line tool's time for the same change in the same run.

Run as root: .venv/bin/python scripts/bench_network.py [--repeat N] [--changes N]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from testbed.capacity import machine_capacity_bps
from testbed.emulation import Emulation
from testbed.hostproc import netns_argv
from testbed.shaping import DEFAULT_CLASS_MINOR, HtbClass, LINK_CLASS_MINOR, tc_class_argv
from testbed.topology import parse_topology


def mesh(n_dcs: int, hosts: int):
    dcs = [{"name": f"dc{i}", "hosts": hosts} for i in range(n_dcs)]
    links = [{"between": [f"dc{i}", f"dc{j}"], "rate": "100mbit", "delay": f"{10 + 5 * (i + j)}ms"}
             for i in range(n_dcs) for j in range(i + 1, n_dcs)]
    return parse_topology({"name": f"mesh{n_dcs}x{hosts}", "dcs": dcs, "links": links}, "<bench>")


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--changes", type=int, default=1000)
    ap.add_argument("--tc-changes", type=int, default=100)
    args = ap.parse_args()
    spec = mesh(4, 8)
    with tempfile.TemporaryDirectory() as tmp:
        builds, teardowns = [], []
        emu0 = Emulation(spec, out_dir=Path(tmp) / "warm")
        with emu0:  # first build may measure the machine's capacity; not counted
            mechanism = emu0.mechanism
        machine_capacity_bps(mechanism)
        for i in range(args.repeat):
            emu = Emulation(spec, out_dir=Path(tmp) / f"b{i}")
            t0 = time.perf_counter()
            emu.__enter__()
            t1 = time.perf_counter()
            emu.__exit__(None, None, None)
            t2 = time.perf_counter()
            builds.append(t1 - t0)
            teardowns.append(t2 - t1)
        print(f"topology {spec.name}: {len(spec.dcs)} DCs x 8 hosts, {len(spec.links)} WAN links, "
              f"{len(spec.dcs) + spec.host_count} namespaces, delay mechanism {mechanism}")
        print(f"  build    median {statistics.median(builds):.3f} s  max {max(builds):.3f} s  (target < 3 s)")
        print(f"  teardown median {statistics.median(teardowns):.3f} s  max {max(teardowns):.3f} s  (target < 2 s)")

        with Emulation(spec, out_dir=Path(tmp) / "live") as emu:
            rates = [20_000_000, 80_000_000]
            nl = []
            for i in range(args.changes):
                t0 = time.perf_counter_ns()
                emu.set_wan_class_rate("dc0", "dc1", DEFAULT_CLASS_MINOR, rates[i % 2])
                nl.append((time.perf_counter_ns() - t0) / 1e6)
            router = emu.plan.routers["dc0"].netns
            ifname = emu.plan.wan_ends[("dc0", "dc1")].ifname
            tc = []
            for i in range(args.tc_changes):
                cls = HtbClass(DEFAULT_CLASS_MINOR, LINK_CLASS_MINOR, rates[i % 2], rates[i % 2])
                argv = netns_argv(router, tc_class_argv(ifname, cls, "change"))
                t0 = time.perf_counter_ns()
                subprocess.run(argv, check=True)
                tc.append((time.perf_counter_ns() - t0) / 1e6)
        print("live rate change of one WAN class (dc0->dc1 1:10):")
        print(f"  netlink (pyroute2)  n={len(nl):5d}  p50 {pct(nl, 50):.3f} ms  p99 {pct(nl, 99):.3f} ms  "
              f"(target p99 < 1 ms; includes the shaping-log write)")
        print(f"  tc tool (nsenter)   n={len(tc):5d}  p50 {pct(tc, 50):.3f} ms  p99 {pct(tc, 99):.3f} ms")


if __name__ == "__main__":
    main()
