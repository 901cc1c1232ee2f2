#!/usr/bin/env python3
"""Benchmark of density: how many emulated GPUs this machine holds with representative timing, and
how much memory each worker takes (figures printed next to their goals, nothing asserted).

Runs ``testbed run`` on 4 DCs of max(8, R) hosts in a full mesh (100 Mbit/s, one-way delays of
10-35 ms; the 4x8 mesh of ``bench_network.py``) with 4 pipeline stages x R data-parallel replicas of
the default experiment's width (d_model 128, seq_len 64, 1F1B, 4 microbatches of 2) with 8 layers,
for R = 1, 2, 4, 8: 4 to 32 emulated GPUs (goal without dilation: 32), and with ``--dilation``
at each time dilation k given (``spec/dilation.py``; issue 44's goal: 64 emulated GPUs, R = 16, at
some k <= 8). A size is representative when

- the compute overrun fraction (operations whose real compute outlasted their padded target,
  ``summary.json``) is under 5% (``results/summary.py``'s threshold), and
- the idle RTT measured during training (``ping -U`` between two DCs whose link carries no
  pipeline traffic: the first and third stages' DCs) stays within the fidelity check's tolerance
  of twice the path's one-way delay (``net/fidelity.py``: max(1 ms, 5%)), judged in real time
  against the delays the kernel was given (k times the topology's).

Memory per worker: the largest resident set (RSS) and proportional set (PSS: pages shared with the
launcher it was forked from count by share) of each worker during the run, sampled every 0.5 s
from /proc/PID/smaps_rollup, next to ``plan/memory.py``'s estimate (what a run is checked against
before it is built).

Run as root: .venv/bin/python scripts/bench_density.py [--replicas 1,2,4,8] [--iterations 6] [--dilation 1,2,4,8]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.net.fidelity import RTT_TOLERANCE_FRACTION, RTT_TOLERANCE_MS, parse_ping_ms, rtt_within
from testbed.plan.memory import largest_worker
from testbed.run.fit import available_memory_bytes
from testbed.run.interrupts import tears_down_on_signals
from testbed.spec.experiment_file import load_experiment
from testbed.spec.routing import RoutingTable
from testbed.spec.topology_file import load_topology

GOAL_GPUS = 32
GOAL_GPUS_DILATED = 64
MAX_OVERRUN = 0.05
MIB = 2**20
REGISTRY = Path("/run/testbed/runs")
DCS = ["dc0", "dc1", "dc2", "dc3"]


def mesh_yaml(hosts: int = 8) -> str:
    """4 DCs of ``hosts`` hosts, every pair linked at 100 Mbit/s, one-way delay 10 + 5 (i + j) ms."""
    lines = ["name: mesh4x8", "dcs:"] + [f"  - {{name: {dc}, hosts: {hosts}}}" for dc in DCS] + ["links:"]
    for i in range(4):
        for j in range(i + 1, 4):
            lines.append(f"  - {{between: [{DCS[i]}, {DCS[j]}], rate: 100mbit, delay: {10 + 5 * (i + j)}ms}}")
    return "\n".join(lines) + "\n"


def experiment_yaml(replicas: int, iterations: int, dilation: float = 1.0) -> str:
    return (
        f"name: density-{4 * replicas}\ntopology: mesh4x8.yaml\nschedule: 1f1b\niterations: {iterations}\n"
        f"time_dilation: {dilation:g}\n"
        f"warmup_iterations: 2\nstages: 4\nreplicas: {replicas}\nmicrobatches: 4\nmicrobatch_size: 2\n"
        "model: {n_layers: 8, d_model: 128, n_heads: 4, seq_len: 64}\nlr: 0.001\nseed: 0\n"
        "wan_connection_share: 0.2\ncompute: {mode: padded, forward_ms: 40, backward_ms: 80}\n"
    )


def memory_kib(pid: int) -> tuple[int, int] | None:
    """(Rss, Pss) of a process in KiB from /proc/PID/smaps_rollup; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    fields = {line.split(":")[0]: int(line.split()[1]) for line in text.splitlines()[1:] if line.endswith("kB")}
    return fields["Rss"], fields["Pss"]


class Sampler(threading.Thread):
    """Every 0.5 s: the run's registered workers' memory, and (once the run trains) one idle-path
    ``ping -U`` series."""

    def __init__(self, owner_pid: int, out: Path, ping_pair: tuple[str, str]) -> None:
        super().__init__(daemon=True)
        self.owner_pid, self.out, self.ping_pair = owner_pid, out, ping_pair
        self.peak: dict[int, tuple[int, int]] = {}  # pid -> (max Rss, max Pss), KiB
        self.total_pss_kib = 0
        self.rtts: list[float] = []
        self.halt = threading.Event()

    def record(self) -> dict | None:
        for path in REGISTRY.glob("*.json"):
            try:
                rec = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if rec.get("owner_pid") == self.owner_pid:
                return rec
        return None

    def run(self) -> None:
        pinged = False
        while not self.halt.wait(0.5):
            rec = self.record()
            if rec is None:
                continue
            total = 0
            for p in rec["processes"]:
                launcher = p["what"] == "worker launcher"
                mem = memory_kib(p["pid"]) if launcher or p["what"].startswith("worker ") else None
                if mem is None:
                    continue
                total += mem[1]
                if not launcher:
                    old = self.peak.get(p["pid"], (0, 0))
                    self.peak[p["pid"]] = (max(old[0], mem[0]), max(old[1], mem[1]))
            self.total_pss_kib = max(self.total_pss_kib, total)
            if not pinged and (self.out / "events").is_dir() and any((self.out / "events").iterdir()):
                pinged = True
                self.rtts = self.ping(rec["prefix"])

    def ping(self, prefix: str) -> list[float]:
        src, dst = self.ping_pair
        topo_path = self.out / "topology.json"
        hosts = json.loads(topo_path.read_text())["hosts"] if topo_path.exists() else {}
        ip = hosts.get(f"{dst}-h0", {}).get("ip")
        if ip is None:
            return []
        argv = ["ip", "netns", "exec", f"{prefix}-{src}-h0", "ping", "-U", "-n", "-c", "40", "-i", "0.05", ip]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout
        return parse_ping_ms(out)


def one_size(replicas: int, args: argparse.Namespace, tmp: Path, dilation: float = 1.0) -> dict:
    folder = tmp / f"r{replicas}-k{dilation:g}"
    folder.mkdir()
    (folder / "mesh4x8.yaml").write_text(mesh_yaml(max(8, replicas)))
    exp_path = folder / "experiment.yaml"
    exp_path.write_text(experiment_yaml(replicas, args.iterations, dilation))
    exp = load_experiment(exp_path)
    out = folder / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed.cli", "run", str(exp_path), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # stages s on DC s (one stage per DC of 8 hosts): dc0 and dc2 exchange no pipeline traffic
    sampler = Sampler(proc.pid, out, ("dc0", "dc2"))
    sampler.start()
    log = proc.communicate()[0]
    sampler.halt.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"testbed run with {4 * replicas} workers failed:\n{log[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    routes = RoutingTable(load_topology(folder / "mesh4x8.yaml"))
    expected_rtt = routes.rtt_us("dc0", "dc2") / 1000 * dilation  # in real time: the kernel's delays
    rtt = statistics.median(sampler.rtts) if sampler.rtts else None
    peaks = list(sampler.peak.values())
    return {
        "workers": 4 * replicas,
        "dilation": dilation,
        "overrun": summary["compute_overrun_fraction"],
        "iteration_s": summary["iteration_time_s"],
        "startup_s": summary["startup_s"],
        "rtt_ms": rtt,
        "expected_rtt_ms": expected_rtt,
        "rtt_ok": rtt is not None and rtt_within(rtt, expected_rtt),
        "rss_mib": statistics.median(p[0] for p in peaks) / 1024 if peaks else None,
        "pss_mib": statistics.median(p[1] for p in peaks) / 1024 if peaks else None,
        "total_pss_mib": sampler.total_pss_kib / 1024,
        "estimate_mib": largest_worker(exp).total_bytes / MIB,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", default="1,2,4,8", help="data-parallel replicas to try (4 stages each)")
    ap.add_argument("--iterations", type=int, default=6, help="iterations per run (2 of them warm-up)")
    ap.add_argument("--dilation", default="1", help="time dilations to try each size at (e.g. 1,2,4,8)")
    args = ap.parse_args()
    print(
        f"machine: {os.cpu_count()} cores, {available_memory_bytes() / 2**30:.1f} GiB available, "
        f"kernel {platform.release()}"
    )
    print(
        f"goal: {GOAL_GPUS} emulated GPUs with compute overrun < {MAX_OVERRUN:.0%} and idle RTT within "
        f"max({RTT_TOLERANCE_MS:g} ms, {RTT_TOLERANCE_FRACTION:.0%}) during training"
    )
    print(f"with time dilation: goal {GOAL_GPUS_DILATED} emulated GPUs at some k <= 8 (issue 44)")
    print(
        f"{'k':>3} {'GPUs':>5} {'overrun':>8} {'iter s':>7} {'start s':>7} {'RTT ms':>7} {'expect':>7} "
        f"{'RSS MiB':>8} {'PSS MiB':>8} {'est. MiB':>8} {'all PSS':>8} representative"
    )
    largest: dict[float, int] = {}
    with tempfile.TemporaryDirectory(prefix="bench-density-") as tmp:
        for k in (float(x) for x in args.dilation.split(",")):
            largest[k] = 0
            for replicas in (int(r) for r in args.replicas.split(",")):
                r = one_size(replicas, args, Path(tmp), k)
                ok = r["overrun"] < MAX_OVERRUN and r["rtt_ok"]
                if ok:
                    largest[k] = max(largest[k], r["workers"])

                def f(value, spec: str) -> str:
                    return format(value, spec) if value is not None else "-"

                print(
                    f"{k:3g} {r['workers']:5d} {r['overrun']:8.1%} {r['iteration_s']:7.2f} "
                    f"{f(r['startup_s'], '.2f'):>7} {f(r['rtt_ms'], '.2f'):>7} {r['expected_rtt_ms']:7.2f} "
                    f"{f(r['rss_mib'], '.0f'):>8} {f(r['pss_mib'], '.0f'):>8} {r['estimate_mib']:8.0f} "
                    f"{r['total_pss_mib']:8.0f} {'yes' if ok else 'no'}",
                    flush=True,
                )
    for k, n in largest.items():
        goal = GOAL_GPUS if k == 1 else GOAL_GPUS_DILATED
        print(f"largest representative run at k = {k:g}: {n} emulated GPUs (goal: {goal})")


if __name__ == "__main__":
    with tears_down_on_signals():  # SIGTERM, SIGHUP and Ctrl-C tear the network down
        main()
