"""When a training operation's input arrived, as the kernel's scheduler trace (``sched.parquet``,
``testbed run --sched-trace``) tells it: gloo's waking of the worker's thread that waited for the
receive's last stripe, rather than the moment the thread, run again, saw it (``T.READY_NS``).
Read by ``sched_trace.late_start_causes``."""

from __future__ import annotations

import numpy as np
import pandas as pd

from testbed.trace import schema as T
from testbed.trace import task_names


def input_arrivals_ns(ops: pd.DataFrame, ev: pd.DataFrame, sched: pd.DataFrame, pids: dict[int, int]) -> np.ndarray:
    """When each of ``ops`` (training operations with ``T.READY_NS``) had its whole input, as the
    kernel saw it (ns, ``trace.clock``'s): the last waking of its worker's main thread (``pids``,
    by rank) by one of gloo's threads (a thread of the worker's process that is neither its main
    thread nor its filling thread, ``task_names.FILL``, which wakes it only to hand back the
    interpreter lock) after the thread began to wait for the receive's last stripe
    (``T.LAST_WAIT_NS`` of the ``T.RECV_WAIT`` event with the same ``T.READY_NS``: every earlier
    stripe was in by then) and by ``T.READY_NS``: the receive complete. Where there is none (the
    last stripe was in before the thread waited for it, so the input came at a time the trace
    does not tell), or the trace has no wakings (``T.SCHED_WAKING``, recorded since they are) or
    the wait event has no ``T.LAST_WAIT_NS``: ``T.READY_NS``, the worker's own figure. Never
    after it."""
    ready = ops[T.READY_NS].to_numpy(dtype=np.int64)
    out = ready.copy()
    if T.LAST_WAIT_NS not in ev:
        return out
    waits = ev[(ev[T.KIND] == T.RECV_WAIT) & ev[T.READY_NS].notna() & ev[T.LAST_WAIT_NS].notna()]
    last_wait = {(int(w), int(r)): int(s) for w, r, s in zip(waits[T.WORKER], waits[T.READY_NS], waits[T.LAST_WAIT_NS])}
    wakings = sched[sched[T.EVENT] == T.SCHED_WAKING]
    sw = sched[sched[T.EVENT] == T.SCHED_SWITCH]
    comm_of = dict(zip(sw[T.NEXT_PID], sw[T.NEXT_COMM]))  # a thread's latest name
    workers = ops[T.WORKER].to_numpy()
    for rank, pid in pids.items():
        by_gloo = wakings[
            (wakings[T.NEXT_PID] == pid)
            & (wakings[T.PREV_TGID] == pid)
            & (wakings[T.PREV_PID] != pid)
            & (wakings[T.PREV_PID].map(comm_of) != task_names.kernel_name(task_names.FILL.format(rank=rank)))
        ]
        t = by_gloo[T.T_NS].to_numpy(dtype=np.int64)
        for i in np.flatnonzero(workers == rank):
            since = last_wait.get((rank, int(ready[i])))
            j = int(np.searchsorted(t, ready[i], side="right")) - 1
            if since is not None and j >= 0 and t[j] >= since:
                out[i] = t[j]
    return out
