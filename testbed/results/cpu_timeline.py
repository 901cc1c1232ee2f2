"""Which task each CPU ran when, from a scheduler trace's switches (``sched.parquet``): the CPU
time each role got over an interval, and how long some other CPU was free for a thread that
waited on a run queue (``results/sched_trace.late_start_causes``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pandas as pd

from testbed.trace import schema as T

#: the roles (``sched_trace.relative_role``) whose CPU a woken ``SCHED_OTHER`` thread would have
#: had at once: an idle CPU, or one running only the work the testbed runs in ``SCHED_IDLE``
#: (BubbleTea's decode steps, ``bubbletea/decode.DECODE_POLICY``, and prefill streams,
#: ``bubbletea/stream_process.SCHED_POLICY``), which a waking thread of another class preempts
#: at once (sched(7), "SCHED_IDLE"). Such time while a thread waited on another CPU's run queue
#: is time the kernel did not move it there: on a kernel without preemption, a queued thread
#: moves at the next load balancing, which a CPU's tick starts (4 ms apart at HZ=250).
FREE_ROLES = frozenset({"idle", "decode", "own stream", "other workers' streams"})

RoleOf = Callable[[str, int, int], str]


class CpuTimeline:
    """Which task each CPU ran when (``sw``: the trace's ``T.SCHED_SWITCH`` rows): per CPU, the
    switch times and the task switched to; ``n_cpus`` the machine's CPUs (one that never
    switched in the trace is ``unknown``)."""

    def __init__(self, sw: pd.DataFrame, n_cpus: int) -> None:
        self.t: dict[int, np.ndarray] = {}
        self.task: dict[int, pd.DataFrame] = {}
        for cpu, g in sw.sort_values(T.T_NS, kind="stable").groupby(T.CPU):
            self.t[int(cpu)] = g[T.T_NS].to_numpy()
            self.task[int(cpu)] = g[[T.NEXT_COMM, T.NEXT_PID, T.NEXT_TGID]].reset_index(drop=True)
        self.n_cpus = max(n_cpus, len(self.t))

    def _segments(self, cpu: int, a: int, b: int) -> Iterator[tuple[int, int, str, int, int]]:
        """(from, to (ns), comm, pid, tgid) of each task ``cpu`` ran within [a, b), from its first
        switch in the trace on."""
        t = self.t[cpu]
        i = max(0, int(np.searchsorted(t, a, side="right")) - 1)
        while i < len(t) and t[i] < b:
            lo, hi = max(a, int(t[i])), min(b, int(t[i + 1]) if i + 1 < len(t) else b)
            if hi > lo:
                comm, pid, tgid = self.task[cpu].iloc[i]
                yield lo, hi, comm, int(pid), int(tgid)
            i += 1

    def time_by_role(
        self, a: int, b: int, role_of_task: RoleOf, into: dict[str, float], cpu: int | None = None
    ) -> None:
        """Add to ``into`` each role's CPU time (ms) in [a, b) over all CPUs, or on ``cpu`` alone
        (``role_of_task(comm, pid, tgid)``); time before a CPU's first switch, or on a CPU that
        never switched, counts as ``unknown``."""
        unseen = (self.n_cpus - len(self.t)) if cpu is None else int(cpu not in self.t)
        if unseen:
            into["unknown"] = into.get("unknown", 0.0) + unseen * (b - a) / 1e6
        for c, t in self.t.items():
            if cpu is not None and c != cpu:
                continue
            if t[0] > a:
                into["unknown"] = into.get("unknown", 0.0) + (min(b, int(t[0])) - a) / 1e6
            for lo, hi, comm, pid, tgid in self._segments(c, a, b):
                role = role_of_task(comm, pid, tgid)
                into[role] = into.get(role, 0.0) + (hi - lo) / 1e6

    def free_ms(self, a: int, b: int, role_of_task: RoleOf, besides: int) -> float:
        """The time (ms) within [a, b) during which at least one CPU other than ``besides`` ran a
        task of a role in ``FREE_ROLES`` (``role_of_task(comm, pid, tgid)``): the union over
        those CPUs, not their sum. Time a CPU is not in the trace counts as not free."""
        spans = sorted(
            (lo, hi)
            for c in self.t
            if c != besides
            for lo, hi, comm, pid, tgid in self._segments(c, a, b)
            if role_of_task(comm, pid, tgid) in FREE_ROLES
        )
        total, end = 0, a
        for lo, hi in spans:
            if hi > end:
                total += hi - max(lo, end)
                end = hi
        return total / 1e6
