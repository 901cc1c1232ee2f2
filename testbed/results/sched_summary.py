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
    """The late operations' states and the CPU time by role while they were runnable, summed over
    all of them (ms; roles largest first), as the summary's figures (``M.SCHED_*``)."""
    roles = by_role.groupby("role")["cpu_ms"].sum().sort_values(ascending=False) if len(by_role) else pd.Series()
    return {
        M.SCHED_LATE_OPS: int(len(ops)),
        M.SCHED_LATE_RUNNING_MS: float(ops[RUNNING].sum()),
        M.SCHED_LATE_RUNNABLE_MS: float(ops[RUNNABLE].sum()),
        M.SCHED_LATE_SLEEPING_MS: float(ops[SLEEPING].sum()),
        M.SCHED_LATE_UNKNOWN_MS: float(ops["unknown"].sum()),
        M.SCHED_CPU_WHILE_RUNNABLE_MS: {str(r): round(float(ms), 3) for r, ms in roles.items()},
    }


#: beside ``T.SCHED_FILE``: how the trace was taken (``lost_events``: events the kernel's buffers
#: could not hold, each CPU's overrun and dropped events; ``cpus``: the machine's; ``run_pids``:
#: the run's processes when it began, ``run_tasks``' roots)
SCHED_INFO_FILE = "sched.json"
#: one row per late operation, its states and the CPU time by role while it waited (a column each)
LATE_STARTS_FILE = "late_starts.csv"


def write_sched_trace(run_dir: Path, lines: Iterable[str], lost_events: int, run_pids: Iterable[int]) -> None:
    """Write a run's scheduler trace (the kernel's lines) to ``T.SCHED_FILE``, and how it was
    taken to ``SCHED_INFO_FILE`` (``run_pids``: the run's processes when the trace began)."""
    parse_sched_lines(lines).to_parquet(run_dir / T.SCHED_FILE, index=False)
    info = {"lost_events": lost_events, "clock": "mono", "cpus": os.cpu_count(), "run_pids": sorted(set(run_pids))}
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
    ops, by_role = late_start_causes(ev, sched, warmup, info.get("run_pids"), info.get("cpus") or 0, lost)
    wide = by_role.pivot_table(index="op", columns="role", values="cpu_ms", aggfunc="sum") if len(by_role) else None
    table = ops.join(wide.add_prefix("cpu_ms: ")) if wide is not None else ops
    table.to_csv(run_dir / LATE_STARTS_FILE, index=False)
    return {**cause_totals(ops, by_role), M.SCHED_EVENTS_LOST: info.get("lost_events")}
