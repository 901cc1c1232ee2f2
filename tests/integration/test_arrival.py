"""gloo's point-to-point works and ``train.arrival.Arrival`` on real process groups (loopback, two
processes): a receive whose bytes are in reports ``is_completed()`` False until ``wait()`` (why
BubbleTea's workers need ``Arrival``), and ``Arrival`` sees the bytes arrive while the receiving
thread does other work, and waits on an all-reduce with an
``Event``'s timeout."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SEND_AFTER_S = 0.3


def _pair(rank: int, port: int, out) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from testbed.train.arrival import Arrival

    try:
        if rank == 0:  # the first 0.3 s in, the second 1.5 s in (0.6 s after the receiver's Arrival)
            for tag, after_s in ((1, SEND_AFTER_S), (2, 4 * SEND_AFTER_S)):
                time.sleep(after_s)
                dist.isend(torch.full((16384,), float(tag)), dst=1, tag=tag).wait()
        else:
            # gloo's own flag: never True before wait(), though the bytes are in the buffer
            buf = torch.zeros(16384)
            w = dist.irecv(buf, src=0, tag=1)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 3 * SEND_AFTER_S:
                time.sleep(0.005)
            out.put(("plain", w.is_completed(), float(buf.sum())))
            w.wait()
            # Arrival: seen while this thread keeps busy, within a few ms of the bytes
            buf2 = torch.zeros(16384)
            arrival = Arrival([dist.irecv(buf2, src=0, tag=2)])
            t0 = time.monotonic()
            while not arrival.is_set() and time.monotonic() - t0 < 5:
                sum(range(1000))  # other work, no wait() on the receive
            out.put(("arrival", arrival.is_set(), float(buf2.sum()), time.monotonic() - t0))
            arrival.arrived_ns()
        _allreduce_through_arrival(rank, out)
    finally:
        dist.destroy_process_group()


def _allreduce_through_arrival(rank: int, out) -> None:
    """Both ranks: an asynchronous all-reduce waited on by an ``Arrival`` (as BubbleTea's workers
    fill the all-reduce; a prefill pass waits on it as its bubble's end). Rank 1 comes late, so
    rank 0's first wait, with a timeout, returns False."""
    from testbed.train.arrival import Arrival

    if rank == 1:
        time.sleep(SEND_AFTER_S)
    t = torch.full((1024,), float(rank + 1))
    reduced = Arrival([dist.all_reduce(t, async_op=True)])
    early = reduced.wait(0.01) if rank == 0 else None
    reduced.arrived_ns()
    out.put((f"allreduce{rank}", early, reduced.wait(0), float(t[0])))


def test_gloo_receives_are_seen_only_through_a_waiting_thread():
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    ps = [ctx.Process(target=_pair, args=(r, 29800 + os.getpid() % 100, out)) for r in range(2)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(timeout=60)
    assert [p.exitcode for p in ps] == [0, 0]
    got = {x[0]: x[1:] for x in (out.get(timeout=5) for _ in range(4))}
    completed, total = got["plain"]
    assert total == 16384.0 and completed is False  # the bytes are in, gloo does not say so
    seen, total2, after_s = got["arrival"]
    assert seen and total2 == 2 * 16384.0
    # not before the bytes were sent (about 0.6 s after the Arrival began), and as they came
    assert SEND_AFTER_S < after_s < 4 * SEND_AFTER_S, after_s
    # the all-reduce through an Arrival: not done before the late peer came, done after, summed
    assert got["allreduce0"] == (False, True, 3.0) and got["allreduce1"] == (None, True, 3.0)
