#!/usr/bin/env python3
"""Benchmark of releasing a received gloo tensor's work by a thread that waited for it in the
real-time class (``testbed/thread_slice.py``): two gloo processes over loopback, both held to
one CPU, as two emulated GPUs' threads share a CPU in a run; the receiver waits in ``SCHED_FIFO``
(``WaitSwitch.short``), then releases the receive's work either the way a worker does, back in
the fair class first (``train/input_wait.InputWait``; goal: at most 1 ms from the wait's return
to the work released), or still in the real-time class (the anchor: gloo's buffer waits for gloo's
thread with ``sched_yield``, which a real-time thread's never lets run on its CPU, until the
kernel's real-time throttling does: ``/proc/sys/kernel/sched_rt_runtime_us`` of each
``sched_rt_period_us``; with throttling off, -1, the anchor would spin for good and is left
out). Figures printed, nothing asserted.

Run as root: .venv/bin/python scripts/bench_wait_class.py [--receives 20]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GOAL_MS = 1.0
#: the tensor each receive carries (floats): an activation of the default experiment's size class
ELEMENTS = 1 << 18


def rank_main(rank: int, port: int, receives: int, order: str) -> None:
    """One of the two gloo processes; rank 1 prints one line per receive: ms from its wait's
    return to its work released."""
    import torch
    import torch.distributed as dist

    from testbed.thread_slice import WaitSwitch
    from testbed.train.input_wait import InputWait

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # both processes on one CPU
    switch = WaitSwitch() if rank == 1 else None  # before gloo's threads, as a worker's
    if switch is not None and switch.granted_rt_priority is None:
        raise SystemExit("the kernel refused SCHED_FIFO: run as root (or with an RLIMIT_RTPRIO)")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    if switch is not None:
        switch.default()
    buf = torch.zeros(ELEMENTS)
    inputs = InputWait(switch) if switch is not None else None
    for _ in range(receives):
        dist.barrier()
        if switch is None or inputs is None:
            time.sleep(0.005)  # the receiver is waiting by then
            dist.send(buf, 1)
            continue
        work = dist.irecv(buf, 0)
        if order == "fair-first":
            inputs.begin([work])  # held until the thread is back in the fair class
        else:
            switch.short()
        work.wait()
        returned = time.monotonic_ns()
        del work  # the anchor's last reference: released here, still real-time
        if order == "fair-first":
            inputs.started()  # back in the fair class, then the work released
        else:
            switch.default()
        print(f"{(time.monotonic_ns() - returned) / 1e6:.3f}", flush=True)
    dist.destroy_process_group()


def measure(receives: int, order: str) -> list[float]:
    """Start both ranks (this script, ``--rank``) and return rank 1's figures (ms)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, __file__, "--receives", str(receives), "--order", order, "--port", str(port), "--rank"]
    sender = subprocess.Popen([*argv, "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        receiver = subprocess.run([*argv, "1"], capture_output=True, text=True, timeout=60 + 2 * receives)
    finally:
        try:
            sender.wait(timeout=30)
        except subprocess.TimeoutExpired:  # the receiver failed: the sender waits at a barrier
            sender.kill()
            sender.wait()
    if receiver.returncode != 0:
        raise SystemExit(f"the receiving rank failed:\n{receiver.stderr[-2000:]}")
    return [float(line) for line in receiver.stdout.split()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--receives", type=int, default=20, help="receives per order (default 20)")
    ap.add_argument("--order", choices=("fair-first", "real-time"), help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.port, args.receives, args.order)
        return
    runtime = int(Path("/proc/sys/kernel/sched_rt_runtime_us").read_text())
    period = int(Path("/proc/sys/kernel/sched_rt_period_us").read_text())
    orders = [("fair-first", "back in the fair class, then released (the worker's order)")]
    if runtime < 0:
        print("real-time throttling is off here (sched_rt_runtime_us -1): the anchor is left out")
    else:
        print(f"real-time throttling here: {runtime / 1e3:g} ms of each {period / 1e3:g} ms")
        orders.append(("real-time", "released in the real-time class (anchor)"))
    for order, what in orders:
        ms = measure(args.receives, order)
        over = sum(m > GOAL_MS for m in ms)
        print(
            f"{what}: wait's return to the work released: median {statistics.median(ms):.3f} ms, "
            f"max {max(ms):.1f} ms, over {GOAL_MS:g} ms {over} of {len(ms)}"
            + (f" (goal: none over {GOAL_MS:g} ms)" if order == "fair-first" else "")
        )


if __name__ == "__main__":
    main()
