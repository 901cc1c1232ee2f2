"""A run's scheduler trace as files and summary figures (``testbed run --sched-trace``): the
kernel's lines written to ``T.SCHED_FILE`` with how they were taken, and the late operations'
causes (``sched_trace.late_start_causes``) summed for the summary and ``late_starts.csv``, and
summed again over a comparison's runs (``sched_totals``, ``results/compare.py``)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.results.analysis import LATE_BOUND_TEXT, LATE_START_NS, LATE_START_TEXT
from testbed.results.sched_trace import (
    FREE_CPU,
    FREE_FROM,
    RUNNABLE,
    RUNNING,
    SLEEPING,
    late_start_causes,
    parse_sched_lines,
)
from testbed.trace import metrics as M
from testbed.trace import schema as T


def cause_totals(ops: pd.DataFrame, by_role: pd.DataFrame) -> dict:
    """The late operations' states and the CPU time by role while they were runnable, on all CPUs
    and on the CPU whose run queue they were on, summed over all of them (ms; roles largest
    first), and the time another CPU was free for them (``M.SCHED_LATE_FREE_CPU_MS``, and
    ``M.SCHED_LATE_OPS_FREE_CPU``: those for which one was, at some moment, before the bound
    ``LATE_START_NS``: ``sched_trace.FREE_FROM``; both over the operations whose thread the trace
    saw), as the summary's figures (``M.SCHED_*``; those on the queue's CPU None where
    ``by_role``'s ``queue_cpu_ms``, or every operation's ``FREE_CPU``, is NaN: a trace without
    the moves between CPUs, ``late_start_causes``)."""

    def by_size(column: str) -> dict[str, float]:
        ms = by_role.groupby("role")[column].sum().sort_values(ascending=False) if len(by_role) else pd.Series()
        return {str(r): round(float(v), 3) for r, v in ms.items()}

    queues = by_role.empty or bool(by_role["queue_cpu_ms"].notna().all())  # no late operation: {}
    told = ops.empty or bool(ops[FREE_CPU].notna().any())  # no late operation: 0
    return {
        M.SCHED_LATE_OPS: int(len(ops)),
        M.SCHED_LATE_UNSEEN_MS: float(ops["unseen_ms"].sum()),
        M.SCHED_LATE_RUNNING_MS: float(ops[RUNNING].sum()),
        M.SCHED_LATE_RUNNABLE_MS: float(ops[RUNNABLE].sum()),
        M.SCHED_LATE_SLEEPING_MS: float(ops[SLEEPING].sum()),
        M.SCHED_LATE_UNKNOWN_MS: float(ops["unknown"].sum()),
        M.SCHED_CPU_WHILE_RUNNABLE_MS: by_size("cpu_ms"),
        M.SCHED_QUEUE_CPU_WHILE_RUNNABLE_MS: by_size("queue_cpu_ms") if queues else None,
        M.SCHED_LATE_FREE_CPU_MS: float(ops[FREE_CPU].sum()) if told else None,
        M.SCHED_LATE_OPS_FREE_CPU: int((ops[FREE_FROM] < LATE_START_NS / 1e6).sum()) if told else None,
    }


#: beside ``T.SCHED_FILE``: how the trace was taken (``lost_events``: events the kernel's buffers
#: could not hold, each CPU's overrun and dropped events; ``cpus``: the machine's; ``run_pids``:
#: the run's processes when it began, ``run_tasks``' roots; ``events``: the kernel's events
#: recorded, ``T.SCHED_MIGRATE_EVENT`` among them: a trace from before it was has no ``events``)
SCHED_INFO_FILE = "sched.json"
#: one row per late operation, its states, when another CPU was free for it (``free_cpu_ms``,
#: ``free_from_ms``: ``sched_trace.late_start_causes``) and the CPU time by role while it waited
#: (a column each, ``cpu_ms: ROLE`` on all CPUs, ``queue_cpu_ms: ROLE`` on the CPU whose run
#: queue it was on)
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


def _summed_by_role(summaries: list[dict[str, Any]], figure: str) -> dict[str, float] | None:
    """A figure of ms by role summed over ``summaries``, largest first; None if one lacks it."""
    if any(s.get(figure) is None for s in summaries):
        return None
    ms: dict[str, float] = {}
    for s in summaries:
        for role, v in s[figure].items():
            ms[role] = ms.get(role, 0.0) + v
    return dict(sorted(ms.items(), key=lambda x: -x[1]))


def _summed(summaries: list[dict[str, Any]], figure: str) -> Any:
    """A figure summed over ``summaries``; None if one lacks it (a summary from before it was)."""
    values = [s.get(figure) for s in summaries]
    return None if any(v is None for v in values) else sum(values)


def sched_totals(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per policy of a comparison (``runs``: its runs' summaries) traced with ``--sched-trace``, its late
    operations' figures summed over its traced runs: ``runs``, ``M.SCHED_LATE_OPS``,
    ``M.SCHED_EVENTS_LOST``, the ms their threads were on a CPU, waiting for one, asleep and not
    in the trace (``M.SCHED_LATE_*_MS``), ``M.SCHED_CPU_WHILE_RUNNABLE_MS``: the ms the CPUs gave
    each role while they waited, and ``M.SCHED_QUEUE_CPU_WHILE_RUNNABLE_MS``: of that, the CPU
    whose run queue each waited on (None unless every run's trace tells it), largest first;
    ``M.SCHED_LATE_FREE_CPU_MS`` and ``M.SCHED_LATE_OPS_FREE_CPU`` (``cause_totals``; None unless
    every run's summary has them). A policy with no traced run is left out."""
    totals = {}
    for policy, summaries in runs.items():
        traced = [s for s in summaries if s.get(M.SCHED_LATE_OPS) is not None]
        if not traced:
            continue
        states = (
            M.SCHED_LATE_RUNNING_MS,
            M.SCHED_LATE_RUNNABLE_MS,
            M.SCHED_LATE_SLEEPING_MS,
            M.SCHED_LATE_UNKNOWN_MS,
        )
        totals[policy] = {
            "runs": len(traced),
            M.SCHED_LATE_OPS: sum(s[M.SCHED_LATE_OPS] for s in traced),
            M.SCHED_EVENTS_LOST: sum(s.get(M.SCHED_EVENTS_LOST) or 0 for s in traced),
            **{k: sum(s.get(k) or 0.0 for s in traced) for k in states},
            # None where a run's summary predates the figure
            M.SCHED_LATE_UNSEEN_MS: (
                None
                if any(s.get(M.SCHED_LATE_UNSEEN_MS) is None for s in traced)
                else sum(s[M.SCHED_LATE_UNSEEN_MS] for s in traced)
            ),
            M.SCHED_CPU_WHILE_RUNNABLE_MS: _summed_by_role(traced, M.SCHED_CPU_WHILE_RUNNABLE_MS),
            M.SCHED_QUEUE_CPU_WHILE_RUNNABLE_MS: _summed_by_role(traced, M.SCHED_QUEUE_CPU_WHILE_RUNNABLE_MS),
            **{k: _summed(traced, k) for k in (M.SCHED_LATE_FREE_CPU_MS, M.SCHED_LATE_OPS_FREE_CPU)},
        }
    return totals


def sched_lines(totals: dict[str, dict[str, Any]]) -> list[str]:
    """``sched_totals`` as text: per traced policy, its late operations (counted from the
    kernel's waking, ``input_arrival.input_arrivals_ns``) and how much of their lateness came before
    their workers saw the input (where the runs' summaries tell it), their threads on a CPU,
    waiting for one and asleep, what the CPUs ran while they waited and what the CPU whose run
    queue each waited on ran, largest share first."""
    lines = []
    for policy, t in totals.items():
        unknown = t.get(M.SCHED_LATE_UNKNOWN_MS) or 0.0
        unseen = t.get(M.SCHED_LATE_UNSEEN_MS)
        lines.append(
            f"scheduler trace of {policy} ({t['runs']} runs, {t[M.SCHED_EVENTS_LOST]} events lost): "
            f"{t[M.SCHED_LATE_OPS]} operations started {LATE_START_TEXT} after their input arrived (gloo's waking of "
            "their thread where the trace tells it)"
            + (f", {unseen:.1f} ms of it before the thread saw it; " if unseen is not None else "; ")
            + f"their threads waited {t[M.SCHED_LATE_RUNNABLE_MS]:.1f} ms "
            f"for a CPU, ran {t[M.SCHED_LATE_RUNNING_MS]:.1f} ms, slept {t[M.SCHED_LATE_SLEEPING_MS]:.1f} ms"
            + (f", {unknown:.1f} ms not in the trace" if unknown > 0.0005 else "")
        )
        free, free_ops = t.get(M.SCHED_LATE_FREE_CPU_MS), t.get(M.SCHED_LATE_OPS_FREE_CPU)
        if free is not None and free_ops is not None and t[M.SCHED_LATE_OPS]:
            lines.append(
                f"  another CPU was free (idle, or running only SCHED_IDLE work) {free:.1f} ms of their wait; "
                f"{free_ops} of the {t[M.SCHED_LATE_OPS]} had one before {LATE_BOUND_TEXT} from their input"
            )
        for figure, what in (
            (M.SCHED_CPU_WHILE_RUNNABLE_MS, "the CPUs ran meanwhile"),
            (M.SCHED_QUEUE_CPU_WHILE_RUNNABLE_MS, "the CPU whose run queue each waited on ran"),
        ):
            cpu = t.get(figure) or {}
            total = sum(cpu.values())
            if total > 0:
                shares = ", ".join(f"{role} {ms / total:.0%}" for role, ms in cpu.items())
                lines.append(f"  {what} ({total:.1f} ms): {shares}")
    return lines
