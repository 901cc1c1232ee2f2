"""Which task each CPU ran when, from a scheduler trace's switches (``sched.parquet``): the CPU
time each role got over an interval, and when some other CPU than a given one ran tasks of a
kind (``results/sched_trace.late_start_causes``: idle, or only ``SCHED_IDLE`` work, while a late
thread waited on a run queue)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pandas as pd

from testbed.trace import schema as T

#: a task's role, or whether it is of a kind, from its (comm, pid, tgid)
RoleOf = Callable[[str, int, int], str]
TaskTest = Callable[[str, int, int], bool]


class CpuTimeline:
    """Which task each CPU ran when (``sw``: the trace's ``T.SCHED_SWITCH`` rows): per CPU, the
    switch times and the task switched to; ``n_cpus`` the machine's CPUs (one that never
    switched in the trace is ``unknown``)."""

    def __init__(self, sw: pd.DataFrame, n_cpus: int) -> None:
        self.t: dict[int, np.ndarray] = {}
        self.task: dict[int, list[tuple[str, int, int]]] = {}
        for cpu, g in sw.sort_values(T.T_NS, kind="stable").groupby(T.CPU):
            self.t[int(cpu)] = g[T.T_NS].to_numpy()
            pids, tgids = g[T.NEXT_PID].astype(int).tolist(), g[T.NEXT_TGID].astype(int).tolist()
            self.task[int(cpu)] = list(zip(g[T.NEXT_COMM].tolist(), pids, tgids, strict=True))
        self.n_cpus = max(n_cpus, len(self.t))

    def _segments(self, cpu: int, a: int, b: int) -> Iterator[tuple[int, int, str, int, int]]:
        """(from, to (ns), comm, pid, tgid) of each task ``cpu`` ran within [a, b), from its first
        switch in the trace on."""
        t = self.t[cpu]
        i = max(0, int(np.searchsorted(t, a, side="right")) - 1)
        while i < len(t) and t[i] < b:
            lo, hi = max(a, int(t[i])), min(b, int(t[i + 1]) if i + 1 < len(t) else b)
            if hi > lo:
                comm, pid, tgid = self.task[cpu][i]
                yield lo, hi, comm, pid, tgid
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

    def spans_where(self, a: int, b: int, test: TaskTest, besides: int) -> list[tuple[int, int]]:
        """The spans (from, to: ns) within [a, b) during which at least one CPU other than
        ``besides`` ran a task for which ``test(comm, pid, tgid)`` holds: the union over those
        CPUs, sorted, not overlapping. Time a CPU is not in the trace does not count."""
        spans = sorted(
            (lo, hi)
            for c in self.t
            if c != besides
            for lo, hi, comm, pid, tgid in self._segments(c, a, b)
            if test(comm, pid, tgid)
        )
        merged: list[tuple[int, int]] = []
        for lo, hi in spans:
            if merged and lo <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
            else:
                merged.append((lo, hi))
        return merged
