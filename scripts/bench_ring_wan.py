#!/usr/bin/env python3
"""Benchmark of dp-wan's gradient all-reduce alone: an experiment's rings placed as a dp-wan run
places them (``placement.place``), on the experiment's own topology with the hosts' socket-buffer
cap a run sets (``connections.socket_buffer_cap``), each ring's processes running gloo's
all-reduce of that stage's gradient (torch.distributed, as the workers do), every stage's ring
side by side as in a run, or one at a time (``--alone``). Prints each stage's median time beside
the simulator's (``allreduce.stage_allreduce_s``), so that what the rings lose against the model
is measured without a pipeline around them (the validation's dp-wan rows: docs/simulator.md,
"Not modelled"). With ``--paths``, instead: a pair of processes across a two-DC link per path
(RATE:ONE_WAY_MS:SHARE, the cap set for that share of the path's bandwidth-delay product), each
member's bytes about 2 s of one window per round trip (``connections.window_rate_bps`` of the
window the cap keeps, ``window_for_buffer``): the bytes sent one way (gloo's send and recv, timed
by the receiver from its receive's post, the sender already waiting), beside that window rate,
then all-reduced by the two (a ring of two: each sends them all), beside the window rate plus the
ring's two steps of one-way delay (the model's count, ``allreduce.stage_allreduce_s``; the ring is
timed by the first member from a barrier's end, which the other may leave up to one way later).
Nothing asserted.

Run as root: .venv/bin/python scripts/bench_ring_wan.py EXPERIMENT [--alone] [--repeats 4]
             .venv/bin/python scripts/bench_ring_wan.py --paths 115.4mbit:2.6:0.2,50mbit:10:0.2 [--congestion cubic]
                 [--send-buffer-factor 4] [--offloads-off]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_allreduce import PORT, ring_times
from bench_connections import OFFLOADS, offloads_off, require_ethtool

from testbed.errors import FeatureError, SpecError
from testbed.net.features import require_congestion
from testbed.net.netlink import set_sysctls
from testbed.net.netns import namespace_sysctls
from testbed.plan.allreduce import stage_allreduce_s
from testbed.plan.connections import buffer_for_share, socket_buffer_cap, window_for_buffer, window_rate_bps
from testbed.plan.placement import place
from testbed.run.backends import make_network
from testbed.run.interrupts import tears_down_on_signals
from testbed.spec.experiment_file import load_experiment
from testbed.spec.model import stage_param_bytes
from testbed.spec.policy import parse_policy
from testbed.spec.topology_file import parse_topology
from testbed.spec.units import parse_rate_bps

#: each member's bytes on a --paths ring: this many seconds of one window per round trip
PATH_RING_S = 2.0


def medians(net, rings: dict[int, list[str]], values: dict[int, int], repeats: int) -> dict[int, float]:
    """Each stage's median all-reduce (s), the rings ``rings`` (stage: hosts in replica order)
    started together."""
    procs = {s: ring_times(net, hosts, PORT + s, values[s], repeats) for s, hosts in rings.items()}
    out = {}
    for s, ps in procs.items():
        text, _ = ps[0].communicate(timeout=600)
        for p in ps[1:]:
            p.wait(timeout=60)
        line = next(x for x in text.splitlines() if x.startswith("times "))
        out[s] = statistics.median(float(x) for x in line.split()[1:])
    return out


#: how long the receiver of a --paths one-way send waits after the barrier before it posts its
#: receive (s): the sender is then waiting in its send, so that the receive's time is the notice's
#: way there and the bytes' way back, with neither member's exit from the barrier in it
RECEIVER_PAUSE_S = 0.5
#: a --paths pair's processes: the same bytes sent one way (rank 0 to 1, gloo's send and recv;
#: timed by the receiver, from its receive's post to its end, ``RECEIVER_PAUSE_S`` after a
#: barrier), then all-reduced (timed by rank 0 from a barrier's end), each after 3 of warm-up;
#: each prints its timed seconds
ONE_WAY_WORKER = """
import sys, time, datetime, torch, torch.distributed as dist
torch.set_num_threads(1)
addr, port, rank, n, repeats = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:6])
pause = float(sys.argv[6])
dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=120))
x = torch.ones(n)
for label in ("one-way", "ring"):
    times = []
    for i in range(3 + repeats):
        dist.barrier()
        if label == "ring":
            t0 = time.perf_counter()
            dist.all_reduce(x)
        elif rank == 0:
            dist.send(x, 1)
        else:
            time.sleep(pause)
            t0 = time.perf_counter()
            dist.recv(x, 0)
        times.append(time.perf_counter() - t0 if (label == "ring") == (rank == 0) else 0.0)
    if (label == "ring") == (rank == 0):
        print(label, " ".join(f"{t:.6f}" for t in times[3:]), flush=True)
dist.destroy_process_group()
"""


def pair_medians(net, n: int, repeats: int) -> dict[str, float]:
    """The median seconds of sending ``n`` float32 values one way from a-h0 to b-h0 (timed by the
    receiver) and of all-reducing them (timed by a-h0): "one-way", "ring"."""
    py, ip0 = net.python("a-h0"), str(net.host("a-h0").ip)
    argv = [str(n), str(repeats), str(RECEIVER_PAUSE_S)]
    procs = [
        net.popen(
            h,
            [py, "-c", ONE_WAY_WORKER, ip0, str(PORT), str(r), *argv],
            env=net.process_env({"OMP_NUM_THREADS": "1"}),
            stdout=subprocess.PIPE,
            text=True,
        )
        for r, h in enumerate(("a-h0", "b-h0"))
    ]
    texts = [p.communicate(timeout=600)[0] for p in procs]
    out = {}
    for line in "\n".join(texts).splitlines():
        label, _, times = line.partition(" ")
        if label in ("one-way", "ring"):
            out[label] = statistics.median(float(x) for x in times.split())
    return out


def parse_paths(text: str) -> list[tuple[str, str, str]]:
    """``--paths``' RATE:ONE_WAY_MS:SHARE items, checked before any network is built. Raises
    ValueError naming the item and the fix."""
    out = []
    for item in text.split(","):
        parts = item.split(":")
        try:
            if len(parts) != 3:
                raise ValueError("three fields")
            rate_text, delay_ms, share = parts
            parse_rate_bps(rate_text)
            if not (float(delay_ms) > 0 and 0 < float(share) <= 1):
                raise ValueError("range")
        except (ValueError, SpecError):
            raise ValueError(
                f"--paths: {item!r} is not RATE:ONE_WAY_MS:SHARE (a rate such as 100mbit, a one-way delay in ms "
                f"above 0, a share in (0, 1]); e.g. 115.4mbit:2.6:0.2"
            ) from None
        out.append((rate_text, delay_ms, share))
    return out


def widen_send_buffers(net, hosts: list[str], cap: int, factor: float) -> None:
    """Let the hosts' send buffers grow to ``factor`` x ``cap`` bytes (``tcp_wmem``'s maximum, in
    the form the network sets it: ``netns.namespace_sysctls``; the receive buffers keep the cap,
    which sets the window): a socket whose send buffer, counted in the kernel's own buffer sizes,
    holds less than the receiver's window keeps less in flight."""
    wmem = namespace_sysctls(int(factor * cap))[0]["net.ipv4.tcp_wmem"]
    for h in hosts:
        set_sysctls(net.host(h).netns, {"net.ipv4.tcp_wmem": wmem})


def path_rings(
    paths: list[tuple[str, str, str]],
    repeats: int,
    congestion: str | None,
    send_buffer_factor: float = 1.0,
    no_offloads: bool = False,
) -> None:
    """``--paths``: per path, the bytes of a two-member ring sent one way and all-reduced, each
    measured beside a window per round trip; the send buffers ``send_buffer_factor`` x the cap;
    ``no_offloads``: the hosts' ``bench_connections.OFFLOADS`` off."""
    print(
        f"one pair across each path, median of {repeats}: the bytes sent one way, then all-reduced; "
        f"congestion control {congestion or 'the machine default'}; send buffers {send_buffer_factor:g} x the cap"
        + (f"; the hosts' {', '.join(OFFLOADS)} off" if no_offloads else "")
    )
    head = ("rate", 9), ("one-way", 8), ("share", 6), ("cap", 7), ("window", 7), ("MB", 6), ("sent s", 15)
    print(" ".join(f"{x:>{n}}" for x, n in head), f"{'window/RTT s':>13} {'ring s':>15} {'+ RTT s':>8}")
    for rate_text, delay_ms, share in paths:
        rtt_s = 2 * float(delay_ms) / 1e3
        cap = buffer_for_share(parse_rate_bps(rate_text), rtt_s, float(share))
        window = window_for_buffer(cap)
        one_bps = window_rate_bps(window, rtt_s)
        assert one_bps is not None  # a window and a delay
        nbytes = int(one_bps / 8 * PATH_RING_S) // 4 * 4  # R = 2: each member sends all of it
        topo = parse_topology(
            {
                "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
                "links": [{"between": ["a", "b"], "rate": rate_text, "delay": f"{delay_ms}ms"}],
                **({"tcp_congestion": congestion} if congestion else {}),
            },
            "<bench>",
        )
        with tempfile.TemporaryDirectory() as tmp, make_network(topo, out_dir=Path(tmp), tcp_buffer_bytes=cap) as net:
            if send_buffer_factor != 1.0:
                widen_send_buffers(net, ["a-h0", "b-h0"], cap, send_buffer_factor)
            if no_offloads:
                offloads_off(net, ["a-h0", "b-h0"])
            t = pair_medians(net, nbytes // 4, repeats)
        # a window a round trip: the receive's notice out, then the bytes' last window back
        ideal = nbytes * 8 / one_bps
        # the ring of two: the same bytes (each member sends half twice) and its two steps' one-way
        # delays, as ``allreduce.stage_allreduce_s`` counts them
        ring_ideal = ideal + rtt_s
        sent, ring = (
            f"{t[k]:.3f} ({(t[k] - x) / t[k] * 100:+.1f}%)" for k, x in (("one-way", ideal), ("ring", ring_ideal))
        )
        print(
            f"{rate_text:>9} {delay_ms + ' ms':>8} {share:>6} {cap:>7} {window:>7.0f} {nbytes / 1e6:>6.2f} "
            f"{sent:>15} {ideal:>13.3f} {ring:>15} {ring_ideal:>8.3f}",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", nargs="?", help="an experiment's name or file")
    ap.add_argument("--alone", action="store_true", help="one stage's ring at a time (default: all side by side)")
    ap.add_argument("--repeats", type=int, default=4, help="timed all-reduces per ring, after 3 of warm-up")
    ap.add_argument("--paths", help="RATE:ONE_WAY_MS:SHARE,...: one two-member ring per path instead")
    ap.add_argument("--congestion", help="--paths: the hosts' TCP congestion control (default: the machine's)")
    ap.add_argument(
        "--send-buffer-factor",
        type=float,
        default=1.0,
        help="--paths: the hosts' send buffers may grow to this many times the cap (default 1: as a run sets them)",
    )
    ap.add_argument("--offloads-off", action="store_true", help=f"--paths: the hosts' {', '.join(OFFLOADS)} off")
    args = ap.parse_args()
    if args.offloads_off:
        require_ethtool(ap)
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: give 1 or more")
    if not 1 <= args.send_buffer_factor < float("inf"):  # (also refuses nan)
        ap.error(f"--send-buffer-factor {args.send_buffer_factor:g}: give a finite number, 1 or more (1: the cap)")
    if (args.experiment is None) == (args.paths is None):
        ap.error("give either an experiment or --paths")
    if args.paths:
        if args.alone:
            ap.error("--alone is for an experiment's rings; --paths runs one pair per path")
        try:
            paths = parse_paths(args.paths)
            require_congestion(args.congestion)  # before any network is built
        except (ValueError, FeatureError) as e:
            ap.error(str(e))
        path_rings(paths, args.repeats, args.congestion, args.send_buffer_factor, args.offloads_off)
        return
    if args.congestion:
        ap.error("--congestion is for --paths: an experiment's rings run its topology's congestion control")
    if args.send_buffer_factor != 1.0:
        ap.error("--send-buffer-factor is for --paths: an experiment's rings keep a run's buffers")
    if args.offloads_off:
        ap.error("--offloads-off is for --paths: an experiment's rings keep a run's hosts")
    try:
        exp = load_experiment(args.experiment)
    except SpecError as e:
        ap.error(str(e))
    exp = replace(exp, policy=parse_policy("dp-wan"))
    topo = exp.topology_spec
    workers = place(exp, topo)
    cap = socket_buffer_cap(exp, topo, workers)
    model = stage_allreduce_s(exp, topo, workers)
    rings = {
        s: [w.host for w in sorted((w for w in workers if w.stage == s), key=lambda w: w.replica)]
        for s in range(exp.stages)
    }
    values = {s: stage_param_bytes(exp.model, exp.stages, s) // 4 for s in rings}
    print(
        f"{exp.name}: {exp.replicas} replicas, {exp.stages} stages; socket-buffer cap {cap} bytes; "
        f"{'one ring at a time' if args.alone else 'every ring side by side'}, median of {args.repeats}"
    )
    with tempfile.TemporaryDirectory() as tmp, make_network(topo, out_dir=Path(tmp), tcp_buffer_bytes=cap) as net:
        if args.alone:
            measured = {s: medians(net, {s: hosts}, values, args.repeats)[s] for s, hosts in rings.items()}
        else:
            measured = medians(net, rings, values, args.repeats)
    print(f"{'stage':>5} {'ring (DCs)':>24} {'MB':>7} {'measured s':>11} {'model s':>8} {'model error':>11}")
    for s in rings:
        dcs = "-".join(w.dc for w in sorted((w for w in workers if w.stage == s), key=lambda w: w.replica))
        t, m = measured[s], model[s]
        print(f"{s:>5} {dcs:>24} {values[s] * 4 / 1e6:>7.2f} {t:>11.3f} {m:>8.3f} {(t - m) / t * 100:>+10.1f}%")


if __name__ == "__main__":
    with tears_down_on_signals():
        main()
