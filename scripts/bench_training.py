#!/usr/bin/env python3
"""Benchmark of the training harness (figures printed, nothing asserted).

- the harness's own overhead on a training step: the cost of writing the trace events of one
  step, and the padding's overshoot (sleep wake-up beyond the target), as shares of the step's
  padded compute time (target: under 2%);
- the default run's wall time (target: under 3 minutes on the 2-core VM);
- a worker's hand-off between two operations, the figure the simulator takes
  (``plan/handoff.ACTION_HANDOFF_S``): in a run of the default experiment's pipelines inside one
  emulated DC (no WAN, no controller; as many workers as the default experiment has; GPipe, 8
  microbatches), the time from the end of one of stage 0's forwards to the start of the next
  forward right after it (nothing to wait for in between: its inputs are its own data), the
  median over the measured iterations;
- with ``--stripes 1,4,16``, what each further connection a transfer is striped over adds to that
  hand-off, the figure the simulator takes (``plan/handoff.STRIPE_SEND_S``): the same workers in
  two emulated DCs (stage 0 in one, the others in the other, joined by a 1 Gbit/s link of 1 ms
  one way, so that no transfer waits for the link), under pp-fair with striping (no controller),
  each number of connections in turn; per number, the median hand-off between stage 0's
  forwards, whose activations cross the WAN, and the median of its send event (the isends of the
  stripes, posted one after another: ``train/striping.send_striped``); the slope is a
  least-squares line through the medians.

Run as root: .venv/bin/python scripts/bench_training.py [--skip-run] [--stripes 1,2,4,8,16]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd

from testbed.plan.handoff import ACTION_HANDOFF_S, STRIPE_SEND_S
from testbed.run.interrupts import tears_down_on_signals
from testbed.spec.experiment_fields import MAX_WAN_CONNECTIONS
from testbed.spec.experiment_file import load_experiment
from testbed.spec.topology_file import parse_topology
from testbed.trace import schema as T
from testbed.trace.clock import now_ns
from testbed.trace.events import EventWriter, read_events
from testbed.train.worker import Padder


def tracing_cost_ns(n: int = 5000) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        w = EventWriter(Path(tmp) / "w.jsonl", worker=0, host="h", dc="d", stage=0, replica=0)
        t0 = time.perf_counter_ns()
        for i in range(n):
            w.write(T.FORWARD, i, i + 1, iteration=0, microbatch=i, real_ns=1, padded_ns=1)
        dt = time.perf_counter_ns() - t0
        w.close()
    return dt / n


def padding_overshoot_ns(target_ms: float, n: int = 200) -> list[float]:
    p = Padder({T.FORWARD: target_ms}, enabled=True)
    out = []
    for _ in range(n):
        t0 = now_ns()
        p.finish(T.FORWARD, t0)
        out.append(now_ns() - t0 - target_ms * 1e6)
    return out


def stage0_handoffs_s(ev: pd.DataFrame, warmup: int) -> list[float]:
    """From the end of one of stage 0's forwards to the start of a forward right after it (s), per
    replica and measured iteration: the worker's own time between two operations, where the second
    waits for no transfer."""
    ops = ev[ev[T.KIND].isin((T.FORWARD, T.BACKWARD)) & (ev[T.STAGE] == 0) & (ev[T.ITERATION] >= warmup)]
    out: list[float] = []
    for _, g in ops.sort_values(T.START_NS).groupby([T.REPLICA, T.ITERATION]):
        kinds, starts, ends = g[T.KIND].to_numpy(), g[T.START_NS].to_numpy(), g[T.END_NS].to_numpy()
        out += [
            float(starts[i + 1] - ends[i]) / 1e9
            for i in range(len(g) - 1)
            if kinds[i] == T.FORWARD and kinds[i + 1] == T.FORWARD  # one forward right after another
        ]
    return out


def handoff_run() -> tuple[list[float], str]:
    """The default experiment's workers in one emulated DC (every stage and replica; pp-fair, so no
    controller and no WAN): stage 0's hand-offs (``stage0_handoffs_s``) and what was run."""
    from testbed.run.runner import run_experiment

    exp = load_experiment()
    hosts = exp.stages * exp.replicas
    topo = parse_topology({"dcs": [{"name": "dc0", "hosts": hosts}], "links": []}, "<one DC>")
    # GPipe: stage 0's forwards back to back, M - 1 hand-offs an iteration
    exp = exp.with_overrides(
        topology_spec=topo, policy="pp-fair", schedule="gpipe", microbatches=8, iterations=4, warmup_iterations=1
    )
    with tempfile.TemporaryDirectory() as tmp:
        run_experiment(exp, Path(tmp), progress=lambda line: None)
        gaps = stage0_handoffs_s(read_events(Path(tmp)), exp.warmup_iterations)
    what = (
        f"{exp.stages} stages x {exp.replicas} replicas in one DC, {exp.microbatches} microbatches, "
        f"{exp.iterations - exp.warmup_iterations} measured iterations"
    )
    return gaps, what


def stage0_send_s(ev: pd.DataFrame, warmup: int) -> list[float]:
    """Each of stage 0's send events over the measured iterations (s): from the worker's ready
    notice to its last stripe's isend posted."""
    sends = ev[(ev[T.KIND] == T.SEND) & (ev[T.STAGE] == 0) & (ev[T.ITERATION] >= warmup)]
    return ((sends[T.END_NS] - sends[T.START_NS]) / 1e9).tolist()


def striped_handoff_run(stripes: int) -> tuple[list[float], list[float]]:
    """The default experiment's workers in two emulated DCs, stage 0 in the first, joined by a link
    no transfer waits for, under pp-fair with every cross-DC transfer striped over ``stripes``
    connections (GPipe, 8 microbatches): stage 0's hand-offs (``stage0_handoffs_s``) and its send
    events (``stage0_send_s``)."""
    from testbed.run.runner import run_experiment

    exp = load_experiment()
    first, rest = exp.replicas, (exp.stages - 1) * exp.replicas
    topo = parse_topology(
        {
            "dcs": [{"name": "dc0", "hosts": first}, {"name": "dc1", "hosts": rest}],
            "links": [{"between": ["dc0", "dc1"], "rate": "1gbit", "delay": "1ms"}],
        },
        "<two DCs>",
    )
    exp = exp.with_overrides(
        topology_spec=topo,
        policy="pp-fair/striping=on",
        wan_connections=stripes,
        schedule="gpipe",
        microbatches=8,
        iterations=4,
        warmup_iterations=1,
    )
    with tempfile.TemporaryDirectory() as tmp:
        run_experiment(exp, Path(tmp), progress=lambda line: None)
        ev = read_events(Path(tmp))
    return stage0_handoffs_s(ev, exp.warmup_iterations), stage0_send_s(ev, exp.warmup_iterations)


def stripe_slope(counts: list[int]) -> None:
    """Print each number of connections' median hand-off and send event, and the least-squares
    slope of the hand-off's medians per connection beside the simulator's figure."""
    medians = []
    for k in counts:
        gaps, sends = striped_handoff_run(k)
        medians.append(statistics.median(gaps))
        print(
            f"  {k:>3} connections: hand-off median {medians[-1] * 1e3:.3f} ms over {len(gaps)}, "
            f"send event median {statistics.median(sends) * 1e3:.3f} ms over {len(sends)}",
            flush=True,
        )
    if len(set(counts)) > 1:
        slope = statistics.linear_regression(counts, medians).slope
        print(
            f"each further connection: {slope * 1e3:.3f} ms of hand-off; the simulator takes "
            f"{STRIPE_SEND_S * 1e3:.3f} ms (plan/handoff.py)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-run", action="store_true", help="only the in-process overhead figures")
    ap.add_argument(
        "--stripes",
        help="numbers of connections (e.g. 1,4,16): the hand-off of a transfer striped over each, "
        "in place of the default run",
    )
    args = ap.parse_args()
    if args.stripes is not None:
        try:
            counts = [int(x) for x in args.stripes.split(",")]
        except ValueError:
            ap.error(f"--stripes {args.stripes!r}: give numbers of connections, e.g. 1,4,16")
        if not counts or min(counts) < 1 or max(counts) > MAX_WAN_CONNECTIONS:
            ap.error(f"--stripes {args.stripes!r}: each from 1 to {MAX_WAN_CONNECTIONS}")
        print("hand-off of a transfer striped across the WAN (two DCs, pp-fair with striping, GPipe):")
        stripe_slope(counts)
        return
    exp = load_experiment()
    c = exp.compute
    step_ns = exp.microbatches * (c.forward_ms + c.backward_ms) * 1e6  # padded compute of one stage's step
    events_per_step = exp.microbatches * 4 + 2  # F, B, send, recv per microbatch; all-reduce, optimizer
    trace_ns = tracing_cost_ns() * events_per_step
    over = padding_overshoot_ns(c.forward_ms)
    pad_ns = statistics.mean(over) * exp.microbatches * 2
    print(
        f"default experiment: {exp.microbatches} microbatches, targets {c.forward_ms:g}/{c.backward_ms:g} ms "
        f"-> {step_ns / 1e6:.0f} ms of padded compute per stage per step"
    )
    print(f"  tracing: {trace_ns / 1e3:.1f} us per step ({events_per_step} events) = {100 * trace_ns / step_ns:.3f}%")
    print(
        f"  padding overshoot: mean {statistics.mean(over) / 1e3:.1f} us, p99 "
        f"{statistics.quantiles(over, n=100)[98] / 1e3:.1f} us per op = {100 * pad_ns / step_ns:.3f}% per step"
    )
    print(f"  harness overhead: {100 * (trace_ns + pad_ns) / step_ns:.3f}% of a step (target < 2%)")
    if args.skip_run:
        return
    gaps, what = handoff_run()
    print(
        f"hand-off between two operations ({what}): median {statistics.median(gaps) * 1e3:.3f} ms, "
        f"quartiles {statistics.quantiles(gaps, n=4)[0] * 1e3:.3f}-{statistics.quantiles(gaps, n=4)[2] * 1e3:.3f} ms "
        f"over {len(gaps)}; the simulator takes {ACTION_HANDOFF_S * 1e3:.3f} ms (plan/handoff.py)"
    )
    from testbed.run.runner import run_experiment

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        s = run_experiment(exp, Path(tmp), progress=lambda line: None)
        wall = time.monotonic() - t0
    print(
        f"default run: {wall:.1f} s wall for {exp.iterations} iterations (target < 180 s); "
        f"iteration {s['iteration_time_s']:.3f} s, wan_compute_ratio {s['wan_compute_ratio']:.2f}, "
        f"bubble fraction {s['bubble_fraction']:.2f}"
    )


if __name__ == "__main__":
    with tears_down_on_signals():  # SIGTERM, SIGHUP and Ctrl-C tear the network down
        main()
