"""A run's scheduler trace as files and summary figures (``testbed run --sched-trace``): the
kernel's lines written to ``T.SCHED_FILE`` with how they were taken, and the late operations'
causes (``sched_trace.late_start_causes``) summed for the summary and ``late_starts.csv``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from testbed.results.sched_trace import RUNNABLE, RUNNING, SLEEPING, late_start_causes, parse_sched_lines
from testbed.trace import metrics as M
from testbed.trace import schema as T


def cause_totals(ops: pd.DataFrame, by_role: pd.DataFrame) -> dict:
    """The late operations' states and the CPU time by role while they were runnable, on all CPUs
    and on the CPU whose run queue they were on, summed over all of them (ms; roles largest
    first), as the summary's figures (``M.SCHED_*``; the latter None where ``by_role``'s
    ``queue_cpu_ms`` is NaN: a trace without the moves between CPUs, ``late_start_causes``)."""

    def by_size(column: str) -> dict[str, float]:
        ms = by_role.groupby("role")[column].sum().sort_values(ascending=False) if len(by_role) else pd.Series()
        return {str(r): round(float(v), 3) for r, v in ms.items()}

    queues = by_role.empty or bool(by_role["queue_cpu_ms"].notna().all())  # no late operation: {}
    return {
        M.SCHED_LATE_OPS: int(len(ops)),
        M.SCHED_LATE_RUNNING_MS: float(ops[RUNNING].sum()),
        M.SCHED_LATE_RUNNABLE_MS: float(ops[RUNNABLE].sum()),
        M.SCHED_LATE_SLEEPING_MS: float(ops[SLEEPING].sum()),
        M.SCHED_LATE_UNKNOWN_MS: float(ops["unknown"].sum()),
        M.SCHED_CPU_WHILE_RUNNABLE_MS: by_size("cpu_ms"),
        M.SCHED_QUEUE_CPU_WHILE_RUNNABLE_MS: by_size("queue_cpu_ms") if queues else None,
    }


#: beside ``T.SCHED_FILE``: how the trace was taken (``lost_events``: events the kernel's buffers
#: could not hold, each CPU's overrun and dropped events; ``cpus``: the machine's; ``run_pids``:
#: the run's processes when it began, ``run_tasks``' roots; ``events``: the kernel's events
#: recorded, ``T.SCHED_MIGRATE_EVENT`` among them: a trace from before it was has no ``events``)
SCHED_INFO_FILE = "sched.json"
#: one row per late operation, its states and the CPU time by role while it waited (a column
#: each, ``cpu_ms: ROLE`` on all CPUs, ``queue_cpu_ms: ROLE`` on the CPU whose run queue it was on)
LATE_STARTS_FILE = "late_starts.csv"


def write_sched_trace(
    run_dir: Path, lines: Iterable[str], lost_events: int, run_pids: Iterable[int], events: Iterable[str]
) -> None:
    """Write a run's scheduler trace (the kernel's lines) to ``T.SCHED_FILE``, and how it was
    taken to ``SCHED_INFO_FILE`` (``run_pids``: the run's processes when the trace began;
    ``events``: the kernel's events recorded, as tracefs names them: ``sched/sched_switch``...)."""
    parse_sched_lines(lines).to_parquet(run_dir / T.SCHED_FILE, index=False)
    info = {
        "lost_events": lost_events,
        "clock": "mono",
        "cpus": os.cpu_count(),
        "run_pids": sorted(set(run_pids)),
        "events": list(events),
    }
    (run_dir / SCHED_INFO_FILE).write_text(json.dumps(info) + "\n")


def sched_stats(run_dir: Path, ev: pd.DataFrame, warmup: int) -> dict:
    """The summary's figures of a run traced with ``--sched-trace`` (``cause_totals``, and
    ``M.SCHED_EVENTS_LOST``; nothing for a run traced without; ``M.SCHED_TRACE_ERROR``, naming
    the file and the fault, for a trace that cannot be read), writing ``LATE_STARTS_FILE``."""
    path = run_dir / T.SCHED_FILE
    if not path.exists() or ev.empty:
        return {}
    info_path = run_dir / SCHED_INFO_FILE
    try:
        sched = pd.read_parquet(path)
        missing = [c for c in T.SCHED_COLUMNS if c not in sched.columns]
        if missing:
            raise ValueError(f"no column {', '.join(missing)}")
        info = json.loads(info_path.read_text()) if info_path.exists() else {}
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        return {M.SCHED_TRACE_ERROR: f"{path} (or {info_path.name}) cannot be read: {e}"}
    lost = info.get("lost_events") or 0
    queues = T.SCHED_MIGRATE_EVENT in info.get("events", [])
    ops, by_role = late_start_causes(ev, sched, warmup, info.get("run_pids"), info.get("cpus") or 0, lost, queues)
    table = ops
    for column in ("cpu_ms", "queue_cpu_ms") if queues else ("cpu_ms",):
        if len(by_role):
            wide = by_role.pivot_table(index="op", columns="role", values=column, aggfunc="sum")
            table = table.join(wide.add_prefix(f"{column}: "))
    table.to_csv(run_dir / LATE_STARTS_FILE, index=False)
    return {**cause_totals(ops, by_role), M.SCHED_EVENTS_LOST: info.get("lost_events")}
